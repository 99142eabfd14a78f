"""A checkpoint that runs code when unpickled is refused on every way in, naming what it asked for.

Each hostile file holds, beside a valid torchfleet checkpoint's entries, an object whose ``__reduce__``
calls ``os.system("touch <marker>")``: had it been unpickled, the marker file would exist. Every entry
point (fit/validate/test/predict with a path, "last", automatic resume, Module.load_from_checkpoint,
Fleet.load, the sharded layouts' files, consolidate) must raise CheckpointError naming ``system``
and leave no marker; opting in (weights_only=False, TorchCheckpointIO(weights_only=False)) loads
the file, and the payload then runs: the files are genuinely hostile.
"""

from __future__ import annotations

import os
import shlex

import pytest
import torch

from tests.helpers import RegressionData, Regressor, loader, quiet
from torchfleet import Fleet, Trainer
from torchfleet.callbacks import ModelCheckpoint
from torchfleet.checkpoint import TorchCheckpointIO
from torchfleet.checkpoint.consolidate import consolidate
from torchfleet.checkpoint.dcp import DCPStateDict, save_dcp_checkpoint
from torchfleet.checkpoint.deepspeed import deepspeed_available
from torchfleet.checkpoint.distributed import META_NAME, sharded_marker, write_meta
from torchfleet.errors import CheckpointError

#: how the refusal names os.system (its module is "posix" on Linux and macOS, "nt" on Windows)
NAMES_SYSTEM = r"'(posix|nt|os)\.system'"


class Payload:
    """Unpickled, it runs ``touch marker``."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


class OneProcess:
    """What a sharded save needs of the processes writing it, for one process."""

    is_global_zero = True

    def barrier(self, name=None) -> None:
        pass


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A real checkpoint of a short fit: its entries are what the hostile files carry beside their payload."""
    root = tmp_path_factory.mktemp("good")
    trainer = Trainer(**quiet(max_epochs=1, default_root_dir=root))
    trainer.fit(Regressor(), datamodule=RegressionData())
    trainer.save_checkpoint(root / "good.ckpt")
    return torch.load(root / "good.ckpt", weights_only=True)


@pytest.fixture
def marker(tmp_path):
    """Where the payload writes when it runs."""
    return tmp_path / "PAYLOAD_RAN"


def hostile(path, good, marker, **extra):
    torch.save({**good, **extra, "extra": Payload(marker)}, path)
    return path


def _refused(marker, call):
    with pytest.raises(CheckpointError, match=NAMES_SYSTEM) as info:
        call()
    assert not marker.exists()
    message = str(info.value)
    assert "\n" not in message.strip() and "weights_only=False" in message
    return message


@pytest.mark.parametrize("stage", ["fit", "validate", "test", "predict"])
def test_every_trainer_stage_refuses_a_hostile_path(tmp_path, good, marker, stage):
    path = hostile(tmp_path / "evil.ckpt", good, marker)
    trainer = Trainer(**quiet(max_epochs=2, default_root_dir=tmp_path))
    data = {"dataloaders": loader()} if stage == "predict" else {"datamodule": RegressionData()}
    _refused(marker, lambda: getattr(trainer, stage)(Regressor(), ckpt_path=path, **data))


def test_last_refuses_a_hostile_last_ckpt(tmp_path, good, marker):
    (tmp_path / "ck").mkdir()
    hostile(tmp_path / "ck" / "last.ckpt", good, marker)
    trainer = Trainer(**quiet(max_epochs=2, default_root_dir=tmp_path, enable_checkpointing=True,
                              callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)]))
    message = _refused(marker, lambda: trainer.fit(Regressor(), datamodule=RegressionData(), ckpt_path="last"))
    assert "last.ckpt" in message


def test_automatic_resume_refuses_a_hostile_preemption_checkpoint(tmp_path, good, marker, monkeypatch):
    (tmp_path / "checkpoints").mkdir()
    hostile(tmp_path / "checkpoints" / "preempted.ckpt", good, marker)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # a requeued job: fit resumes by itself
    trainer = Trainer(**quiet(max_epochs=2, default_root_dir=tmp_path))
    _refused(marker, lambda: trainer.fit(Regressor(), datamodule=RegressionData()))


