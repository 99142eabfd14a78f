"""Recording a Strategy's calls, and the Module's and Callbacks' hooks around them, as ordered events (no Lightning needed).

The library of ``record_lightning_strategy_hooks.py`` (which records Lightning 2.6.6's Trainer with it) and of
``tests/strategy_hooks.py`` (which records torchfleet's Trainer with it), so both sides write the same events.
The event format is described in the recording script's docstring.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
from collections import Counter
from typing import Any

import torch

# Properties through which a strategy changes what the Trainer does: their reads are events too (the
# others' reads are only counted: lightning_module alone is read hundreds of times in one fit).
FLAG_PROPERTIES = (
    "restore_checkpoint_after_setup", "lightning_restore_optimizer", "handles_gradient_accumulation",
    "distributed_sampler_kwargs",
)
MODULE_HOOKS = (
    "setup", "configure_model", "configure_optimizers", "on_fit_start", "on_train_start",
    "on_train_epoch_start", "on_train_batch_start", "training_step", "on_before_backward",
    "on_after_backward", "on_before_optimizer_step", "on_train_batch_end", "on_train_epoch_end",
    "on_validation_start", "validation_step", "on_validation_end", "on_test_start", "test_step",
    "on_test_end", "on_predict_start", "predict_step", "on_predict_end", "on_save_checkpoint",
    "on_load_checkpoint", "on_train_end", "on_fit_end", "teardown",
)
CALLBACK_HOOKS = (
    "setup", "on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start",
    "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_train_batch_end",
    "on_train_epoch_end", "on_validation_start", "on_validation_end", "on_test_start", "on_test_end",
    "on_predict_start", "on_predict_end", "on_save_checkpoint", "on_load_checkpoint", "on_train_end",
    "on_fit_end", "on_exception", "teardown",
)
SEED = 7


# ----------------------------------------------------------------------------------------------------
# Describing arguments: kinds, not values (values only where they are small and deterministic).

ROOT = ""  # the run's folder, written as <root> in descriptions


def describe(value: Any, depth: int = 0) -> str:
    """A short, deterministic description of a value's kind."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return f"int {value}"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if ROOT:
            text = text.replace(ROOT, "<root>")
        return f"{type(value).__name__} {text!r}"
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"Tensor({dtype}, {list(value.shape)}, {value.device.type})"
    if isinstance(value, torch.device):
        return f"device({value})"
    if isinstance(value, BaseException):
        return f"{type(value).__name__}({str(value).splitlines()[0] if str(value) else ''!r})"
    if isinstance(value, torch.utils.data.DataLoader):
        sampler = type(value.sampler).__name__ if value.batch_sampler is None else type(value.batch_sampler.sampler).__name__
        return f"DataLoader(batch_size={value.batch_size}, sampler={sampler})"
    if isinstance(value, dict):
        if depth > 0:
            return f"dict({len(value)})"
        keys = sorted(str(k) for k in value)
        return f"dict with keys [{', '.join(keys)}]"
    if isinstance(value, (list, tuple)):
        if depth > 0 or len(value) > 4:
            return f"{type(value).__name__}({len(value)})"
        return f"{type(value).__name__}[{', '.join(describe(v, depth + 1) for v in value)}]"
    if type(value).__name__ == "ReduceOp" or "RedOpType" in type(value).__name__:
        return f"ReduceOp.{getattr(value, 'name', value)}"
    if isinstance(value, torch.nn.Module):
        return type(value).__name__
    if isinstance(value, torch.optim.Optimizer):
        return type(value).__name__
    if isinstance(value, contextlib.AbstractContextManager):
        return f"context manager ({type(value).__name__})"
    if inspect.isfunction(value) or inspect.ismethod(value):
        return "callable"
    if callable(value) and not isinstance(value, type):
        return f"callable ({type(value).__name__})"
    return type(value).__name__


def describe_call(signature: inspect.Signature, args: tuple, kwargs: dict, skip: tuple[str, ...]) -> str:
    """The arguments as passed, named by the signature: ``name: kind`` positionally, ``name=kind`` by keyword."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:  # a call Lightning's own signature cannot bind: record it as such
        return f"<does not bind: {error}>"
    parts = []
    for name, value in bound.arguments.items():
        if name in skip:
            continue
        param = signature.parameters[name]
        if param.kind is param.VAR_POSITIONAL:
            parts.extend(f"*{describe(v)}" for v in value)
        elif param.kind is param.VAR_KEYWORD:
            parts.extend(f"{k}={describe(v)}" for k, v in value.items())
        elif name in kwargs:
            parts.append(f"{name}={describe(value)}")
        else:
            parts.append(f"{name}: {describe(value)}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------------------------------
# The recorder: one per process.


class Recorder:
    """Ordered events (with nesting) and property read counts of one process."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.depth = 0
        self.active = True
        self.property_reads: Counter[str] = Counter()

    def add(self, text: str) -> int:
        self.events.append("  " * self.depth + text)
        return len(self.events) - 1

    def append_to(self, index: int, suffix: str) -> None:
        self.events[index] += suffix


