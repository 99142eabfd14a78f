"""BackboneFinetuning / BaseFinetuning: a frozen backbone joins the optimizer at its epoch with Lightning's learning
rates; the same program gives Lightning's weights and learning rates bitwise (where the reference Lightning is
installed), a resumed run equals the uninterrupted one, and the LearningRateMonitor follows the added group."""

from __future__ import annotations

import contextlib
import json
import textwrap

import pytest
import torch

from tests.lightning_reference import needs_lightning, run_in_lightning
from torchfleet import Trainer
from torchfleet.callbacks import BackboneFinetuning, BaseFinetuning
from torchfleet.errors import ConfigurationError

#: the same text under either library, after its own import lines: the model, a callback and a run ...
MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Classifier(BoringModel):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.ReLU())
            self.layer = nn.Linear(16, 2)

        def forward(self, x):
            return self.layer(self.backbone(x))

        def train_dataloader(self):
            return torch.utils.data.DataLoader(RandomDataset(32, 32), batch_size=4)

        def configure_optimizers(self):
            opt = torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1, momentum=0.9)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)]

    class Lrs(Callback):
        def __init__(self):
            self.seen = []

        def on_train_epoch_start(self, trainer, pl_module):  # after BackboneFinetuning's, which comes first
            self.seen.append([g["lr"] for g in trainer.optimizers[0].param_groups])

    def run(root, max_epochs=5, ckpt_path=None, **finetuning):
        seed_everything(7)
        model, lrs = Classifier(), Lrs()
        trainer = Trainer(max_epochs=max_epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=root, num_sanity_val_steps=0,
                          limit_val_batches=0,
                          callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=2, **finetuning), lrs,
                                     ModelCheckpoint(dirpath=root, save_top_k=-1, filename="{epoch}")])
        trainer.fit(model, ckpt_path=ckpt_path)
        return model, lrs.seen
""")
#: ... and one run of it
PROGRAM = MODEL + textwrap.dedent("""
    ROOT = tempfile.mkdtemp()
    model, seen = run(ROOT)
    results = {"lrs": seen, "weights": {k: v.tolist() for k, v in model.state_dict().items()}}
""")
TORCHFLEET = ("import tempfile\nfrom torchfleet import Trainer, seed_everything\nfrom torchfleet.callbacks import "
              "BackboneFinetuning, Callback, ModelCheckpoint\nfrom torchfleet.demos.boring_classes import BoringModel, "
              "RandomDataset\n")
LIGHTNING = ("import tempfile\nfrom lightning.pytorch import Trainer, seed_everything\nfrom lightning.pytorch.callbacks "
             "import BackboneFinetuning, Callback, ModelCheckpoint\nfrom lightning.pytorch.demos.boring_classes import "
             "BoringModel, RandomDataset\n")


@contextlib.contextmanager
def one_thread():
    """One intra-op thread, as the Lightning run gets: BatchNorm's reductions then add in the same order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ours() -> dict:
    namespace: dict = {}
    with one_thread():
        exec(compile(TORCHFLEET + PROGRAM, "finetuning_program", "exec"), namespace)
    return namespace


def test_backbone_joins_the_optimizer_at_its_epoch(ours):
    lrs = ours["results"]["lrs"]
    # epochs 0-1: one group (the head), StepLR 0.7 a step; epoch 2: the backbone joins at 0.1 of the head's rate;
    # later epochs: the backbone's rate doubles (lambda_func), capped at the head's (should_align)
    assert [len(g) for g in lrs] == [1, 1, 2, 2, 2]
    head = [0.1 * 0.7 ** e for e in range(5)]
    assert [g[0] for g in lrs] == pytest.approx(head)
    assert lrs[2][1] == pytest.approx(head[2] * 0.1)
    assert lrs[3][1] == pytest.approx(min(2 * lrs[2][1], head[3]))
    assert lrs[4][1] == pytest.approx(min(2 * lrs[3][1], head[4]))
    model = ours["model"]
    assert all(p.requires_grad for p in model.backbone.parameters())


def test_a_resumed_run_equals_the_uninterrupted_one(ours, tmp_path):
    run, root = ours["run"], ours["ROOT"]
    # from the checkpoint after epoch 2, where the backbone had joined: its group and momentum come back
    with one_thread():
        resumed, seen = run(str(tmp_path), ckpt_path=f"{root}/epoch=2.ckpt")
    assert seen == ours["results"]["lrs"][3:]
    for name, value in ours["model"].state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name


@needs_lightning
def test_weights_and_rates_equal_lightnings(ours):
    out = run_in_lightning(LIGHTNING + PROGRAM + "\nimport json\nprint('RESULTS', json.dumps(results))\n")
    theirs = json.loads(out.split("RESULTS ", 1)[1])
    assert ours["results"]["lrs"] == theirs["lrs"]
    assert json.loads(json.dumps(ours["results"]["weights"])) == theirs["weights"]


def test_a_model_without_backbone_is_refused_in_one_paragraph():
    from torchfleet.demos.boring_classes import BoringModel

    trainer = Trainer(accelerator="cpu", max_epochs=1, logger=False, callbacks=[BackboneFinetuning()],
                      enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(ConfigurationError, match="should have a nn.Module `backbone` attribute"):
        trainer.fit(BoringModel())


def test_unfreezing_parameters_the_optimizer_has_warns_and_skips_them():
    layer = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    BaseFinetuning.freeze(layer)
    assert not any(p.requires_grad for p in layer.parameters())
    with pytest.warns(UserWarning, match="already in SGD's parameter groups"):
        BaseFinetuning.unfreeze_and_add_param_group(layer, opt)
    assert len(opt.param_groups) == 1 and all(p.requires_grad for p in layer.parameters())
    other = torch.nn.Linear(3, 3)
    BaseFinetuning.unfreeze_and_add_param_group(other, opt, initial_denom_lr=4.0)
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["lr"] == 0.25


def test_learning_rate_monitor_follows_the_added_group(tmp_path):
    from torchfleet.callbacks import LearningRateMonitor
    from torchfleet.loggers import CSVLogger

    monitor = LearningRateMonitor(logging_interval="epoch")
    namespace: dict = {}
    exec(compile(TORCHFLEET + MODEL, "finetuning_model", "exec"), namespace)
    model = namespace["Classifier"]()
    trainer = Trainer(accelerator="cpu", max_epochs=4, logger=CSVLogger(tmp_path), enable_progress_bar=False,
                      enable_checkpointing=False, limit_val_batches=0,
                      callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=2), monitor])
    trainer.fit(model)
    # "lr-SGD" becomes "lr-SGD/pg1" (its history kept) when the backbone's group "lr-SGD/pg2" joins, as Lightning
    assert list(monitor.lrs) == ["lr-SGD/pg1", "lr-SGD/pg2"]
    assert monitor.lrs["lr-SGD/pg1"] == pytest.approx([0.1 * 0.7 ** e for e in range(4)])
    assert len(monitor.lrs["lr-SGD/pg2"]) == 2
    # the latest values are callback metrics too (EarlyStopping or ModelCheckpoint may monitor them)
    assert float(trainer.callback_metrics["lr-SGD/pg2"]) == pytest.approx(monitor.lrs["lr-SGD/pg2"][-1])
