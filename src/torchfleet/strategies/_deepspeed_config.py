"""The DeepSpeed config behind DeepSpeedStrategy: built from its arguments or given by the user, then completed.

Three steps, each a function here so it can be tested without processes:

1. ``DeepSpeedOptions``: the constructor arguments (Lightning's DeepSpeedStrategy parameters), checked
   against their types and ranges; ``to_config()`` maps them onto DeepSpeed's config keys. Values the
   Trainer knows are left as ``"auto"``.
2. ``user_config``: a config the user passes (a dict, or the path of a JSON file) replaces that
   default entirely; DeepSpeed's own defaults then apply to whatever it leaves out.
3. ``fill_auto``: at setup, every ``"auto"`` (or missing) batch size, accumulation, clipping and
   precision entry is filled from the Trainer, so the dict handed to ``deepspeed.initialize`` holds
   no ``"auto"`` at all. ``check_config`` validates the result before DeepSpeed sees it.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import typing
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any

import torch

from torchfleet.errors import ConfigurationError
from torchfleet.strategies.memory_model import MemoryModel

AUTO = "auto"
OFFLOAD_DEVICES = ("cpu", "nvme")
STAGES = (0, 1, 2, 3)

#: precision name -> the DeepSpeed section that runs it ("32-true": neither)
_HALF_SECTIONS = {"16-mixed": "fp16", "16-true": "fp16", "bf16-mixed": "bf16", "bf16-true": "bf16"}

_STAGE_MEANING = ("0 is plain data parallel (no partitioning), 1 partitions the optimizer state, 2 also the gradients, "
                  "3 also the parameters")
_DEVICE_MEANING = "'cpu' offloads to host memory, 'nvme' to files under nvme_path"


def _option(default: object, *, minimum: float | None = None, maximum: int | None = None,
            values: tuple[str, ...] = (), what: str = "valid", meaning: str = "") -> Any:
    """A DeepSpeedOptions field: its default and what it accepts beyond its type (read by ``_check_option``)."""
    return field(default=default, metadata={"minimum": minimum, "maximum": maximum, "values": values, "what": what,
                                            "meaning": meaning})


@dataclass(frozen=True)
class DeepSpeedOptions:
    """DeepSpeedStrategy's config-building arguments, checked against their types and ranges, as one value.

    The fields are the constructor's keywords of the same names (Lightning's DeepSpeedStrategy
    parameters, same defaults); ``to_config()`` maps them onto DeepSpeed's config keys. Every field
    is checked when the options are made: bools take only True/False, ints take ints (not bools)
    within DeepSpeed's ranges, floats take finite numbers, and the fixed choices (offload devices,
    ``logging_batch_size_per_gpu="auto"``) are named in the error.
    """

    zero_optimization: bool = True
    stage: int = _option(2, minimum=0, maximum=3, what="a ZeRO stage", meaning=_STAGE_MEANING)
    offload_optimizer: bool = False
    offload_parameters: bool = False
    offload_params_device: str = _option("cpu", values=OFFLOAD_DEVICES, what="a place DeepSpeed can offload to",
                                         meaning=_DEVICE_MEANING)
    nvme_path: str | os.PathLike[str] = "/local_nvme"
    params_buffer_count: int = _option(5, minimum=0)
    params_buffer_size: int = _option(100_000_000, minimum=0)
    max_in_cpu: int = _option(1_000_000_000, minimum=0)
    offload_optimizer_device: str = _option("cpu", values=OFFLOAD_DEVICES, what="a place DeepSpeed can offload to",
                                            meaning=_DEVICE_MEANING)
    optimizer_buffer_count: int = _option(4, minimum=0)
    block_size: int = _option(1_048_576, minimum=1)
    queue_depth: int = _option(8, minimum=1)
    single_submit: bool = False
    overlap_events: bool = True
    thread_count: int = _option(1, minimum=1)
    pin_memory: bool = False
    sub_group_size: int = _option(1_000_000_000_000, minimum=0)
    contiguous_gradients: bool = True
    overlap_comm: bool = True
    allgather_partitions: bool = True
    reduce_scatter: bool = True
    allgather_bucket_size: int = _option(200_000_000, minimum=0)
    reduce_bucket_size: int = _option(200_000_000, minimum=1)
    zero_allow_untested_optimizer: bool = True
    logging_batch_size_per_gpu: int | str = _option(
        AUTO, minimum=1, values=(AUTO,), what="a per-process batch size",
        meaning="'auto' reads it from the training DataLoader")
    loss_scale: float = _option(0, minimum=0, meaning="0 scales the loss dynamically")
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    min_loss_scale: int = 1
    partition_activations: bool = False
    cpu_checkpointing: bool = False
    contiguous_memory_optimization: bool = False
    synchronize_checkpoint_boundary: bool = False

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, object]) -> DeepSpeedOptions:
        """The options named by ``arguments`` (e.g. a constructor's ``locals()``); other entries are ignored."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.name in arguments})

    def __post_init__(self) -> None:
        hints = _option_types()
        for f in fields(self):
            _check_option(f, hints[f.name], getattr(self, f.name))
        if self.offload_parameters and self.stage != 3:
            raise ConfigurationError(
                f"offload_parameters=True needs stage=3 (only ZeRO stage 3 partitions the parameters themselves), "
                f"but stage={self.stage}. Use stage=3, or offload_optimizer=True alone, which works with stages 1 to 3."
            )
        if not self.zero_optimization and (self.offload_optimizer or self.offload_parameters):
            raise ConfigurationError(
                "offload_optimizer/offload_parameters were given with zero_optimization=False, but offloading is part "
                "of ZeRO. Set zero_optimization=True (the default) with a stage, or drop the offload arguments."
            )

    def to_config(self) -> dict[str, Any]:
        """The DeepSpeed config these options describe (Trainer-known values left ``"auto"``)."""
        config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": self.logging_batch_size_per_gpu,
            "gradient_accumulation_steps": AUTO,
            "gradient_clipping": AUTO,
            "zero_allow_untested_optimizer": self.zero_allow_untested_optimizer,
            # DeepSpeed refuses a torch optimizer together with offloading unless told otherwise; letting it run
            # keeps configure_optimizers() unchanged (DeepSpeedCPUAdam is faster but compiles a C++ op first)
            "zero_force_ds_cpu_optimizer": False,
            "fp16": {
                "enabled": AUTO,
                "loss_scale": self.loss_scale,
                "initial_scale_power": self.initial_scale_power,
                "loss_scale_window": self.loss_scale_window,
                "hysteresis": self.hysteresis,
                "min_loss_scale": self.min_loss_scale,
            },
            "bf16": {"enabled": AUTO},
            "aio": {
                "block_size": self.block_size,
                "queue_depth": self.queue_depth,
                "single_submit": self.single_submit,
                "overlap_events": self.overlap_events,
                "thread_count": self.thread_count,
            },
            "activation_checkpointing": {
                "partition_activations": self.partition_activations,
                "cpu_checkpointing": self.cpu_checkpointing,
                "contiguous_memory_optimization": self.contiguous_memory_optimization,
                "synchronize_checkpoint_boundary": self.synchronize_checkpoint_boundary,
            },
        }
        if not self.zero_optimization:
            return config
        zero: dict[str, Any] = {
            "stage": self.stage,
            "contiguous_gradients": self.contiguous_gradients,
            "overlap_comm": self.overlap_comm,
            "allgather_partitions": self.allgather_partitions,
            "reduce_scatter": self.reduce_scatter,
            "allgather_bucket_size": self.allgather_bucket_size,
            "reduce_bucket_size": self.reduce_bucket_size,
            "sub_group_size": self.sub_group_size,
        }
        if self.offload_optimizer:
            zero["offload_optimizer"] = {
                "device": self.offload_optimizer_device,
                "nvme_path": self.nvme_path,
                "buffer_count": self.optimizer_buffer_count,
                "pin_memory": self.pin_memory,
            }
        if self.offload_parameters:
            zero["offload_param"] = {
                "device": self.offload_params_device,
                "nvme_path": self.nvme_path,
                "buffer_count": self.params_buffer_count,
                "buffer_size": self.params_buffer_size,
                "max_in_cpu": self.max_in_cpu,
                "pin_memory": self.pin_memory,
            }
        config["zero_optimization"] = zero
        return config


