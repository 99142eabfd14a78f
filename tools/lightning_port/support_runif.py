"""``RunIf`` for the ported Lightning tests (our own; written by tools/port_lightning_tests.py as helpers/runif.py).

``@RunIf(min_cuda_gpus=2, standalone=True, ...)`` skips a test whose needs this machine does not meet, with the
same keyword names as Lightning's helper. A keyword this helper does not know skips the test and says so, rather
than running a test under conditions it was not written for.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import pytest
import torch

_PACKAGES = {"deepspeed": "deepspeed", "rich": "rich", "omegaconf": "omegaconf", "psutil": "psutil",
             "sklearn": "sklearn", "onnx": "onnx", "tensorboard": "tensorboard", "wandb": "wandb",
             "bitsandbytes": "bitsandbytes", "torchvision": "torchvision", "mlflow": "mlflow"}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit())


def _reasons(kwargs: dict[str, Any]) -> list[str]:
    reasons = []
    for key, value in kwargs.items():
        if key == "min_cuda_gpus":
            if torch.cuda.device_count() < value:
                reasons.append(f"{value} CUDA GPU(s)")
        elif key in ("min_torch", "max_torch"):
            have, bound = _version(torch.__version__), _version(value)
            if (key == "min_torch" and have < bound) or (key == "max_torch" and have >= bound):
                reasons.append(f"torch {'>=' if key == 'min_torch' else '<'} {value}")
        elif key == "min_python":
            if sys.version_info < _version(value):
                reasons.append(f"python >= {value}")
        elif key == "mps":
            available = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
            if value is not None and available != value:
                reasons.append("MPS" if value else "no MPS")
        elif key in ("tpu", "bf16_cuda", "standalone"):
            if value and not (key == "standalone" and os.environ.get("PL_RUN_STANDALONE_TESTS") == "1"):
                reasons.append({"tpu": "TPU", "bf16_cuda": "CUDA with bf16", "standalone": "standalone mode"}[key])
        elif key == "dynamo":
            if value and not sys.platform.startswith("linux"):
                reasons.append("torch.compile (taken as Linux only)")
        elif key in ("skip_windows", "linux_only"):
            if value and key == "skip_windows" and sys.platform == "win32":
                reasons.append("not Windows")
            if value and key == "linux_only" and not sys.platform.startswith("linux"):
                reasons.append("Linux")
        elif key in _PACKAGES:
            present = importlib.util.find_spec(_PACKAGES[key]) is not None
            if value and not present:
                reasons.append(key)
            if value is False and present:
                reasons.append(f"no {key}")
        else:
            reasons.append(f"RunIf({key}=...) is not understood by the port")
    return reasons


def RunIf(**kwargs: Any) -> pytest.MarkDecorator:  # noqa: N802 - Lightning's helper's name
    reasons = _reasons(kwargs)
    return pytest.mark.skipif(bool(reasons), reason=f"Requires: [{' + '.join(reasons)}]", **kwargs)


#: Lightning's marker for a gloo failure on Windows; never the case here
_xfail_gloo_windows = pytest.mark.skipif(False, reason="gloo on Windows")
