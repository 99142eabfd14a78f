"""The DeepSpeed config behind DeepSpeedStrategy: built from its arguments or given by the user, then completed.

Three steps, each a function here so it can be tested without processes:

1. ``default_config``: the constructor arguments (Lightning's DeepSpeedStrategy parameters) mapped onto
   DeepSpeed's config keys. Values the Trainer knows are left as ``"auto"``.
2. ``user_config``: a config the user passes (a dict, or the path of a JSON file) replaces that
   default entirely; DeepSpeed's own defaults then apply to whatever it leaves out.
3. ``fill_auto``: at setup, every ``"auto"`` (or missing) batch size, accumulation, clipping and
   precision entry is filled from the Trainer, so the dict handed to ``deepspeed.initialize`` holds
   no ``"auto"`` at all. ``check_config`` validates the result before DeepSpeed sees it.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from typing import Any

from torchfleet.errors import ConfigurationError

AUTO = "auto"
OFFLOAD_DEVICES = ("cpu", "nvme")
STAGES = (0, 1, 2, 3)
INSTALL_HINT = 'pip install "torchfleet[deepspeed]"'

#: precision name -> the DeepSpeed section that runs it ("32-true": neither)
_HALF_SECTIONS = {"16-mixed": "fp16", "16-true": "fp16", "bf16-mixed": "bf16", "bf16-true": "bf16"}


def default_config(
    *,
    zero_optimization: bool,
    stage: int,
    offload_optimizer: bool,
    offload_parameters: bool,
    offload_params_device: str,
    offload_optimizer_device: str,
    nvme_path: str,
    params_buffer_count: int,
    params_buffer_size: int,
    max_in_cpu: int,
    optimizer_buffer_count: int,
    block_size: int,
    queue_depth: int,
    single_submit: bool,
    overlap_events: bool,
    thread_count: int,
    pin_memory: bool,
    sub_group_size: int,
    contiguous_gradients: bool,
    overlap_comm: bool,
    allgather_partitions: bool,
    reduce_scatter: bool,
    allgather_bucket_size: int,
    reduce_bucket_size: int,
    zero_allow_untested_optimizer: bool,
    logging_batch_size_per_gpu: int | str,
    loss_scale: float,
    initial_scale_power: int,
    loss_scale_window: int,
    hysteresis: int,
    min_loss_scale: int,
    partition_activations: bool,
    cpu_checkpointing: bool,
    contiguous_memory_optimization: bool,
    synchronize_checkpoint_boundary: bool,
) -> dict[str, Any]:
    """The DeepSpeed config that DeepSpeedStrategy's arguments describe (Trainer-known values left ``"auto"``)."""
    check_stage(stage)
    for name, device in (("offload_optimizer_device", offload_optimizer_device),
                         ("offload_params_device", offload_params_device)):
        if device not in OFFLOAD_DEVICES:
            raise ConfigurationError(
                f"{name}={device!r} is not a place DeepSpeed can offload to. Accepted: 'cpu' (host memory) and "
                "'nvme' (files under nvme_path)."
            )
    if offload_parameters and stage != 3:
        raise ConfigurationError(
            f"offload_parameters=True needs stage=3 (only ZeRO stage 3 partitions the parameters themselves), but "
            f"stage={stage}. Use stage=3, or offload_optimizer=True alone, which works with stages 1 to 3."
        )
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": logging_batch_size_per_gpu,
        "gradient_accumulation_steps": AUTO,
        "gradient_clipping": AUTO,
        "zero_allow_untested_optimizer": zero_allow_untested_optimizer,
        # DeepSpeed refuses a torch optimizer together with offloading unless told otherwise; letting it run
        # keeps configure_optimizers() unchanged (DeepSpeedCPUAdam is faster but compiles a C++ op first)
        "zero_force_ds_cpu_optimizer": False,
        "fp16": {
            "enabled": AUTO,
            "loss_scale": loss_scale,
            "initial_scale_power": initial_scale_power,
            "loss_scale_window": loss_scale_window,
            "hysteresis": hysteresis,
            "min_loss_scale": min_loss_scale,
        },
        "bf16": {"enabled": AUTO},
        "aio": {
            "block_size": block_size,
            "queue_depth": queue_depth,
            "single_submit": single_submit,
            "overlap_events": overlap_events,
            "thread_count": thread_count,
        },
        "activation_checkpointing": {
            "partition_activations": partition_activations,
            "cpu_checkpointing": cpu_checkpointing,
            "contiguous_memory_optimization": contiguous_memory_optimization,
            "synchronize_checkpoint_boundary": synchronize_checkpoint_boundary,
        },
    }
    if zero_optimization:
        zero: dict[str, Any] = {
            "stage": stage,
            "contiguous_gradients": contiguous_gradients,
            "overlap_comm": overlap_comm,
            "allgather_partitions": allgather_partitions,
            "reduce_scatter": reduce_scatter,
            "allgather_bucket_size": allgather_bucket_size,
            "reduce_bucket_size": reduce_bucket_size,
            "sub_group_size": sub_group_size,
        }
        if offload_optimizer:
            zero["offload_optimizer"] = {
                "device": offload_optimizer_device,
                "nvme_path": nvme_path,
                "buffer_count": optimizer_buffer_count,
                "pin_memory": pin_memory,
            }
        if offload_parameters:
            zero["offload_param"] = {
                "device": offload_params_device,
                "nvme_path": nvme_path,
                "buffer_count": params_buffer_count,
                "buffer_size": params_buffer_size,
                "max_in_cpu": max_in_cpu,
                "pin_memory": pin_memory,
            }
        config["zero_optimization"] = zero
    elif offload_optimizer or offload_parameters:
        raise ConfigurationError(
            "offload_optimizer/offload_parameters were given with zero_optimization=False, but offloading is part "
            "of ZeRO. Set zero_optimization=True (the default) with a stage, or drop the offload arguments."
        )
    return config


def check_stage(stage: Any) -> None:
    """ConfigurationError unless ``stage`` is one of ZeRO's stages 0-3."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise ConfigurationError(
            f"stage={stage!r} is not a ZeRO stage. Accepted: 0 (no partitioning: plain data parallel), 1 (optimizer "
            "state partitioned), 2 (optimizer state and gradients), 3 (optimizer state, gradients and parameters)."
        )


def user_config(config: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
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
