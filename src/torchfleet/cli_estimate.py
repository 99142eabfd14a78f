"""``torchfleet estimate`` and ``torchfleet strategies --explain``: memory per rank before anything is launched.

    torchfleet estimate --trainer.devices=8 --device-memory 80GiB        # the bundled example
    torchfleet estimate --config run.yaml --trainer.num_nodes=4           # your run's config, as `fit` reads it
    torchfleet strategies --explain --config run.yaml                     # what strategy="auto" would choose

Both take ``fit``'s options (the same parser builds the Trainer, the model and the data; nothing is trained) and
``--device-memory SIZE`` (default: the visible GPU's total memory; unknown without a GPU). The first training
batch is read from the data, and each candidate strategy is estimated on it (torchfleet.planner.choose).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchfleet.errors import ConfigurationError

_OPTION = "--device-memory"
_HELP = (f"\n{_OPTION} SIZE   one device's memory, e.g. 80GiB, 80G, 80GB (10^9 bytes), 24576MiB (default: the "
         "visible GPU's total memory; without a GPU the table has no fit verdict)\n")


def _take_device_memory(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` without ``--device-memory SIZE`` (or ``--device-memory=SIZE``), and SIZE."""
    rest, size = [], None
    items = iter(argv)
    for item in items:
        if item == _OPTION:
            size = next(items, None)
            if size is None:
                raise ConfigurationError(f"{_OPTION} needs a size, e.g. {_OPTION} 80GiB.")
        elif item.startswith(_OPTION + "="):
            size = item.split("=", 1)[1]
        else:
            rest.append(item)
    return rest, size


def estimate(command: str, argv: list[str], build: Callable[[list[str], dict[str, Any]], int]) -> int:
    """Run ``torchfleet estimate`` (``command`` "estimate") or ``torchfleet strategies --explain`` ("strategies")
    with ``argv``, the arguments after the command.

    ``build(argv, sink)`` parses ``fit``'s options and puts the built trainer, model and datamodule in ``sink``
    (the ``fit`` command's own builder; nothing runs).
    """
    from torchfleet.planner.choose import choose_auto, compare, device_memory, parse_size
    from torchfleet.planner.estimate import first_batch

    explain = command == "strategies"
    argv, size = _take_device_memory([a for a in argv if a != "--explain"] if explain else argv)
    sink: dict[str, Any] = {}
    code = build(argv, sink)
    if any(a in ("-h", "--help") for a in argv):
        print(_HELP, end="")
    if "trainer" not in sink:  # --help, --print_config or a usage error: nothing was built
        return code
    trainer, model, data = sink["trainer"], sink["model"], sink["datamodule"]
    capacity = parse_size(size) if size is not None else device_memory("cuda")
    batch = first_batch(model, None, data)
    devices, num_nodes = trainer.num_devices, trainer.num_nodes
    precision = trainer.strategy.precision.name
    if explain:
        if devices * num_nodes == 1:
            print("strategy='auto' with one device: 'single_device' (there is nothing to divide).")
            return 0
        choice = choose_auto(model, batch, devices=devices, num_nodes=num_nodes, precision=precision,
                             capacity=capacity, trainer=trainer)
        print(choice.line)
        return 0
    print(compare(model, batch, devices=devices, num_nodes=num_nodes, precision=precision, capacity=capacity,
                  trainer=trainer))
    return 0
