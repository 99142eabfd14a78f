"""The torchfleet command for a new user: resuming with --ckpt_path=last, --help texts, the strategies table."""

from __future__ import annotations

import os

import pytest

from torchfleet.cli import _metric_rows, main
from torchfleet.loggers import CSVLogger

EXAMPLE_SMALL = ["--data.num_train=512", "--data.num_val=128", "--model.d_model=32", "--model.dim_feedforward=64",
                 "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
                 "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=1"]
STEPS_PER_EPOCH = 512 // 128  # AdditionData's default batch_size is 128


def test_resume_last_with_more_epochs_continues_in_the_same_version(tmp_path, capsys):
    root = f"--trainer.default_root_dir={tmp_path}"
    assert main(["fit", "--trainer.max_epochs=1", root, *EXAMPLE_SMALL]) == 0
    version = tmp_path / "logs" / "version_0"
    (first_ckpt,) = (version / "checkpoints").glob("*.ckpt")
    capsys.readouterr()
    # max_epochs grows: the OneCycleLR restored from the checkpoint was planned for one epoch only
    assert main(["fit", "--trainer.max_epochs=2", "--ckpt_path=last", root, *EXAMPLE_SMALL]) == 0
    out = capsys.readouterr().out
    assert f"Resuming from {first_ckpt}; logging on in {version}" in out
    assert f"Finished: epoch 2, step {2 * STEPS_PER_EPOCH}" in out
    assert sorted(os.listdir(tmp_path / "logs")) == ["version_0"]
    rows, _ = _metric_rows(str(version))  # TensorBoard's event files, or metrics.csv without tensorboard
    steps = sorted({int(r["step"]) for r in rows if r.get("train_loss")})
    assert steps == list(range(2 * STEPS_PER_EPOCH))  # the first run's rows are still there (numbered from 0)
    assert {r["epoch"] for r in rows if r.get("val_acc")} == {"0", "1"}


@pytest.mark.parametrize(("first_epochs", "resumed_epochs", "expected_total"), [
    (2, 2, 2 * STEPS_PER_EPOCH),  # the same plan (resumed after epoch 0): the restored schedule runs on
    (1, 3, 2 * STEPS_PER_EPOCH),  # more epochs: a new cycle over the 2 epochs still to run
])
def test_example_schedule_on_resume(tmp_path, first_epochs, resumed_epochs, expected_total):
    from torchfleet import Trainer
    from torchfleet.callbacks import ModelCheckpoint
    from torchfleet.examples.addition import AdditionData, AdditionTransformer

    def run(epochs, ckpt_path=None):
        model = AdditionTransformer(d_model=32, dim_feedforward=64)
        trainer = Trainer(accelerator="cpu", max_epochs=epochs, default_root_dir=tmp_path, logger=False,
                          enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                          callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)])
        trainer.fit(model, datamodule=AdditionData(num_train=512, num_val=128), ckpt_path=ckpt_path)
        return trainer

    run(first_epochs)
    trainer = run(resumed_epochs, str(tmp_path / f"epoch=0-step={STEPS_PER_EPOCH}.ckpt"))
    sched = trainer.lr_scheduler_configs[0].scheduler
    assert trainer.global_step == resumed_epochs * STEPS_PER_EPOCH
    assert sched.total_steps == expected_total and sched.last_epoch == expected_total  # every planned step ran


def test_ckpt_path_last_without_checkpoint_starts_fresh(tmp_path, capsys):
    assert main(["fit", "--trainer.max_epochs=1", "--trainer.max_steps=1", "--ckpt_path=last",
                 f"--trainer.default_root_dir={tmp_path}", *EXAMPLE_SMALL]) == 0
    assert "Resuming" not in capsys.readouterr().out


def test_use_version_of(tmp_path):
    ckpt = tmp_path / "logs" / "version_3" / "checkpoints" / "last.ckpt"
    lg = CSVLogger(tmp_path)
    assert lg.use_version_of(ckpt) and lg.version == 3
    named = CSVLogger(tmp_path)
    assert named.use_version_of(tmp_path / "logs" / "mine" / "x.ckpt") and named.log_dir.endswith(os.path.join("logs", "mine"))
    # a version given to the constructor, or a checkpoint outside the logger's folder: unchanged
    assert not CSVLogger(tmp_path, version=7).use_version_of(ckpt)
    outside = CSVLogger(tmp_path / "elsewhere")
    assert not outside.use_version_of(ckpt) and outside.version == 0
    assert not CSVLogger(tmp_path).use_version_of(tmp_path / "logs" / "x.ckpt")


