"""strategy="auto" that looks at the model: at fit start, before any process starts, the Trainer asks the planner
whether plain data parallel fits one device's memory, and otherwise takes the first of fsdp -> fsdp + activation
checkpointing -> fsdp_cpu_offload that does (planner/choose.py), saying so in one line with the numbers.

Only when the user asked for "auto" with several devices, the script is re-run per rank (ddp's launch) and the
device's memory is known (CUDA); otherwise nothing is estimated and the Trainer's strategy stays as resolved.
"""

from __future__ import annotations

from typing import Any


def choose_at_fit(trainer: Any, model: Any, train_dataloaders: Any, datamodule: Any) -> None:
    """Replace ``trainer.strategy`` by the first strategy that fits, when ``strategy="auto"`` and ddp would not."""
    from torchfleet.accelerators.base import accelerator_name
    from torchfleet.connector import resolve
    from torchfleet.planner.choose import choose_auto, device_memory
    from torchfleet.planner.estimate import first_batch
    from torchfleet.rank_zero import rank_zero_info, rank_zero_warn

    request, strategy = trainer._auto_request, trainer.strategy
    if request is None or trainer.num_devices * trainer.num_nodes == 1 or getattr(strategy, "start_method", None) != "popen":
        return  # one device, or a notebook's fork: today's choice
    capacity = device_memory(accelerator_name(strategy.accelerator), getattr(strategy.root_device, "index", None) or 0)
    if capacity is None:
        return
    try:
        batch = first_batch(model, train_dataloaders, datamodule)
        choice = choose_auto(model, batch, devices=trainer.num_devices, num_nodes=trainer.num_nodes,
                             precision=strategy.precision.name, capacity=capacity, trainer=trainer)
    except Exception as error:  # a model the fake-tensor trace cannot run still trains, under today's choice
        rank_zero_info(f"strategy='auto' kept {type(strategy).__name__}: the memory estimate failed "
                       f"({type(error).__name__}: {error}); `torchfleet estimate` shows the same error.")
        return
    if choice.build is None:
        if choice.fits is False:
            rank_zero_warn(choice.line)
        return
    rank_zero_info(choice.line)
    trainer.strategy = resolve(strategy=choice.build(), **request)
