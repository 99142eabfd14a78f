"""Precision: the numeric format of parameters and computation, and what backward/step need for it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.errors import ConfigurationError, closest

PRECISIONS = ("64-true", "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
_ALIASES = {16: "16-mixed", 32: "32-true", 64: "64-true", "16": "16-mixed", "32": "32-true", "64": "64-true",
            "bf16": "bf16-mixed"}
_NULL = contextlib.nullcontext()


def normalize_precision(value: Any) -> str:
    """Return the canonical precision string for ``value`` ("bf16" -> "bf16-mixed", 32 -> "32-true", ...)."""
    if isinstance(value, str) and value in PRECISIONS:
        return value
    if not isinstance(value, bool) and isinstance(value, (int, str)) and value in _ALIASES:
        return _ALIASES[value]
    accepted = ", ".join(repr(p) for p in PRECISIONS)
    text = str(value).lower()
    near = ["16-mixed", "16-true"] if "fp16" in text or text == "half" else closest(text, PRECISIONS)
    hint = f" Did you mean {' or '.join(map(repr, near))}?" if near else ""
    raise ConfigurationError(
        f"Unknown precision {value!r}.{hint} Accepted values are {accepted}, and the shorthands 16, 32, 64, "
        "'16', '32', '64' (-> '16-mixed', '32-true', '64-true') and 'bf16' (-> 'bf16-mixed')."
    )


def _cast_floating(data: Any, dtype: torch.dtype) -> Any:
    if isinstance(data, Tensor):
        return data.to(dtype) if data.is_floating_point() else data
    if isinstance(data, Mapping):
        return type(data)({k: _cast_floating(v, dtype) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*[_cast_floating(v, dtype) for v in data])
    if isinstance(data, (list, tuple)):
        return type(data)([_cast_floating(v, dtype) for v in data])
    return data


class Precision:
    """Full precision, float32 parameters and computation ("32-true"). The base of every variant."""

    name: ClassVar[str] = "32-true"

    @property
    def param_dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.float32

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast the module for this precision ("-true" variants cast parameters and buffers)."""
        return module

    def convert_input(self, data: Any) -> Any:
        """Cast floating tensors in a batch where the precision needs it. Identity here."""
        return data

    def forward_context(self) -> contextlib.AbstractContextManager:
        """The context forward passes run in (autocast for mixed precision)."""
        return _NULL

    def backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``tensor``."""
        tensor.backward(*args, **kwargs)

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Step ``optimizer`` (with ``closure`` when given)."""
        if closure is None:
            return optimizer.step(**kwargs)
        return optimizer.step(closure=closure, **kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Bring gradients to their true scale before clipping. Nothing to do without a scaler."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass

    def teardown(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class _DefaultDtype:
    """Sets torch's default floating dtype inside the block, so tensors made in forward match the parameters."""

    __slots__ = ("dtype", "previous")

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __enter__(self) -> None:
        self.previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc: Any) -> None:
        torch.set_default_dtype(self.previous)


class TruePrecision(Precision):
    """Parameters, buffers, inputs and computation all in one dtype: "64-true", "16-true", "bf16-true"."""

    _DTYPES: ClassVar[dict[str, torch.dtype]] = {"64-true": torch.float64, "16-true": torch.float16,
                                                  "bf16-true": torch.bfloat16}

    def __init__(self, name: str = "64-true") -> None:
        if name not in self._DTYPES:
            raise ConfigurationError(f"TruePrecision takes one of {sorted(self._DTYPES)}, got {name!r}.")
        self._name = name
        self._dtype = self._DTYPES[name]

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._name

    @property
    def param_dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def compute_dtype(self) -> torch.dtype:
        return self._dtype

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self._dtype)

    def convert_input(self, data: Any) -> Any:
        return _cast_floating(data, self._dtype)

    def forward_context(self) -> contextlib.AbstractContextManager:
        return _DefaultDtype(self._dtype)


class DoublePrecision(TruePrecision):
    """float64 everywhere ("64-true")."""

    def __init__(self) -> None:
        super().__init__("64-true")


class HalfPrecision(TruePrecision):
    """float16 or bfloat16 everywhere ("16-true", "bf16-true"), no loss scaling."""

    def __init__(self, name: str = "bf16-true") -> None:
        if name not in ("16-true", "bf16-true"):
            raise ConfigurationError(f"HalfPrecision takes '16-true' or 'bf16-true', got {name!r}.")
        super().__init__(name)


class MixedPrecision(Precision):
    """float32 parameters, forward under autocast to float16 ("16-mixed", with a gradient scaler) or bfloat16."""

    def __init__(self, name: str = "bf16-mixed", device_type: str = "cpu", scaler: Any = None) -> None:
        if name not in ("16-mixed", "bf16-mixed"):
            raise ConfigurationError(f"MixedPrecision takes '16-mixed' or 'bf16-mixed', got {name!r}.")
        self._name = name
        self.device_type = device_type
        self._dtype = torch.float16 if name == "16-mixed" else torch.bfloat16
        if scaler is None and name == "16-mixed":
            scaler = torch.amp.GradScaler(device_type)
        self.scaler = scaler
        self._unscaled: set[int] = set()

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._name

    @property
    def compute_dtype(self) -> torch.dtype:
        return self._dtype

    def forward_context(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self._dtype)

    def backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        if self.scaler is not None:
            tensor = self.scaler.scale(tensor)
        tensor.backward(*args, **kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        if self.scaler is not None and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        if self.scaler is None:
            return super().optimizer_step(optimizer, closure, **kwargs)
        # GradScaler cannot step with a closure: evaluate it first, then step on the scaled gradients
        result = closure() if closure is not None else None
        self.scaler.step(optimizer, **kwargs)  # skips the update when gradients hold inf/nan
        self.scaler.update()
        self._unscaled.clear()
        return result

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])


_FP16_CPU_OK: bool | None = None


def _fp16_on_cpu_works() -> bool:
    """Probe once whether this torch build can autocast to float16 on CPU and backpropagate."""
    global _FP16_CPU_OK
    if _FP16_CPU_OK is None:
        try:
            w = torch.randn(4, 4, requires_grad=True)
            with torch.autocast("cpu", dtype=torch.float16):
                y = (torch.randn(2, 4) @ w).sum()
            y.float().backward()
            torch.amp.GradScaler("cpu")
            _FP16_CPU_OK = w.grad is not None
        except Exception:
            _FP16_CPU_OK = False
    return _FP16_CPU_OK


def precision_for(value: Any, device_type: str) -> Precision:
    """Build the Precision for ``value`` (a name, an alias, or a Precision object) on ``device_type``."""
    if isinstance(value, Precision):
        return value
    name = normalize_precision(value)
    if name.startswith("16") and device_type == "cpu" and not _fp16_on_cpu_works():
        raise ConfigurationError(
            f"precision={value!r} needs float16 on the CPU, which this torch build ({torch.__version__}) cannot do. "
            "Use precision='bf16-mixed' or '32-true' on CPU, or train on a GPU."
        )
    if "bf16" in name and device_type == "cuda" and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise ConfigurationError(
            f"precision={value!r} needs bfloat16, which this GPU does not support. Use precision='16-mixed' "
            "(float16 with a gradient scaler) or '32-true'."
        )
    if name == "32-true":
        return Precision()
    if name == "64-true":
        return DoublePrecision()
    if name.endswith("-true"):
        return HalfPrecision(name)
    return MixedPrecision(name, device_type=device_type)
