"""Lightning's ``utilities.exceptions.MisconfigurationException``: here torchfleet's ConfigurationError.

Ported code that raises it raises a ConfigurationError; ``except MisconfigurationException`` (and
``pytest.raises``) catches every argument error torchfleet raises.
"""

from __future__ import annotations

from torchfleet.errors import ConfigurationError

MisconfigurationException = ConfigurationError

__all__ = ["MisconfigurationException"]