def test_fit_help_lists_the_example_options_and_describes_every_trainer_option(capsys):
    import inspect

    from docstring_parser import parse

    from torchfleet import Trainer
    from torchfleet.examples.addition import AdditionData, AdditionTransformer

    assert main(["fit", "--help"]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "type: Any" not in out and "Optional[Any]" not in out
    documented = {p.arg_name: p.description for p in parse(Trainer.__doc__).params}
    for kind, cls in (("trainer", Trainer), ("model", AdditionTransformer), ("data", AdditionData)):
        docs = {p.arg_name: p.description for p in parse(cls.__doc__).params}
        for name in list(inspect.signature(cls.__init__).parameters)[1:]:
            assert f"--{kind}.{name}" in out, name
            assert docs.get(name), f"{cls.__name__}'s docstring does not describe {name}"
            assert " ".join(docs[name].split()[:4]) in flat, name  # the description is in the help
    assert set(documented) == set(list(inspect.signature(Trainer.__init__).parameters)[1:])


def test_strategies_marks_what_cannot_run_here(monkeypatch, capsys):
    import sys

    import torch

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # as where deepspeed is not installed
    assert main(["strategies"]) == 0
    lines = capsys.readouterr().out.splitlines()
    notes = {line.split("]")[0] + "]": line for line in lines if line.startswith("[")}
    rows = {line.split()[0]: line.split() for line in lines[1:] if not line.startswith("[")}
    for name, row in rows.items():
        if name.startswith("deepspeed"):
            assert row[2] == "no" and "deepspeed is not installed (pip install deepspeed)" in notes[row[3]]
        elif name == "dp":
            if torch.cuda.is_available():
                assert row[2] == "yes"
            else:  # torch.nn.DataParallel needs CUDA devices: the connector refuses dp on the CPU
                assert row[2] == "no" and "needs CUDA GPUs" in notes[row[3]] and "use ddp" in notes[row[3]]
        elif name == "hivemind":  # torchfleet's own plugin, registered through the entry points
            import importlib.util

            if importlib.util.find_spec("hivemind") is None:
                assert row[2] == "no" and "hivemind is not installed" in notes[row[3]]
            else:
                assert row[2] == "yes"
        elif name.startswith("xla"):  # torch_xla lives in an environment of its own (torch 2.9; scripts/xla_lane.sh)
            import importlib.util

            if importlib.util.find_spec("torch_xla") is None:
                assert row[2] == "no" and "torch_xla is not installed" in notes[row[3]]
            else:
                assert row[2] == "yes"
        else:
            assert row[2] == "yes", name
    from torchfleet import Trainer
    from torchfleet.errors import ConfigurationError

    if not torch.cuda.is_available():
        with pytest.raises(ConfigurationError, match="dp' needs CUDA devices"):
            Trainer(accelerator="cpu", strategy="dp")


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _rows(n_epochs: int = 5, steps_per_epoch: int = 20, acc_scale: float = 1.0, loss_shift: float = 0.0):
    rows = [{"step": str(s), "epoch": str((s - 1) // steps_per_epoch), "train_loss": str(3 * 0.9**s + loss_shift)}
            for s in range(1, n_epochs * steps_per_epoch + 1)]
    rows += [{"step": str((e + 1) * steps_per_epoch), "epoch": str(e), "val_loss": str(2 * 0.7**e),
              "val_acc": str(acc_scale * min(1.0, 0.25 * e))} for e in range(n_epochs)]
    return rows, ["step", "train_loss", "epoch", "val_loss", "val_acc"]


def test_loss_figure_axes(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    from torchfleet.cli import _loss_figure, _plot

    rows, columns = _rows()
    fig = _loss_figure(rows, columns)
    fig.canvas.draw()
    train_ax, val_ax, acc_ax = fig.axes  # the twin (accuracy) axis comes last
    assert train_ax.get_yscale() == "log"
    # the loss falls from 2.7 to 1e-4: every value lies inside the log axis
    low, high = train_ax.get_ylim()
    assert low <= 3 * 0.9**100 and high >= 3 * 0.9
    ticks = [t for t in val_ax.get_xticks() if val_ax.get_xlim()[0] <= t <= val_ax.get_xlim()[1]]
    assert ticks == [0, 1, 2, 3, 4]  # whole epochs only
    assert acc_ax.get_ylim() == (0.0, 1.0) and isinstance(acc_ax.yaxis.get_major_formatter(), PercentFormatter)
    # the legends name every curve and lie outside the panels' data areas
    renderer = fig.canvas.get_renderer()
    assert [t.get_text() for t in train_ax.get_legend().get_texts()] == ["train_loss"]
    assert [t.get_text() for t in val_ax.get_legend().get_texts()] == ["val_loss", "val_acc"]
    for ax in (train_ax, val_ax):
        legend_box, panel = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert legend_box.y1 <= panel.y0  # entirely below the panel
        assert not legend_box.overlaps(ax.xaxis.get_tightbbox(renderer))  # clear of the tick labels and x label
        assert legend_box.y0 >= 0 and fig.bbox.x0 <= legend_box.x0 and legend_box.x1 <= fig.bbox.x1  # in the figure
    plt.close(fig)
    # the PNG holds the legends too (saved with a tight bounding box)
    (tmp_path / "metrics.csv").write_text(
        ",".join(columns) + "\n" + "\n".join(",".join(r.get(c, "") for c in columns) for r in rows) + "\n")
    assert _plot(str(tmp_path)) and (tmp_path / "loss_curve.png").stat().st_size > 5000


def test_loss_figure_falls_back_to_linear_axes():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from torchfleet.cli import _loss_figure

    # a loss that goes negative (a log-likelihood, say) cannot be drawn on a log axis; a metric above 1
    # (a perplexity) is not an accuracy
    fig = _loss_figure(*_rows(loss_shift=-1.0, acc_scale=50.0))
    train_ax, _, other_ax = fig.axes
    assert train_ax.get_yscale() == "linear"
    assert other_ax.get_ylim()[1] > 1.0
    plt.close(fig)


def test_a_typo_is_not_pointed_at_dp_on_the_cpu():
    """dp is torch.nn.DataParallel over CUDA GPUs: a misspelt strategy on the CPU is pointed at ddp, never dp."""
    from torchfleet import Trainer
    from torchfleet.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as cpu:
        Trainer(accelerator="cpu", strategy="dpp")
    suggestion = str(cpu.value).split("Accepted")[0]
    assert "'ddp'" in suggestion and "'dp'" not in suggestion
    assert "'dp'" in str(cpu.value).split("Accepted")[1]  # still listed among the names
    with pytest.raises(ConfigurationError) as cuda:  # the name is checked before the accelerator is looked for
        Trainer(accelerator="cuda", strategy="dpp")
    assert "'dp'" in str(cuda.value).split("Accepted")[0]