def test_last_and_a_restart_never_pick_files_outside_torchfleets_folders(tmp_path, good, marker, monkeypatch):
    # a newer checkpoint-looking file anywhere else under default_root_dir (someone's download) is not a candidate
    trainer = Trainer(**quiet(max_epochs=1, default_root_dir=tmp_path, enable_checkpointing=True,
                              callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)]))
    trainer.fit(Regressor(), datamodule=RegressionData())
    (tmp_path / "downloads").mkdir()
    planted = hostile(tmp_path / "downloads" / "newer.ckpt", good, marker)
    os.utime(planted, (os.path.getmtime(tmp_path / "ck" / "last.ckpt") + 60,) * 2)
    again = Trainer(**quiet(max_epochs=2, default_root_dir=tmp_path, enable_checkpointing=True,
                            callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)]))
    again.fit(Regressor(), datamodule=RegressionData(), ckpt_path="last")
    assert again.ckpt_path == str(tmp_path / "ck" / "last.ckpt")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    restarted = Trainer(**quiet(max_epochs=3, default_root_dir=tmp_path, enable_checkpointing=True,
                                callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)]))
    restarted.fit(Regressor(), datamodule=RegressionData())
    assert restarted.ckpt_path == str(tmp_path / "ck" / "last.ckpt")


def test_a_restart_finds_the_checkpoint_of_an_earlier_logger_version(tmp_path, monkeypatch):
    # the default ModelCheckpoint writes into the logger's version folder; a restarted run logs to a new version
    from torchfleet.loggers import CSVLogger

    def run(max_epochs):
        trainer = Trainer(**quiet(max_epochs=max_epochs, default_root_dir=tmp_path, enable_checkpointing=True,
                                  logger=CSVLogger(tmp_path)))
        trainer.fit(Regressor(), datamodule=RegressionData())
        return trainer

    first = run(1)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    second = run(2)
    assert second.ckpt_path is not None and os.path.dirname(second.ckpt_path) == first.checkpoint_callback.dirpath
    assert second.global_step == 2 * first.global_step  # one epoch more, not two


def test_load_from_checkpoint_and_fleet_load_refuse(tmp_path, good, marker):
    path = hostile(tmp_path / "evil.ckpt", good, marker)
    _refused(marker, lambda: Regressor.load_from_checkpoint(path))
    fleet = Fleet(accelerator="cpu", devices=1)
    model = fleet.setup(Regressor())
    _refused(marker, lambda: fleet.load(path, {"state_dict": model}, strict=False))


def test_a_hostile_class_of_an_allowed_module_is_named_too(tmp_path, good, marker):
    class Exec:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').close()",))

    torch.save({**good, "extra": Exec()}, tmp_path / "evil.ckpt", pickle_protocol=4)  # STACK_GLOBAL: torch names none
    with pytest.raises(CheckpointError, match=r"builtins\.exec") as info:
        Regressor.load_from_checkpoint(tmp_path / "evil.ckpt")
    assert not marker.exists() and "weights_only=False" in str(info.value)


def test_opting_in_loads_the_file_and_so_runs_its_payload(tmp_path, good, marker):
    path = hostile(tmp_path / "evil.ckpt", good, marker)
    model = Regressor.load_from_checkpoint(path, weights_only=False)
    assert marker.exists() and torch.equal(model.net[0].weight, good["state_dict"]["net.0.weight"])
    for opt_in in ({"weights_only": False}, {"plugins": [TorchCheckpointIO(weights_only=False)]}):
        marker.unlink()
        kw = {k: v for k, v in opt_in.items() if k == "plugins"}
        trainer = Trainer(**quiet(max_epochs=2, default_root_dir=tmp_path, **kw))
        trainer.validate(Regressor(), datamodule=RegressionData(), ckpt_path=path,
                         **{k: v for k, v in opt_in.items() if k == "weights_only"})
        assert marker.exists()
    marker.unlink()
    from torchfleet.strategies import SingleDeviceStrategy

    fleet = Fleet(strategy=SingleDeviceStrategy(device="cpu", checkpoint_io=TorchCheckpointIO(weights_only=False)))
    model = fleet.setup(Regressor())
    fleet.load(path, {"state_dict": model}, strict=False)
    assert marker.exists()
    marker.unlink()
    Fleet(accelerator="cpu").load(path, weights_only=False)
    assert marker.exists()


def test_an_explicit_weights_only_true_wins_over_a_trusting_checkpoint_io(tmp_path, good, marker):
    path = hostile(tmp_path / "evil.ckpt", good, marker)
    trainer = Trainer(**quiet(max_epochs=1, plugins=[TorchCheckpointIO(weights_only=False)]))
    _refused(marker, lambda: trainer.validate(Regressor(), datamodule=RegressionData(), ckpt_path=path,
                                              weights_only=True))