RECORDER = Recorder()


def recorded_call(prefix: str, name: str, signature: inspect.Signature, call, skip=("self",)):
    """A function recording ``prefix.name(args)`` and then calling ``call``; nested calls are indented."""

    def wrapper(*args, **kwargs):
        if not RECORDER.active:
            return call(*args, **kwargs)
        index = RECORDER.add(f"{prefix}.{name}({describe_call(signature, args, kwargs, skip)})")
        RECORDER.depth += 1
        try:
            result = call(*args, **kwargs)
        except BaseException as error:
            RECORDER.append_to(index, f" !! raised {type(error).__name__}")
            raise
        finally:
            RECORDER.depth -= 1
        if result is not None:
            RECORDER.append_to(index, f" -> {describe(result)}")
        return result

    return wrapper


class _RecordedContext:
    """Wraps a context manager a Strategy hook returned: calls inside it are nested, leaving it is recorded."""

    def __init__(self, context, name: str, prefix: str = "S") -> None:
        self.context, self.name, self.prefix = context, name, prefix

    def __enter__(self):
        value = self.context.__enter__()
        RECORDER.depth += 1
        return value

    def __exit__(self, *exc):
        RECORDER.depth -= 1
        RECORDER.add(f"{self.prefix}.{self.name} exit")
        return self.context.__exit__(*exc)


def build_recorder_class(base: type, methods: dict[str, tuple[str, inspect.Signature]], properties: list[str],
                         prefix: str = "S") -> type:
    """A subclass of ``base`` recording every call of ``methods`` (name -> (kind, the signature its arguments are
    bound to)) and the reads and writes of ``properties``, then running ``base``'s. Needs no Lightning: the
    torchfleet side (tests/strategy_hooks.py) builds its recorder with it from the contract this script wrote.
    ``prefix`` starts each event ("S" for a strategy, "P" for a precision plugin, "A" for an accelerator)."""
    namespace: dict[str, Any] = {"__module__": __name__}
    for name, (kind, signature) in methods.items():
        implementation = inspect.getattr_static(base, name)
        if kind == "staticmethod":
            function = implementation.__func__
            namespace[name] = staticmethod(functools.wraps(function)(recorded_call(prefix, name, signature, function,
                                                                                   skip=())))
        elif kind == "classmethod":
            function = implementation.__func__
            namespace[name] = classmethod(
                functools.wraps(function)(recorded_call(prefix, name, signature, function, skip=("cls",)))
            )
        elif kind == "context manager":

            def make(implementation=implementation, name=name, signature=signature):
                inner = recorded_call(prefix, name, signature, implementation)

                @functools.wraps(implementation)
                def wrapper(*args, **kwargs):
                    context = inner(*args, **kwargs)
                    return _RecordedContext(context, name, prefix) if RECORDER.active else context

                return wrapper

            namespace[name] = make()
        else:
            namespace[name] = functools.wraps(implementation)(recorded_call(prefix, name, signature, implementation))
    for name in properties:
        parent = next(inspect.getattr_static(c, name) for c in base.__mro__ if name in vars(c))

        def make_property(parent=parent, name=name):
            def getter(self):
                if not RECORDER.active:
                    return parent.fget(self)
                RECORDER.property_reads[name] += 1
                if name not in FLAG_PROPERTIES:
                    return parent.fget(self)
                index = RECORDER.add(f"S.{name} read")
                value = parent.fget(self)
                RECORDER.append_to(index, f" -> {describe(value)}")
                return value

            setter = None
            if parent.fset is not None:

                def setter(self, value):
                    if RECORDER.active:
                        RECORDER.add(f"S.{name} = {describe(value)}")
                    parent.fset(self, value)

            return property(getter, setter, doc=parent.__doc__)

        namespace[name] = make_property()
    return type(f"Recording{base.__name__}", (base,), namespace)


