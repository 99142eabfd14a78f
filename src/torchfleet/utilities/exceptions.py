"""Lightning's ``utilities.exceptions``: ``MisconfigurationException`` is torchfleet's ConfigurationError.

Ported code that raises it raises a ConfigurationError; ``except MisconfigurationException`` (and
``pytest.raises``) catches every argument error torchfleet raises.
"""

from __future__ import annotations

from torchfleet.errors import ConfigurationError

MisconfigurationException = ConfigurationError


class SIGTERMException(SystemExit):
    """A run stopped by a signal; torchfleet's ``Preempted`` (SIGTERM, SIGUSR1 or SIGINT during fit, after saving
    ``preempted.ckpt``; exit code 75) is one, so ``except SIGTERMException`` catches it as in Lightning."""


__all__ = ["MisconfigurationException", "SIGTERMException"]
