"""Write the public attribute and method names of Lightning's LightningModule, LightningDataModule, Trainer and
Fabric (class and instance attributes) as JSON: the list tests/test_lightning_names.py compares torchfleet with.

Regenerate it with the reference Lightning: ``/work/venv-lightning/bin/python tests/lightning_names.py >
tests/lightning_names.json`` (the test says so when the committed list differs from the installed Lightning's).
"""

from __future__ import annotations

import json
import logging


def public_names() -> dict[str, object]:
    import lightning
    import lightning.pytorch as pl
    from lightning.fabric import Fabric

    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    objects = {"LightningModule": pl.LightningModule(), "LightningDataModule": pl.LightningDataModule(),
               "Trainer": pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False),
               "Fabric": Fabric(accelerator="cpu", devices=1)}
    names: dict[str, object] = {"lightning": lightning.__version__}
    for key, obj in objects.items():
        names[key] = sorted(n for n in set(dir(type(obj))) | set(vars(obj)) if not n.startswith("_"))
    return names


if __name__ == "__main__":
    print(json.dumps(public_names(), indent=1))