@functools.cache
def _option_types() -> dict[str, tuple[type, ...]]:
    """Each DeepSpeedOptions field's declared type as the classes it accepts (``int | str`` -> ``(int, str)``)."""
    hints = typing.get_type_hints(DeepSpeedOptions)
    return {name: tuple(typing.get_origin(t) or t for t in typing.get_args(hint) or (hint,))
            for name, hint in hints.items()}


def _is_instance(value: object, kind: type) -> bool:
    # bool is an int to isinstance, but True is never a count and 1 never a switch
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _within(value: object, meta: Mapping[str, Any]) -> bool:
    if isinstance(value, str):
        return not meta["values"] or value in meta["values"]
    if isinstance(value, float) and not math.isfinite(value):
        return False
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return ((meta["minimum"] is None or value >= meta["minimum"])
            and (meta["maximum"] is None or value <= meta["maximum"]))


def _accepted(kinds: tuple[type, ...], meta: Mapping[str, Any]) -> str:
    """What a field accepts, in words: ``an int from 0 to 3``, ``'cpu' or 'nvme'``, ``True or False``..."""
    low, high = meta["minimum"], meta["maximum"]
    bound = (f" from {low} to {high}" if low is not None and high is not None
             else f" >= {low}" if low is not None else "")
    words = {
        bool: "True or False",
        int: f"an int{bound}",
        float: f"a finite number{bound}",
        str: " or ".join(repr(v) for v in meta["values"]) or "a string",
        os.PathLike: "a path object",
    }
    text = ", or ".join(words.get(k, k.__name__) for k in kinds)
    return f"{text}; {meta['meaning']}" if meta["meaning"] else text