# ---------------------------------------------------------------------------- sharded layouts
def _dcp_dir(path, good, **extra):
    plain = {k: v for k, v in good.items() if k not in ("state_dict", "torchfleet")}
    plain["state_dict"] = DCPStateDict(good["state_dict"])
    plain.update(extra)
    save_dcp_checkpoint(path, plain, OneProcess())
    return path


def _ways_into_a_directory(path):
    trainer = Trainer(**quiet(max_epochs=2))
    return [
        lambda: trainer.fit(Regressor(), datamodule=RegressionData(), ckpt_path=path),
        lambda: Regressor.load_from_checkpoint(path),
        lambda: consolidate(path, str(path) + ".out.ckpt"),
    ]


def test_a_dcp_checkpoint_loads_safely_and_its_hostile_torchfleet_pt_is_refused(tmp_path, good, marker):
    path = _dcp_dir(tmp_path / "sharded.ckpt", good)
    model = Regressor.load_from_checkpoint(path)  # what torchfleet wrote loads under safe loading
    assert torch.equal(model.net[0].weight, good["state_dict"]["net.0.weight"])
    meta = torch.load(path / META_NAME, weights_only=True)
    torch.save({**meta, "extra": Payload(marker)}, path / META_NAME)
    for way in _ways_into_a_directory(path):
        assert META_NAME in _refused(marker, way)


def test_a_hostile_dcp_metadata_or_entry_is_refused(tmp_path, good, marker):
    path = _dcp_dir(tmp_path / "meta.ckpt", good)
    with open(path / ".metadata", "wb") as f:  # DCP's own reader unpickles it with pickle.load
        import pickle

        pickle.dump(Payload(marker), f)
    for way in _ways_into_a_directory(path):
        assert ".metadata" in _refused(marker, way)
    # a non-tensor entry of the DCP files (DCP's reader torch.loads those with weights_only=False)
    path = _dcp_dir(tmp_path / "entry.ckpt", good, extra_state=DCPStateDict({"payload": Payload(marker)}))
    for way in _ways_into_a_directory(path):
        _refused(marker, way)


@pytest.mark.skipif(not deepspeed_available(), reason="deepspeed is not installed (the 'deepspeed' extra)")
@pytest.mark.parametrize("where", ["torchfleet.pt", "model_states", "zero_optim_states"])
def test_a_hostile_deepspeed_layout_is_refused(tmp_path, good, marker, where):
    """A "deepspeed" directory as DeepSpeedStrategy writes it (here by hand): any of its files may be hostile."""
    path = tmp_path / "ds.ckpt"
    tag_dir = path / "deepspeed" / "checkpoint"
    tag_dir.mkdir(parents=True)
    stage = 2 if where == "zero_optim_states" else 0
    meta = {k: v for k, v in good.items() if k not in ("state_dict", "optimizer_states")}
    meta["torchfleet"] = sharded_marker("deepspeed")
    meta["deepspeed"] = {"tag": "checkpoint", "world_size": 1, "zero_stage": stage, "half": False,
                         "param_names": None, "modules": ["state_dict"], "optimizers": {}}
    if where == "torchfleet.pt":
        meta["extra"] = Payload(marker)
    write_meta(path, meta)
    weights = {f"module.{k}": v for k, v in good["state_dict"].items()}
    model_states = {"module": weights, "optimizer": None, "param_shapes": [{}]}
    if where == "model_states":
        model_states["extra"] = Payload(marker)
    torch.save(model_states, tag_dir / "mp_rank_00_model_states.pt")
    if where == "zero_optim_states":
        torch.save({"optimizer_state_dict": {"loss_scaler": Payload(marker)}},
                   tag_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    for way in _ways_into_a_directory(path):
        _refused(marker, way)


def test_consolidate_on_the_command_line_refuses_in_one_paragraph(tmp_path, good, marker, capsys):
    from torchfleet.cli import main

    path = _dcp_dir(tmp_path / "sharded.ckpt", good)
    meta = torch.load(path / META_NAME, weights_only=True)
    torch.save({**meta, "extra": Payload(marker)}, path / META_NAME)
    assert main(["consolidate", str(path), str(tmp_path / "out.ckpt")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "system" in err
    assert not marker.exists() and not (tmp_path / "out.ckpt").exists()
