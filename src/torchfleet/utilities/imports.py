"""Lightning's ``utilities.imports`` flags: whether optional packages are installed, found without importing them.

``_TORCHVISION_AVAILABLE`` and the other ``_X_AVAILABLE`` names are plain bools (Lightning's are truthy
``RequirementCache`` objects: ``if _TORCHVISION_AVAILABLE:`` reads the same). ``_X_GREATER_EQUAL_...`` compare the
installed distribution's version, also without importing it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys


def package_available(name: str) -> bool:
    """Whether the top-level package ``name`` can be imported (found on the path; nothing is imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken parent package, or a module without a spec
        return False


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "2.13.0+cpu" -> (2, 13, 0), "1.0.0rc1" -> (1, 0, 0)."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.group() != part:  # "0rc1": the release ends here
            break
    return tuple(numbers)


def version_at_least(distribution: str, minimum: str, below: str | None = None) -> bool:
    """Whether ``distribution`` is installed at ``minimum`` or later (and before ``below``, when given)."""
    try:
        have = _release(importlib.metadata.version(distribution))
    except importlib.metadata.PackageNotFoundError:
        return False
    return have >= _release(minimum) and (below is None or have < _release(below))


_PYTHON_GREATER_EQUAL_3_11_0 = sys.version_info >= (3, 11)
_TORCH_GREATER_EQUAL_2_6 = version_at_least("torch", "2.6.0")
_TORCH_GREATER_EQUAL_2_8 = version_at_least("torch", "2.8.0")
_TORCH_EQUAL_2_8 = version_at_least("torch", "2.8.0", below="2.9.0")
_TORCH_EQUAL_2_9 = version_at_least("torch", "2.9.0", below="2.10.0")
_TORCHMETRICS_GREATER_EQUAL_0_8_0 = version_at_least("torchmetrics", "0.8.0")
_TORCHMETRICS_GREATER_EQUAL_0_9_1 = version_at_least("torchmetrics", "0.9.1")
_TORCHMETRICS_GREATER_EQUAL_0_11 = version_at_least("torchmetrics", "0.11.0")
_TORCHMETRICS_GREATER_EQUAL_1_0_0 = version_at_least("torchmetrics", "1.0.0")

_TORCHVISION_AVAILABLE = package_available("torchvision")
_OMEGACONF_AVAILABLE = package_available("omegaconf")
_RICH_AVAILABLE = version_at_least("rich", "10.2.2")
_TENSORBOARD_AVAILABLE = package_available("tensorboard")
_TENSORBOARDX_AVAILABLE = package_available("tensorboardX")
_TORCHMETRICS_AVAILABLE = package_available("torchmetrics")
_HYDRA_AVAILABLE = package_available("hydra")  # the hydra-core distribution
_JSONARGPARSE_AVAILABLE = package_available("jsonargparse")
_DEEPSPEED_AVAILABLE = package_available("deepspeed")
_NUMPY_AVAILABLE = package_available("numpy")
_MATPLOTLIB_AVAILABLE = package_available("matplotlib")
_SKLEARN_AVAILABLE = package_available("sklearn")
_ONNX_AVAILABLE = package_available("onnx")
_REQUESTS_AVAILABLE = package_available("requests")
_PSUTIL_AVAILABLE = package_available("psutil")
