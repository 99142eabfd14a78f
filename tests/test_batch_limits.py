"""A batch limit reads no batch past it: a dataset that draws random numbers in ``__getitem__`` (an augmentation)
leaves the generators as Lightning leaves them, so the next epoch and the rest of the program see the same numbers.

The program runs in this process under torchfleet; where the reference Lightning is installed the same text runs
under it and must give the same reads, weights and next random number, bitwise.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from tests.lightning_reference import needs_lightning, run_in_lightning

BATCH = 4
TRAIN_LIMIT, VAL_LIMIT, TEST_LIMIT, EPOCHS = 3, 2, 1, 2

#: the same text under either library, after its own import line
PROGRAM = textwrap.dedent(f"""
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    class Augmented(Dataset):
        def __init__(self):
            self.reads = 0
        def __len__(self):
            return 40
        def __getitem__(self, index):
            self.reads += 1
            return torch.full((3,), float(index)) + torch.rand(3)  # a random augmentation

    class Stream(IterableDataset):  # no length: the loop cannot know the last batch before reading
        def __init__(self):
            self.reads = 0
        def __iter__(self):
            for index in range(40):
                self.reads += 1
                yield torch.full((3,), float(index)) + torch.rand(3)

    class Net(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)
        def training_step(self, batch, batch_idx):
            return self.layer(batch).pow(2).mean()
        def validation_step(self, batch, batch_idx):
            self.log("val", self.layer(batch).mean())
        def test_step(self, batch, batch_idx):
            self.log("test", self.layer(batch).mean())
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def run(train_class):
        seed_everything(0)
        train, val, test = train_class(), Augmented(), Augmented()
        model = Net()
        trainer = Trainer(accelerator="cpu", max_epochs={EPOCHS}, limit_train_batches={TRAIN_LIMIT},
                          limit_val_batches={VAL_LIMIT}, limit_test_batches={TEST_LIMIT}, num_sanity_val_steps=0,
                          logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False)
        trainer.fit(model, DataLoader(train, batch_size={BATCH}), DataLoader(val, batch_size={BATCH}))
        trainer.test(model, DataLoader(test, batch_size={BATCH}), verbose=False)
        return {{"reads": [train.reads, val.reads, test.reads], "next": torch.rand(1),
                 "weight": model.layer.weight.detach().clone()}}

    results = {{"sized": run(Augmented), "unsized": run(Stream)}}
""")
TORCHFLEET = "from torchfleet import Module as LightningModule, Trainer, seed_everything\n"
LIGHTNING = "from lightning.pytorch import LightningModule, Trainer, seed_everything\n"


@pytest.fixture(scope="module")
def ours() -> dict:
    namespace: dict = {}
    exec(compile(TORCHFLEET + PROGRAM, "batch_limits_program", "exec"), namespace)
    return namespace["results"]


@pytest.mark.parametrize("kind", ["sized", "unsized"])
def test_no_batch_is_read_past_a_limit(ours, kind):
    # every epoch reads exactly its limited batches: training and validation each epoch, test once
    assert ours[kind]["reads"] == [EPOCHS * TRAIN_LIMIT * BATCH, EPOCHS * VAL_LIMIT * BATCH, TEST_LIMIT * BATCH]


@needs_lightning
def test_reads_weights_and_generators_equal_lightnings(ours, tmp_path):
    out = tmp_path / "lightning.pt"
    run_in_lightning(LIGHTNING + PROGRAM + f"\ntorch.save(results, {str(out)!r})\n")
    theirs = torch.load(out, weights_only=True)
    for kind in ("sized", "unsized"):
        assert ours[kind]["reads"] == theirs[kind]["reads"], kind
        assert torch.equal(ours[kind]["next"], theirs[kind]["next"]), kind
        assert torch.equal(ours[kind]["weight"], theirs[kind]["weight"]), kind
