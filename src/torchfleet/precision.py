"""Precision: the numeric format of parameters and computation, and what backward/step need for it."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.errors import ConfigurationError, closest

log = logging.getLogger(__name__)

PRECISIONS = ("64-true", "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
#: what runs when neither precision= nor a Precision plugin or strategy object says otherwise
DEFAULT_PRECISION = "32-true"
_ALIASES: dict[Any, str] = {
    16: "16-mixed", 32: "32-true", 64: "64-true",
    "16": "16-mixed", "32": "32-true", "64": "64-true",
    "bf16": "bf16-mixed",
}
# Words people type for a precision; used only to suggest the canonical name, never accepted.
_SUGGEST: dict[str, tuple[str, ...]] = {
    "fp16": ("16-mixed", "16-true"), "float16": ("16-mixed", "16-true"), "half": ("16-mixed", "16-true"),
    "amp": ("16-mixed", "bf16-mixed"), "mixed": ("16-mixed", "bf16-mixed"),
    "bfloat16": ("bf16-mixed", "bf16-true"),
    "fp32": ("32-true",), "float32": ("32-true",), "float": ("32-true",), "single": ("32-true",),
    "fp64": ("64-true",), "float64": ("64-true",), "double": ("64-true",),
}
_NULL = contextlib.nullcontext()


def normalize_precision(value: Any) -> str:
    """Return the canonical precision string for ``value`` ("bf16" -> "bf16-mixed", 32 -> "32-true", ...)."""
    if isinstance(value, str) and value in PRECISIONS:
        return value
    # bool is an int and 16.0 == 16: neither is a precision someone meant
    if type(value) in (int, str) and value in _ALIASES:
        return _ALIASES[value]
    text = str(value).strip().lower()
    near = list(_SUGGEST.get(text, ())) or list(_SUGGEST.get(text.replace("-", "").replace("_", ""), ()))
    if not near:
        near = closest(text, PRECISIONS, n=2)
    hint = f" Did you mean {' or '.join(map(repr, near))}?" if near else ""
    accepted = ", ".join(repr(p) for p in PRECISIONS)
    raise ConfigurationError(
        f"Unknown precision {value!r} (Precision {value!r} is invalid).{hint} Accepted values are {accepted}, and the "
        "shorthands 16, 32, 64, "
        "'16', '32', '64' (-> '16-mixed', '32-true', '64-true') and 'bf16' (-> 'bf16-mixed')."
    )


def _cast_floating(data: Any, dtype: torch.dtype) -> Any:
    """Cast every floating tensor inside nested containers to ``dtype``; other leaves are returned as they are."""
    if isinstance(data, Tensor):
        return data.to(dtype) if data.is_floating_point() else data
    if isinstance(data, (str, bytes, int, float, type(None))):
        return data
    if isinstance(data, Mapping):
        items = {k: _cast_floating(v, dtype) for k, v in data.items()}
        if type(data) is dict:
            return items
        try:
            # defaultdict and friends take extra constructor arguments: copy, then fill
            out = data.copy()  # type: ignore[attr-defined]
            out.update(items)
            return out
        except (AttributeError, TypeError):
            return items
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*[_cast_floating(v, dtype) for v in data])
    if isinstance(data, (list, tuple)):
        return type(data)(_cast_floating(v, dtype) for v in data)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        changes = {f.name: _cast_floating(getattr(data, f.name), dtype) for f in dataclasses.fields(data) if f.init}
        return dataclasses.replace(data, **changes)
    return data


class Precision:
    """Full precision, float32 parameters and computation ("32-true"). The base of every variant."""

    name: ClassVar[str] = "32-true"

    #: the Trainer's Module's own ``backward(loss, *args, **kwargs)`` during a stage when its class overrides it
    #: (Lightning's hook); it gets the loss after scaling. None: ``loss.backward(*args, **kwargs)``
    module_backward: Callable[..., None] | None = None

    def _run_backward(self, tensor: Tensor, *args: Any, **kwargs: Any) -> None:
        if self.module_backward is None:
            tensor.backward(*args, **kwargs)
        else:
            self.module_backward(tensor, *args, **kwargs)

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype parameters are stored in."""
        return torch.float32

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the forward computation runs in."""
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

    def tensor_init_context(self) -> contextlib.AbstractContextManager:
        """Inside, torch's default dtype is the parameters' dtype, so new floating tensors are made in it."""
        return _DefaultDtype(self.param_dtype)

    def module_init_context(self) -> contextlib.AbstractContextManager:
        """Inside, new modules get their parameters in this precision's dtype (Lightning's plugin method)."""
        return _DefaultDtype(self.param_dtype)

    def convert_output(self, data: Any) -> Any:
        """Cast a model's output back where the precision changed it (Lightning's hook). Identity here."""
        return data

    def pre_backward(self, tensor: Tensor, module: Any) -> Tensor:
        """Called before ``backward`` with the loss and the Module; returns the tensor to backpropagate."""
        return tensor

    def backward(self, tensor: Tensor, model: Any, optimizer: Optimizer | None = None, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``tensor``. ``model`` is the Module, ``optimizer`` the one that steps next (None in
        manual optimisation and in Fleet); ``args``/``kwargs`` go to ``Tensor.backward``."""
        self._run_backward(tensor, *args, **kwargs)

    def post_backward(self, tensor: Tensor, module: Any) -> Tensor:
        """Called after ``backward`` with the loss and the Module; returns the loss the loop keeps (detached)."""
        return tensor.detach()

    def connect(self, model: Any, optimizers: list[Any], lr_schedulers: list[Any]) -> tuple[Any, list[Any], list[Any]]:
        """Adapt the model, optimizers and LR schedulers a Trainer stage set up (Lightning's hook; unchanged here)."""
        return model, optimizers, lr_schedulers

    def optimizer_step(self, optimizer: Optimizer, model: Any = None, closure: Callable[[], Any] | None = None,
                       **kwargs: Any) -> Any:
        """Step ``optimizer`` (with ``closure`` when given) and return what the step returns. ``model`` is the
        Module being trained (Lightning's argument; None from Fleet)."""
        if closure is None:
            return optimizer.step(**kwargs)
        return optimizer.step(closure=closure, **kwargs)

    def main_params(self, optimizer: Optimizer) -> Iterator[Tensor]:
        """The parameters the optimizer updates, whose gradients clipping changes (a generator, as Lightning's)."""
        return (p for group in optimizer.param_groups for p in group["params"])

    def clip_gradients(self, optimizer: Optimizer, clip_val: float = 0.0, gradient_clip_algorithm: Any = "norm") -> None:
        """Clip the gradients of ``optimizer``'s parameters by ``"norm"`` or ``"value"``; nothing when clip_val <= 0."""
        if clip_val <= 0:
            return
        algorithm = str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)).lower()
        if algorithm == "value":
            self.clip_grad_by_value(optimizer, clip_val)
        elif algorithm == "norm":
            self.clip_grad_by_norm(optimizer, clip_val)

    def clip_grad_by_value(self, optimizer: Optimizer, clip_val: float) -> None:
        """Clamp every gradient element of ``main_params(optimizer)`` to ``[-clip_val, clip_val]``."""
        torch.nn.utils.clip_grad_value_(self.main_params(optimizer), clip_value=clip_val)

    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: float) -> None:
        """Scale the gradients of ``main_params(optimizer)`` to a total 2-norm of at most ``clip_val``."""
        torch.nn.utils.clip_grad_norm_(self.main_params(optimizer), clip_val)

    def train_step_context(self) -> contextlib.AbstractContextManager:
        """The context the Trainer's training_step runs in (default: ``forward_context``)."""
        return self.forward_context()

    def val_step_context(self) -> contextlib.AbstractContextManager:
        """The context the Trainer's validation_step runs in (default: ``forward_context``)."""
        return self.forward_context()

    def test_step_context(self) -> contextlib.AbstractContextManager:
        """The context the Trainer's test_step runs in (default: ``forward_context``)."""
        return self.forward_context()

    def predict_step_context(self) -> contextlib.AbstractContextManager:
        """The context the Trainer's predict_step runs in (default: ``forward_context``)."""
        return self.forward_context()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Called with the checkpoint dictionary before it is written (Lightning's hook; nothing here)."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Called with a loaded checkpoint dictionary before the state is restored (Lightning's hook; nothing here)."""

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Bring gradients to their true scale before clipping. Nothing to do without a scaler."""

    @property
    def skips_nonfinite_steps(self) -> bool:
        """Whether inf/nan gradients are expected and handled (a loss scaler skips the step and lowers the scale)."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """State to save in a checkpoint (the loss scaler's, where there is one)."""
        return {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def teardown(self) -> None:
        """Release what the precision holds."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


#: Lightning's Precision hooks that torchfleet's own classes fold into faster paths: the Trainer calls them where a
#: class outside torchfleet (yours) overrides them (``user_overrides``, decided once per stage)
LIGHTNING_HOOKS = (
    "pre_backward", "backward", "post_backward", "optimizer_step", "clip_gradients", "clip_grad_by_norm",
    "clip_grad_by_value", "main_params", "train_step_context", "val_step_context", "test_step_context",
    "predict_step_context",
)
#: overriding any of these makes the Trainer clip through ``Precision.clip_gradients``
CLIP_HOOKS = frozenset({"clip_gradients", "clip_grad_by_norm", "clip_grad_by_value", "main_params"})


def user_overrides(precision: Precision) -> frozenset[str]:
    """The ``LIGHTNING_HOOKS`` that ``precision``'s class defines anew below torchfleet's own precision classes."""
    return _class_overrides(type(precision))


@functools.cache
def _class_overrides(cls: type) -> frozenset[str]:
    own = next(c for c in cls.__mro__ if c.__module__ == __name__)
    return frozenset(n for n in LIGHTNING_HOOKS if getattr(cls, n, None) is not getattr(own, n, None))


class _DefaultDtype:
    """Sets torch's default floating dtype inside the block, so tensors made in forward match the parameters."""

    __slots__ = ("dtype", "previous")

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.previous: list[torch.dtype] = []

    def __enter__(self) -> None:
        self.previous.append(torch.get_default_dtype())
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc: Any) -> None:
        torch.set_default_dtype(self.previous.pop())


_TRUE_DTYPES: dict[str, torch.dtype] = {"64-true": torch.float64, "16-true": torch.float16,
                                        "bf16-true": torch.bfloat16}


_MODULE_CASTS: dict[torch.dtype, str] = {torch.float64: "double", torch.float16: "half", torch.bfloat16: "bfloat16"}


class TruePrecision(Precision):
    """Parameters, buffers, inputs and computation all in one dtype: "64-true", "16-true", "bf16-true"."""

    def __init__(self, precision: str | torch.dtype = "64-true") -> None:
        name = _name_for(precision, _TRUE_DTYPES, type(self).__name__)
        self._name = name
        self._dtype = _TRUE_DTYPES[name]

    @property
    def name(self) -> str:  # type: ignore[override]
        """The canonical precision string."""
        return self._name

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype parameters are stored in."""
        return self._dtype

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the forward computation runs in."""
        return self._dtype

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast the floating-point parameters and buffers of ``module``; integer, bool and complex ones keep their
        dtype (``module.to(dtype)`` would make complex tensors real, dropping the imaginary part)."""
        # Module.double/half/bfloat16 cast only floating-point tensors (Lightning's "64-true" is module.double())
        return getattr(module, _MODULE_CASTS[self._dtype])()

    def convert_input(self, data: Any) -> Any:
        """Cast floating tensors inside nested dicts, lists, tuples, namedtuples and dataclasses."""
        return _cast_floating(data, self._dtype)

    def forward_context(self) -> contextlib.AbstractContextManager:
        """Make this dtype torch's default inside forward, so new tensors match the parameters."""
        return _DefaultDtype(self._dtype)


def _name_for(precision: str | torch.dtype, names: Mapping[str, torch.dtype], owner: str) -> str:
    """Map a canonical name or a dtype to one of ``names``; anything else is a ConfigurationError."""
    for name, dtype in names.items():
        if precision == name or precision == dtype:
            return name
    accepted = ", ".join(f"{n!r} ({d})" for n, d in names.items())
    raise ConfigurationError(f"{owner} was given {precision!r}; it takes one of {accepted}, as the name or the dtype.")


class DoublePrecision(TruePrecision):
    """float64 everywhere ("64-true")."""

    def __init__(self) -> None:
        super().__init__("64-true")


class HalfPrecision(TruePrecision):
    """float16 or bfloat16 everywhere ("16-true", "bf16-true"), without loss scaling."""

    def __init__(self, precision: str | torch.dtype = torch.bfloat16) -> None:
        super().__init__(_name_for(precision, {k: _TRUE_DTYPES[k] for k in ("16-true", "bf16-true")}, "HalfPrecision"))


_MIXED_DTYPES: dict[str, torch.dtype] = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


class MixedPrecision(Precision):
    """float32 parameters, forward under autocast to float16 ("16-mixed", with a gradient scaler) or bfloat16.

    ``precision`` is the name or the autocast dtype. ``scaler`` replaces the default scaler of
    "16-mixed" (``torch.amp.GradScaler(device_type)``); bfloat16 needs none.
    """

    def __init__(
        self, precision: str | torch.dtype = torch.bfloat16, device_type: str = "cpu", scaler: Any = None
    ) -> None:
        self._name = _name_for(precision, _MIXED_DTYPES, "MixedPrecision")
        self._dtype = _MIXED_DTYPES[self._name]
        self.device_type = device_type
        if scaler is None and self._name == "16-mixed":
            scaler = torch.amp.GradScaler(device_type)
        self.scaler = scaler
        # unscale_ may run once per optimizer between two updates; clipping and the step both ask for it
        self._unscaled: set[int] = set()

    @property
    def name(self) -> str:  # type: ignore[override]
        """The canonical precision string."""
        return self._name

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype autocast runs eligible operations in."""
        return self._dtype

    def forward_context(self) -> contextlib.AbstractContextManager:
        """``torch.autocast`` for the device type and dtype."""
        return torch.autocast(self.device_type, dtype=self._dtype)

    def backward(self, tensor: Tensor, model: Any, optimizer: Optimizer | None = None, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``tensor``, scaled by the gradient scaler when there is one."""
        if self.scaler is not None:
            tensor = self.scaler.scale(tensor)
        self._run_backward(tensor, *args, **kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Divide the gradients of ``optimizer`` by the loss scale (once per step, however often asked)."""
        if self.scaler is not None and id(optimizer) not in self._unscaled and _has_grads(optimizer):
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def clip_gradients(self, optimizer: Optimizer, clip_val: float = 0.0, gradient_clip_algorithm: Any = "norm") -> None:
        """Unscale the gradients first (with a scaler), then clip them."""
        if clip_val > 0:
            self.unscale_gradients(optimizer)
        super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

    @property
    def skips_nonfinite_steps(self) -> bool:
        """True with a gradient scaler: an overflowing step is skipped, not an error."""
        return self.scaler is not None

    def optimizer_step(self, optimizer: Optimizer, model: Any = None, closure: Callable[[], Any] | None = None,
                       **kwargs: Any) -> Any:
        """Step ``optimizer``; with a scaler, a step whose gradients hold inf/nan is skipped and the scale lowered."""
        if self.scaler is None:
            return super().optimizer_step(optimizer, model, closure, **kwargs)
        # GradScaler cannot step with a closure: evaluate it first, then step on the gradients it left
        result = closure() if closure is not None else None
        if not _has_grads(optimizer):
            # the closure skipped backward (or nothing was scaled): there is nothing to step or to check
            log.debug("No gradients for %s: optimizer step skipped.", type(optimizer).__name__)
            return result
        self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        self._unscaled.clear()
        return result

    def state_dict(self) -> dict[str, Any]:
        """The gradient scaler's state (empty without a scaler)."""
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the gradient scaler's state; state from a run without a scaler changes nothing."""
        if self.scaler is not None and state_dict.get("scaler"):
            self.scaler.load_state_dict(state_dict["scaler"])

    def teardown(self) -> None:
        """Forget which optimizers were unscaled."""
        self._unscaled.clear()

    def __repr__(self) -> str:
        return f"MixedPrecision({self._name!r}, device_type={self.device_type!r})"


def _has_grads(optimizer: Optimizer) -> bool:
    return any(p.grad is not None for group in optimizer.param_groups for p in group["params"])


@functools.cache
def _fp16_on_cpu_works(mode: str) -> bool:
    """Probe once per mode whether this torch build can train in float16 on the CPU."""
    try:
        w = torch.randn(4, 4, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        if mode == "16-mixed":
            scaler = torch.amp.GradScaler("cpu")
            with torch.autocast("cpu", dtype=torch.float16):
                y = torch.randn(2, 4) @ w
            if y.dtype != torch.float16:
                return False
            scaler.scale(y.float().sum()).backward()
            scaler.step(opt)
            scaler.update()
        else:
            w16 = w.detach().half().requires_grad_()
            (torch.randn(2, 4, dtype=torch.float16) @ w16).sum().backward()
            torch.optim.SGD([w16], lr=0.1).step()
            return w16.grad is not None and w16.dtype == torch.float16
        return w.grad is not None
    except Exception as exc:  # any failure means "not on this build"; the caller explains
        log.debug("float16 on CPU (%s) probe failed: %s", mode, exc)
        return False


def precision_for(value: Any, device_type: str) -> Precision:
    """Build the Precision for ``value`` (a name, an alias, or a Precision object) on ``device_type``."""
    if isinstance(value, Precision):
        return value
    name = normalize_precision(value)
    if name in ("16-mixed", "16-true") and device_type == "cpu" and not _fp16_on_cpu_works(name):
        raise ConfigurationError(
            f"precision={value!r} needs float16 on the CPU, which is not supported by this torch build "
            f"({torch.__version__}). Use precision='bf16-mixed' or '32-true' on the CPU, or train on a GPU."
        )
    if name in ("bf16-mixed", "bf16-true") and device_type == "cuda" and torch.cuda.is_available() \
            and not torch.cuda.is_bf16_supported():
        raise ConfigurationError(
            f"precision={value!r} needs bfloat16, which this CUDA device ({torch.cuda.get_device_name()}) does not "
            "support. Use precision='16-mixed' (float16 with a gradient scaler) or '32-true'."
        )
    if name == "32-true":
        return Precision()
    if name == "64-true":
        return DoublePrecision()
    if name in _TRUE_DTYPES:
        return HalfPrecision(name)
    return MixedPrecision(name, device_type=device_type)