def signature_from_text(text: str) -> inspect.Signature:
    """The ``inspect.Signature`` a contract entry of the JSON spells (``"(self, tensor: torch.Tensor, group=None)"``):
    names, kinds and defaults, without the annotations (which name Lightning's classes)."""
    import ast

    head = text.rsplit(") ->", 1)[0] + ")" if ") ->" in text else text
    head = re.sub(r"<\w+\.\w+: ('[^']*')>", r"\1", head)  # an enum default (<GradClipAlgorithmType.NORM: 'norm'>)
    function = ast.parse(f"def f{head.replace('~', '')}: pass").body[0]
    arguments = function.args  # type: ignore[attr-defined]
    parameters = []
    positional = arguments.posonlyargs + arguments.args
    defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    kinds = [inspect.Parameter.POSITIONAL_ONLY] * len(arguments.posonlyargs)
    kinds += [inspect.Parameter.POSITIONAL_OR_KEYWORD] * len(arguments.args)
    for arg, default, kind in zip(positional, defaults, kinds):
        value = inspect.Parameter.empty if default is None else ast.literal_eval(default)
        parameters.append(inspect.Parameter(arg.arg, kind, default=value))
    if arguments.vararg is not None:
        parameters.append(inspect.Parameter(arguments.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
        value = inspect.Parameter.empty if default is None else ast.literal_eval(default)
        parameters.append(inspect.Parameter(arg.arg, inspect.Parameter.KEYWORD_ONLY, default=value))
    if arguments.kwarg is not None:
        parameters.append(inspect.Parameter(arguments.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(parameters)


def with_recorded_hooks(base: type, hooks: tuple[str, ...], prefix: str, skip: tuple[str, ...]) -> type:
    """A subclass of ``base`` whose named hooks record their call, then run the parent's."""
    namespace: dict[str, Any] = {"__module__": __name__}
    for name in hooks:
        implementation = getattr(base, name)
        signature = inspect.signature(implementation)
        namespace[name] = functools.wraps(implementation)(recorded_call(prefix, name, signature, implementation, skip))
    return type(f"Recording{base.__name__}", (base,), namespace)


# ----------------------------------------------------------------------------------------------------
# The model, data and one stage's run (in the worker processes).


def build_model_class(lightning_module: type) -> type:
    from torch.utils.data import DataLoader, Dataset

    class RandomVectors(Dataset):
        def __init__(self) -> None:
            self.data = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.data)

        def __getitem__(self, index: int) -> torch.Tensor:
            return self.data[index]

    class HookModel(lightning_module):
        """A BoringModel-like module: one Linear layer, MSE against ones."""

        def __init__(self, fail_at: tuple[int, int] | None = None) -> None:
            super().__init__()
            self.fail_at = fail_at
            self.layer: torch.nn.Module | None = None

        def configure_model(self) -> None:
            if self.layer is None:
                self.layer = torch.nn.Linear(32, 2)

        def _loss(self, batch: torch.Tensor) -> torch.Tensor:
            out = self.layer(batch)
            return torch.nn.functional.mse_loss(out, torch.ones_like(out))

        def training_step(self, batch, batch_idx):
            if self.fail_at == (self.current_epoch, batch_idx):
                raise RuntimeError(f"training_step fails at epoch {self.current_epoch} batch {batch_idx}")
            loss = self._loss(batch)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch), sync_dist=True)

        def test_step(self, batch, batch_idx):
            loss = self._loss(batch)
            self.log("test_loss", loss, sync_dist=True)
            # LightningModule.all_gather calls the strategy's
            self.log("test_loss_max", self.all_gather(loss).max())

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return self.layer(batch)

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)}

        def train_dataloader(self):
            return DataLoader(RandomVectors(), batch_size=2)

        def val_dataloader(self):
            return DataLoader(RandomVectors(), batch_size=2)

        def test_dataloader(self):
            return DataLoader(RandomVectors(), batch_size=2)

        def predict_dataloader(self):
            return DataLoader(RandomVectors(), batch_size=2)

    return HookModel


def hook_name(event: str, prefix: str = "S") -> str | None:
    """``S.optimizer_step(...)`` -> ``optimizer_step`` (for ``prefix`` "S"); None for other events."""
    match = re.match(prefix + r"\.(\w+)\(", event.strip())
    return match.group(1) if match else None


def derive(events: list[str], prefix: str = "S") -> dict[str, Any]:
    """Counts per hook of ``prefix`` (S: the Strategy): every call, and those made from inside another of its hooks."""
    counts: Counter[str] = Counter()
    nested: Counter[str] = Counter()
    strategy_depths: list[int] = []  # indentation of the enclosing Strategy calls
    for event in events:
        depth = (len(event) - len(event.lstrip(" "))) // 2
        while strategy_depths and strategy_depths[-1] >= depth:
            strategy_depths.pop()
        name = hook_name(event, prefix)
        if name is None:
            continue
        counts[name] += 1
        if strategy_depths:
            nested[name] += 1
        strategy_depths.append(depth)
    return {"counts": dict(sorted(counts.items())), "counts_from_strategy_hooks": dict(sorted(nested.items()))}


def trainer_options(stage: str) -> dict[str, Any]:
    """The Trainer's loop arguments in ``stage`` (both recordings pass these; see STAGE_SETUP in the recording script)."""
    return dict(
        max_epochs=3 if stage == "fit_resumed" else 1 if stage == "fit_accumulate" else 2,
        limit_train_batches=4 if stage == "fit_accumulate" else 3,
        limit_val_batches=2,
        limit_test_batches=2,
        limit_predict_batches=2,
        accumulate_grad_batches=2 if stage == "fit_accumulate" else 1,
    )
