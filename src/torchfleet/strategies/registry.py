"""StrategyRegistry: strategy names -> (class, init kwargs, description)."""

from __future__ import annotations

from torchfleet._registry import Registry
from torchfleet.strategies.dp import DataParallelStrategy
from torchfleet.strategies.single_device import SingleDeviceStrategy
from torchfleet.strategies.strategy import Strategy


class _StrategyRegistry(Registry[Strategy]):
    """Strategy names -> (class, init kwargs, description)."""

    def available_strategies(self) -> list[str]:
        """Registered strategy names, sorted."""
        return self.available()


#: The registry behind ``Trainer(strategy="name")``. Packages add entries through the
#: ``torchfleet.strategies`` entry-point group.
StrategyRegistry = _StrategyRegistry("strategy", "torchfleet.strategies", base=Strategy)

StrategyRegistry.register(
    "single_device", SingleDeviceStrategy, description="Train in one process on one device (CPU, one GPU or MPS)."
)
StrategyRegistry.register(
    "dp", DataParallelStrategy,
    description="torch.nn.DataParallel: one process splits each batch across several CUDA GPUs of one machine.",
)


def _register_ddp() -> None:
    from torchfleet.strategies.ddp import DDPStrategy

    launches = (
        ("ddp", "popen", "DistributedDataParallel; re-runs the script for each local rank."),
        ("ddp_spawn", "spawn", "DistributedDataParallel in processes started with spawn (everything is pickled)."),
        ("ddp_fork", "fork",
         "DistributedDataParallel in forked processes: works from notebooks and the Python prompt."),
        ("ddp_notebook", "fork", "Same as ddp_fork."),
    )
    for name, start_method, description in launches:
        StrategyRegistry.register(name, DDPStrategy, start_method=start_method, description=description)
        # Lightning registers every launch combined with both find_unused_parameters values; a ported
        # program's string must keep working, and False is an explicit choice (manual optimisation would
        # otherwise turn the search on)
        for value, what in ((True, "for models whose forward leaves some parameters without gradients"),
                            (False, "with the search for unused parameters off, even under manual optimisation")):
            StrategyRegistry.register(
                f"{name}_find_unused_parameters_{str(value).lower()}", DDPStrategy, start_method=start_method,
                find_unused_parameters=value, description=f"{name} {what}.")


_register_ddp()


def _register_fsdp() -> None:
    from torchfleet.strategies.fsdp import FSDPStrategy

    StrategyRegistry.register(
        "fsdp", FSDPStrategy,
        description="FSDP2 (fully_shard): parameters, gradients and optimizer state sharded across processes.")
    StrategyRegistry.register(
        "fsdp_cpu_offload", FSDPStrategy, cpu_offload=True,
        description="fsdp with the sharded parameters, gradients and optimizer step kept in CPU memory.")


_register_fsdp()


def _register_model_parallel() -> None:
    from torchfleet.strategies.model_parallel import ModelParallelStrategy

    StrategyRegistry.register(
        "model_parallel", ModelParallelStrategy,
        description="Tensor parallel + FSDP2 on a 2-D device mesh; the Module parallelises itself in configure_model().")


_register_model_parallel()


def _register_deepspeed() -> None:
    # the class imports deepspeed only when built, so the names exist (and explain how to install it) without it
    from torchfleet.strategies.deepspeed import DeepSpeedStrategy

    offload_all = {"offload_optimizer": True, "offload_parameters": True}
    for name, kwargs, description in (
        ("deepspeed", {}, "DeepSpeed with its default ZeRO stage 2 (optimizer state and gradients partitioned)."),
        ("deepspeed_stage_1", {"stage": 1}, "DeepSpeed ZeRO stage 1: optimizer state partitioned across processes."),
        ("deepspeed_stage_1_offload", {"stage": 1, "offload_optimizer": True},
         "DeepSpeed ZeRO stage 1 with the optimizer state and step offloaded to CPU memory."),
        ("deepspeed_stage_2", {"stage": 2}, "DeepSpeed ZeRO stage 2: optimizer state and gradients partitioned."),
        ("deepspeed_stage_2_offload", {"stage": 2, "offload_optimizer": True},
         "DeepSpeed ZeRO stage 2 with the optimizer state and step offloaded to CPU memory."),
        ("deepspeed_stage_3", {"stage": 3}, "DeepSpeed ZeRO stage 3: optimizer state, gradients and parameters partitioned."),
        ("deepspeed_stage_3_offload", {"stage": 3, **offload_all},
         "DeepSpeed ZeRO stage 3 with parameters and optimizer state offloaded to CPU memory."),
        ("deepspeed_stage_3_offload_nvme", {"stage": 3, **offload_all, "remote_device": "nvme",
                                            "offload_params_device": "nvme", "offload_optimizer_device": "nvme"},
         "DeepSpeed ZeRO stage 3 with parameters and optimizer state offloaded to NVMe files under nvme_path."),
    ):
        StrategyRegistry.register(name, DeepSpeedStrategy, description=description, **kwargs)


_register_deepspeed()


def _register_xla() -> None:
    # the class imports torch_xla only when it sets up; without it, building one explains how to install it
    from torchfleet.strategies.xla import XLAStrategy

    StrategyRegistry.register(
        "xla", XLAStrategy,
        description="XLA devices (TPUs), one replica per device started by torch_xla (as Lightning's 'xla').")
    StrategyRegistry.register("xla_debug", XLAStrategy, debug=True, description="xla with PT_XLA_DEBUG=1.")
    StrategyRegistry.register(
        "xla_spmd", XLAStrategy, mode="spmd",
        description="XLA SPMD data parallel: one process, each batch sharded over a mesh of every XLA device.")


_register_xla()
