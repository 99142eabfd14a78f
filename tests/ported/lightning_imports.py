"""The ported programs' import lines and the Lightning lines they were ported from; the Lightning variant.

A ported program differs from its Lightning original by its import lines alone (the rest of its text names
Lightning's classes: ``LightningModule``, ``Fabric``). ``lightning_variant`` turns those lines back, line by
line, so the program Lightning runs is always the one torchfleet runs: a torchfleet import left over (a line
not in ``PORTED_IMPORTS``) is an error, not a silent difference.
"""

from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))

#: our import line -> Lightning's
PORTED_IMPORTS = {
    "from torchfleet import DataModule as LightningDataModule": "from lightning.pytorch import LightningDataModule",
    "from torchfleet import Fleet as Fabric": "from lightning.fabric import Fabric",
    "from torchfleet import Module as LightningModule": "from lightning.pytorch import LightningModule",
    "from torchfleet import Trainer, seed_everything": "from lightning.pytorch import Trainer, seed_everything",
    "from torchfleet.demos import Transformer": "from lightning.pytorch.demos import Transformer",
    "from torchfleet.loggers import CSVLogger  # noqa: E402": "from lightning.fabric.loggers import CSVLogger  # noqa: E402",
    "from torchfleet import Fleet as Fabric  # noqa: E402": "from lightning.fabric import Fabric  # noqa: E402",
}
#: the files that make up the ported programs and their runner, relative to tests/ported
FILES = ("programs.py", "programs_extra.py", "run_programs.py")


def to_lightning(source: str, name: str = "<source>") -> str:
    """``source`` with each of its torchfleet import lines replaced by the Lightning line it stands for."""
    lines = []
    for line in source.splitlines(keepends=True):
        text = line.rstrip("\n")
        if text in PORTED_IMPORTS:
            line = PORTED_IMPORTS[text] + "\n"
        elif "torchfleet" in text and (text.lstrip().startswith(("import ", "from "))):
            raise ValueError(f"{name}: no Lightning line for the import {text.strip()!r} (add it to PORTED_IMPORTS)")
        lines.append(line)
    return "".join(lines)


def lightning_variant(folder: str) -> str:
    """Write the programs with Lightning's imports under ``folder``/tests/ported; return the runner's path there."""
    target = os.path.join(folder, "tests", "ported")
    os.makedirs(target, exist_ok=True)
    for package in (os.path.join(folder, "tests"), target):
        open(os.path.join(package, "__init__.py"), "w").close()
    for name in FILES:
        with open(os.path.join(HERE, name)) as f:
            source = to_lightning(f.read(), name)
        with open(os.path.join(target, name), "w") as f:
            f.write(source)
    return os.path.join(target, "run_programs.py")