def _check_option(option: Field, kinds: tuple[type, ...], value: object) -> None:
    """ConfigurationError unless ``value`` is of one of ``kinds`` and within the option's range or choices."""
    right_type = any(_is_instance(value, k) for k in kinds)
    if not right_type or not _within(value, _meta(option)):
        raise _invalid(option, kinds, value, right_type)


def _meta(option: Field) -> Mapping[str, Any]:
    return option.metadata or {"minimum": None, "maximum": None, "values": (), "what": "valid", "meaning": ""}


def _invalid(option: Field, kinds: tuple[type, ...], value: object, right_type: bool) -> ConfigurationError:
    meta = _meta(option)
    given = f"{option.name}={value!r}" + ("" if right_type else f" (type {type(value).__name__})")
    return ConfigurationError(f"{given} is not {meta['what']}. Accepted: {_accepted(kinds, meta)}.")


def check_stage(stage: object) -> None:
    """ConfigurationError unless ``stage`` is one of ZeRO's stages 0-3 (also in a user's config, where 2.0 passes)."""
    if isinstance(stage, bool) or stage not in STAGES:
        option = next(f for f in fields(DeepSpeedOptions) if f.name == "stage")
        raise _invalid(option, (int,), stage, isinstance(stage, int) and not isinstance(stage, bool))


def user_config(config: str | os.PathLike[str] | Mapping[str, object]) -> dict[str, Any]:
    """A copy of the user's DeepSpeed config: a dict as given, or the JSON file at a path, read and parsed."""
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigurationError(
            f"config={config!r} is a {type(config).__name__}; DeepSpeedStrategy takes a DeepSpeed config as a dict "
            "or as the path of a JSON file."
        )
    path = os.fspath(config)
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise ConfigurationError(
            f"config={path!r} {what}. Give the path of a DeepSpeed JSON config file, or the config itself as a dict."
        )
    try:
        with open(path, encoding="utf-8") as f:
            loaded = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(
            f"config={path!r} is not valid JSON ({exc}). DeepSpeedStrategy reads DeepSpeed configs written as JSON "
            "objects, e.g. {\"zero_optimization\": {\"stage\": 2}}; fix the file or pass the config as a dict."
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigurationError(
            f"config={path!r} holds a JSON {type(loaded).__name__}, not an object. A DeepSpeed config is a JSON "
            "object such as {\"zero_optimization\": {\"stage\": 2}}."
        )
    return loaded


def zero_stage(config: Mapping[str, Any]) -> int:
    """The ZeRO stage ``config`` asks for (0 when it has no zero_optimization section)."""
    zero = config.get("zero_optimization") or {}
    return int(zero.get("stage", 0)) if isinstance(zero, Mapping) else 0


def nvme_paths(config: Mapping[str, Any]) -> list[str]:
    """The nvme_path of every offload section of ``config`` that offloads to NVMe."""
    zero = config.get("zero_optimization") or {}
    paths = []
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key) if isinstance(zero, Mapping) else None
        if isinstance(section, Mapping) and section.get("device") == "nvme":
            paths.append(section.get("nvme_path"))
    return paths


