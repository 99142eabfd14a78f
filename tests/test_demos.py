"""The demos under Lightning's names have Lightning's API: the same programs give Lightning's results bitwise
(tests/demo_programs.py under both libraries), and each demo trains here (its result checked by a plain
evaluation)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from tests.helpers import quiet
from tests.lightning_reference import LIGHTNING_PYTHON, needs_lightning
from torchfleet import Trainer
from torchfleet.demos import (
    MNIST,
    BoringModel,
    LightningTransformer,
    MNISTClassifier,
    MNISTDataModule,
    SequenceSampler,
    Transformer,
    WikiText2,
)
from torchfleet.demos.boring_classes import (
    BoringDataModule,
    IterableBoringDataModule,
    ManualOptimBoringModel,
    RandomIterableDataset,
)

PROGRAMS = os.path.join(os.path.dirname(__file__), "demo_programs.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@needs_lightning
def test_demo_programs_give_lightnings_results_bitwise(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_GLOBAL_SEED", "PL_GLOBAL_SEED")}
    procs = {}
    for lib, python in (("lightning", LIGHTNING_PYTHON), ("torchfleet", sys.executable)):  # the two run at once
        run_env = dict(env, OMP_NUM_THREADS="1")
        if lib == "lightning":
            run_env.pop("PYTHONPATH", None)
        else:
            run_env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
        procs[lib] = subprocess.Popen([python, PROGRAMS, lib, str(tmp_path / f"{lib}.pt")], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=run_env, cwd=tmp_path)
    results = {}
    for lib, proc in procs.items():
        try:
            _, stderr = proc.communicate(timeout=300)
        finally:
            proc.kill()
        assert proc.returncode == 0, stderr[-4000:]
        results[lib] = torch.load(tmp_path / f"{lib}.pt")
    ours, theirs = results["torchfleet"], results["lightning"]
    assert ours.keys() == theirs.keys() and len(ours) == 10
    for name, want in theirs.items():
        got = ours[name]
        if isinstance(want, dict):
            assert got.keys() == want.keys(), name  # the same submodule names: checkpoints load both ways
            assert all(torch.equal(got[k], want[k]) for k in want), name
        else:
            assert torch.equal(got, want), name


def test_transformer_returns_flattened_log_probabilities_for_nll_loss():
    model = Transformer(vocab_size=11, ninp=8, nhead=2, nhid=16, nlayers=1)
    inputs, target = torch.randint(11, (3, 5)), torch.randint(11, (3, 5))
    out = model(inputs, target)
    assert out.shape == (3 * 5, 11)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(15))
    assert F.nll_loss(out, target.view(-1)).item() > 0
    assert [name for name, _ in model.named_children()] == ["pos_encoder", "embedding", "transformer", "decoder"]


def test_wikitext2_has_lightnings_interface_and_size():
    data = WikiText2(block_size=35)
    assert len(data) == 2_088_628 // 35 - 1  # as Lightning's over WikiText-2's training text
    inputs, target = data[3]
    assert inputs.shape == target.shape == (35,) and torch.equal(inputs[1:], target[:-1])
    assert data.vocab_size == len(data.dictionary.idx2word) == len(data.dictionary)
    assert data.dictionary.word2idx["<eos>"] == data.dictionary.idx2word.index("<eos>")
    assert int(data.data.max()) < data.vocab_size and str(data.path).endswith("wikitext-2.txt")
    # the transformer example's split: n - 4000 / 2000 / 2000
    train, val, test = torch.utils.data.random_split(data, [len(data) - 4000, 2000, 2000])
    assert len(train) > 50_000


def test_lightning_transformer_learns_the_generated_corpus():
    torch.manual_seed(0)
    data = torch.utils.data.Subset(WikiText2(block_size=12), range(64))
    model = LightningTransformer(vocab_size=26)  # the generated corpus's vocabulary
    inputs, target = next(iter(DataLoader(data, batch_size=64)))
    model.eval()
    with torch.no_grad():
        before = F.nll_loss(model(inputs, target), target.view(-1)).item()
    Trainer(max_epochs=3, **quiet()).fit(model, DataLoader(data, batch_size=8, shuffle=True))
    model.eval()
    with torch.no_grad():
        after = F.nll_loss(model(inputs, target), target.view(-1)).item()
    assert before == pytest.approx(math.log(26), rel=0.5) and after < 0.5 * before


def test_sequence_sampler_continues_each_row():
    batches = list(SequenceSampler(range(10), batch_size=3))
    assert batches == [[0, 3, 6], [1, 4, 7], [2, 5, 8]] and len(SequenceSampler(range(10), 3)) == 3


def test_boring_model_trains_and_every_stage_runs():
    torch.manual_seed(0)
    model = BoringModel()
    start = model.layer.weight.detach().clone()
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(model)
    assert trainer.global_step == 2 * 64 and not torch.equal(start, model.layer.weight)
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0] == pytest.approx(0.1 * 0.1**2)
    preds = trainer.predict(model)
    assert len(preds) == 64 and preds[0].shape == (1, 2)  # Lightning's loaders: batches of one
    trainer.test(model, datamodule=BoringDataModule())
    assert len(list(RandomIterableDataset(4, 5))) == 5


def test_manual_optim_boring_model():
    torch.manual_seed(0)
    model = ManualOptimBoringModel()
    start = model.layer.weight.detach().clone()
    trainer = Trainer(max_epochs=1, limit_train_batches=4, **quiet())
    trainer.fit(model)
    assert trainer.global_step == 4 and not torch.equal(start, model.layer.weight)


def test_iterable_datamodule_trains_on_both_loaders_together():
    class Pair(BoringModel):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)
            self.seen = 0

        def training_step(self, batch, batch_idx):
            mapped, streamed = batch  # one batch of each loader per step
            self.seen += 1
            return self.step(torch.cat([mapped, streamed]))

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            return super().validation_step(batch, batch_idx)

    model = Pair()
    Trainer(max_epochs=1, **quiet()).fit(model, datamodule=IterableBoringDataModule())
    assert model.seen == 16  # both have 16 items: max_size_cycle ends with them


def test_mnist_demo_learns_the_generated_digits():
    torch.manual_seed(0)
    model = MNISTClassifier(hidden=32, lr=3e-3)
    dm = MNISTDataModule(val_split=200, batch_size=64, train_size=2000, test_size=300)
    assert dm.num_classes == 10 and dm.name == "mnist"
    Trainer(max_epochs=2, **quiet()).fit(model, datamodule=dm)
    test = MNIST(train=False, length=300)
    images = torch.stack([test[i][0] for i in range(len(test))])
    assert images.shape == (300, 1, 28, 28) and 0.0 <= images.min() and images.max() <= 1.0
    with torch.no_grad():
        accuracy = (model(images).argmax(-1) == test.targets).float().mean().item()
    assert accuracy > 0.8  # chance is 0.1
