"""``python -m torchfleet`` runs the torchfleet command."""

import sys

from torchfleet.cli import main

sys.exit(main())