def check_config(config: Mapping[str, Any]) -> None:
    """ConfigurationError for what DeepSpeed would reject late or obscurely: the stage, and NVMe paths that do not exist."""
    zero = config.get("zero_optimization")
    if isinstance(zero, Mapping) and "stage" in zero:
        check_stage(zero["stage"])
    for path in nvme_paths(config):
        if not path or not os.path.isdir(os.fspath(path)):
            raise ConfigurationError(
                f"Offloading to NVMe writes under nvme_path, but nvme_path={path!r} is not an existing directory. "
                "Create it (on a fast local disk) and pass nvme_path=..., or offload to 'cpu' instead."
            )


def precision_section(precision_name: str) -> str | None:
    """The DeepSpeed section ("fp16"/"bf16") that runs ``precision_name``; None for 32-true; error for 64-true."""
    if precision_name == "32-true":
        return None
    if precision_name in _HALF_SECTIONS:
        return _HALF_SECTIONS[precision_name]
    raise ConfigurationError(
        f"precision={precision_name!r} cannot run under DeepSpeed, which trains in float32, float16 or bfloat16. "
        "Use '32-true', '16-mixed' or 'bf16-mixed' (DeepSpeed keeps float32 master weights for the 16-bit ones)."
    )


def _enabled(section: Any) -> bool | str | None:
    if not isinstance(section, Mapping):
        return None
    return section.get("enabled", False)


def fill_auto(
    config: Mapping[str, Any],
    *,
    micro_batch_size: int,
    accumulate_grad_batches: int,
    gradient_clip_val: float | None,
    gradient_clip_algorithm: str | None,
    precision_name: str,
) -> tuple[dict[str, Any], str | None]:
    """``config`` with every ``"auto"`` or missing Trainer-known entry filled; also the half-precision section in use.

    Returns ``(config, "fp16" | "bf16" | None)``. Values the user wrote are kept, except where they
    contradict what the Trainer does (gradient accumulation, the precision), which is an error.
    """
    out = copy.deepcopy(dict(config))
    # the micro batch: DeepSpeed derives it itself when only train_batch_size is given
    if out.get("train_micro_batch_size_per_gpu", AUTO) == AUTO and "train_batch_size" not in out:
        out["train_micro_batch_size_per_gpu"] = micro_batch_size
    elif out.get("train_micro_batch_size_per_gpu") == AUTO:
        del out["train_micro_batch_size_per_gpu"]
    if out.get("train_batch_size") == AUTO:
        del out["train_batch_size"]

    gas = out.get("gradient_accumulation_steps", AUTO)
    if gas == AUTO:
        out["gradient_accumulation_steps"] = accumulate_grad_batches
    elif gas != accumulate_grad_batches:
        raise ConfigurationError(
            f"The DeepSpeed config says gradient_accumulation_steps={gas!r} but the Trainer accumulates "
            f"{accumulate_grad_batches} batch(es) per step (accumulate_grad_batches). The Trainer decides when "
            "gradients are accumulated: set accumulate_grad_batches, and leave the config's value out or 'auto'."
        )

    clip = out.get("gradient_clipping", AUTO)
    if clip == AUTO:
        if gradient_clip_val and (gradient_clip_algorithm or "norm") != "norm":
            raise ConfigurationError(
                f"gradient_clip_algorithm={gradient_clip_algorithm!r}: DeepSpeed clips gradients by their norm only, "
                "inside its optimizer step. Use gradient_clip_algorithm='norm' (the default) with DeepSpeed."
            )
        out["gradient_clipping"] = float(gradient_clip_val or 0.0)

    wanted = precision_section(precision_name)
    explicit = [s for s in ("fp16", "bf16") if _enabled(out.get(s)) is True]
    if len(explicit) > 1:
        raise ConfigurationError(
            "The DeepSpeed config enables both fp16 and bf16; enable one of them (or leave both 'auto' and set the "
            "Trainer's precision)."
        )
    if explicit and wanted is not None and explicit[0] != wanted:
        raise ConfigurationError(
            f"The DeepSpeed config enables {explicit[0]} but the Trainer's precision is {precision_name!r}, which "
            f"needs {wanted}. Say it once: set the precision on the Trainer and leave 'enabled' out or 'auto'."
        )
    # a 16-bit mode enabled in the config counts even when the Trainer runs its default 32-true
    half = explicit[0] if explicit else wanted
    for section in ("fp16", "bf16"):
        value = out.get(section)
        if isinstance(value, Mapping) and value.get("enabled", AUTO) == AUTO:
            value = dict(value)
            value["enabled"] = section == half
            out[section] = value
        elif value is None and section == half:
            out[section] = {"enabled": True}
    return out, half


