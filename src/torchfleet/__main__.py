"""``python -m torchfleet`` runs the torchfleet command."""

from __future__ import annotations

import sys

from torchfleet.cli import main

sys.exit(main())