def _elements(value: object, default: int) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def memory_model(config: Mapping[str, Any], world_size: int, precision_name: str = "32-true",
                 module: Any = None) -> MemoryModel:
    """The ranks' shares of the model states that ``config``'s ZeRO stage sets, and its buffers (from the config).

    Stage 1 shards the optimizer states and the fp32 master partition, 2 also the gradients, 3 also the parameters;
    every stage keeps that fp32 partition as a copy of its own (measured: also stage 3 in fp32). Stages 2-3 hold this
    rank's contiguous gradient partition through the backward. The buffers are the config's reduce bucket, twice in
    stages 1-2 with ``overlap_comm`` (DeepSpeed's double buffer; the all-gather bucket and stage 3's prefetch bucket
    are limits, not allocations), in elements of the gradients' dtype. Stage 3 holds parameters whole in forward and
    backward beside their partitions: those of ``module`` under ``stage3_param_persistence_threshold`` elements,
    and of the others up to ``stage3_max_live_parameters`` (with the default reuse distance a fetched parameter stays
    until its backward). Under fp16/bf16 (the config's or ``precision_name``'s) the module's parameters and gradients
    are 2-byte, the master partition and the optimizer states fp32.
    """
    stage = zero_stage(config)
    zero = config.get("zero_optimization") or {}
    if stage == 0:
        return MemoryModel(note="deepspeed without ZeRO: every rank holds every model state")
    reduce = _elements(zero.get("reduce_bucket_size"), 500_000_000)
    buckets = 0 if zero.get("contiguous_gradients", True) is False else (
        2 if stage < 3 and zero.get("overlap_comm") is True else 1)
    gathered = 0
    if stage == 3 and module is not None:
        threshold = _elements(zero.get("stage3_param_persistence_threshold"), 100_000)
        sizes = [p.numel() for p in module.parameters()]
        persistent = sum(n for n in sizes if n < threshold)
        gathered = persistent + min(sum(sizes) - persistent,
                                    _elements(zero.get("stage3_max_live_parameters"), 1_000_000_000))
    explicit = [section for section in ("fp16", "bf16") if _enabled(config.get(section)) is True]
    half = explicit[0] if explicit else precision_section(precision_name)
    offload_states = (zero.get("offload_optimizer") or {}).get("device", "none") not in ("none", None)
    offload_params = stage == 3 and (zero.get("offload_param") or {}).get("device", "none") not in ("none", None)
    return MemoryModel(
        param_shards=world_size if stage == 3 else 1, grad_shards=world_size if stage >= 2 else 1,
        state_shards=world_size,
        offload=frozenset((["grads", "states"] if offload_states else []) + (["params"] if offload_params else [])),
        buffer_elements=buckets * reduce, master_copy=True, param_itemsize=2 if half else 0,
        half_dtype=None if half is None else torch.float16 if half == "fp16" else torch.bfloat16,
        gradients_held_in_backward=stage >= 2 and not offload_states, gathered_elements=gathered,
        note="DeepSpeed's buffers are sized from its config (its reduce bucket)"
             + ("; stage 3's live parameters from its persistence threshold and max live parameters" if stage == 3
                else ""))
