"""torchfleet.cli.LightningCLI in this process: run=False, dict arguments, subclass mode, linked arguments, the
optimizer from the command line, config.yaml's refusal to overwrite, environment variables, the overridable
methods, and errors as one paragraph with status 2. The ported programs run as processes in
tests/ported/test_ported_cli.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import yaml

import torchfleet as tf
from tests.ported.cli_autoencoder import LitAutoEncoder, MyDataModule, ReconstructionProbe, cli_main
from tests.ported.cli_classifier import LitClassifier, WideClassifier
from tests.ported.cli_classifier import cli_main as classifier_main
from torchfleet.cli import LightningCLI, SaveConfigCallback

QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.fixture(autouse=True)
def _no_command_line(monkeypatch, tmp_path):
    # the CLI reads sys.argv when given no args (and warns when it gets both): pytest's are not the program's
    monkeypatch.setattr(sys, "argv", ["train.py"])
    monkeypatch.chdir(tmp_path)
    for var in ("TF_GLOBAL_SEED", "TF_SEED_WORKERS"):  # seed_everything sets them: each test starts without
        monkeypatch.setenv(var, "0")
        monkeypatch.delenv(var)


def test_run_false_builds_the_objects_for_the_program_to_use(tmp_path):
    cli = cli_main(run=False, args=["--model.hidden_dim=6", "--data.batch_size=4", "--trainer.max_epochs=1",
                                    f"--trainer.default_root_dir={tmp_path}", *QUIET])
    assert cli.subcommand is None
    assert isinstance(cli.model, LitAutoEncoder) and cli.model.encoder[0].out_features == 6
    assert isinstance(cli.datamodule, MyDataModule) and cli.datamodule.batch_size == 4
    assert cli.config.seed_everything == 1234 and cli.config.model.hidden_dim == 6
    kinds = [type(cb) for cb in cli.trainer.callbacks]
    assert ReconstructionProbe in kinds and SaveConfigCallback in kinds  # trainer_defaults' callbacks are added
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    [probe] = [cb for cb in cli.trainer.callbacks if isinstance(cb, ReconstructionProbe)]
    assert len(probe.errors) == 1
    assert os.path.isfile(os.path.join(cli.trainer.log_dir, "config.yaml"))


def test_arguments_as_a_dict_and_the_seed_set_before_the_model_is_built(tmp_path):
    cli = cli_main(run=False, args={"model": {"hidden_dim": 5}, "trainer": {"max_epochs": 3}, "seed_everything": 7})
    assert cli.trainer.max_epochs == 3 and cli.config.seed_everything == 7
    tf.seed_everything(7)
    expected = LitAutoEncoder(hidden_dim=5)
    for (name, got), want in zip(cli.model.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(got, want), name


def test_seed_everything_true_and_false(monkeypatch):
    monkeypatch.setenv("TF_GLOBAL_SEED", "31")
    assert cli_main(run=False, args=["--seed_everything=true"]).config.seed_everything == 31
    torch.manual_seed(5)
    cli = cli_main(run=False, args=["--seed_everything=false"])
    assert cli.config.seed_everything is False
    torch.manual_seed(5)  # not reseeded by the CLI: the model drew from the generator as the program left it
    assert torch.equal(cli.model.encoder[0].weight, LitAutoEncoder().encoder[0].weight)


def test_subclass_mode_links_the_data_sizes_into_the_model():
    cli = classifier_main(run=False, args=["--model=WideClassifier", "--model.width=8", "--data.num_classes=3",
                                           "--data.in_features=10"])
    assert type(cli.model) is WideClassifier
    assert cli.model.hparams.num_classes == 3 and cli.model.hparams.in_features == 10
    assert (cli.model.backbone.l1.in_features, cli.model.backbone.l1.out_features) == (10, 8)
    assert cli.model.backbone.l2.out_features == 3
    [checkpoint] = [cb for cb in cli.trainer.callbacks if type(cb).__name__ == "ModelCheckpoint"
                    and cb.monitor is not None]
    assert checkpoint.monitor == "val_loss" and checkpoint.save_last  # --checkpoint, with the program's defaults


def test_optimizer_and_scheduler_from_the_command_line_replace_configure_optimizers():
    with pytest.warns(UserWarning, match="LitClassifier.configure_optimizers is replaced"):
        cli = classifier_main(run=False, args=["--model=LitClassifier", "--optimizer=SGD", "--optimizer.lr=0.05",
                                               "--optimizer.momentum=0.5", "--lr_scheduler=StepLR",
                                               "--lr_scheduler.step_size=3"])
    [optimizer], [scheduler] = cli.model.configure_optimizers()
    assert type(optimizer) is torch.optim.SGD
    assert optimizer.defaults["lr"] == 0.05 and optimizer.defaults["momentum"] == 0.5
    assert type(scheduler) is torch.optim.lr_scheduler.StepLR and scheduler.step_size == 3
    assert {id(p) for p in optimizer.param_groups[0]["params"]} == {id(p) for p in cli.model.parameters()}


def test_without_optimizer_the_model_keeps_its_own():
    cli = classifier_main(run=False, args=["--model=LitClassifier", "--model.learning_rate=0.003"])
    optimizer = cli.model.configure_optimizers()
    assert type(optimizer) is torch.optim.Adam and optimizer.defaults["lr"] == 0.003


def test_reduce_lr_on_plateau_carries_its_monitor():
    cli = classifier_main(run=False, args=["--model=LitClassifier", "--optimizer=Adam",
                                           "--lr_scheduler=torchfleet.cli.ReduceLROnPlateau",
                                           "--lr_scheduler.monitor=val_acc", "--lr_scheduler.mode=max"])
    configured = cli.model.configure_optimizers()
    assert configured["lr_scheduler"]["monitor"] == "val_acc"
    assert configured["lr_scheduler"]["scheduler"].mode == "max"


def _quick(tmp_path, extra: list[str] = ()) -> list[str]:
    return ["fit", "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1", "--trainer.enable_checkpointing=false",
            *QUIET, *extra]


def test_config_yaml_is_not_overwritten_unless_asked(tmp_path, capsys):
    LightningCLI(LitAutoEncoder, MyDataModule, args=_quick(tmp_path))
    path = tmp_path / "config.yaml"
    first = path.read_text()
    assert yaml.safe_load(first)["trainer"]["max_epochs"] == 1
    with pytest.raises(SystemExit) as exited:
        LightningCLI(LitAutoEncoder, MyDataModule, args=_quick(tmp_path, ["--model.hidden_dim=4"]))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "config.yaml already exists" in err and "'overwrite': True" in err
    assert path.read_text() == first
    LightningCLI(LitAutoEncoder, MyDataModule, args=_quick(tmp_path, ["--model.hidden_dim=4"]),
                 save_config_kwargs={"overwrite": True})
    assert yaml.safe_load(path.read_text())["model"]["hidden_dim"] == 4


def test_save_config_callback_none_and_a_custom_file_name(tmp_path):
    LightningCLI(LitAutoEncoder, MyDataModule, args=_quick(tmp_path), save_config_callback=None)
    assert not (tmp_path / "config.yaml").exists()
    LightningCLI(LitAutoEncoder, MyDataModule, args=_quick(tmp_path),
                 save_config_kwargs={"config_filename": "run.yaml"})
    assert yaml.safe_load((tmp_path / "run.yaml").read_text())["seed_everything"] == 0  # True: seed_everything()


def test_save_to_log_dir_false_needs_a_save_config_override():
    with pytest.raises(ValueError, match="save_config"):
        SaveConfigCallback(None, None, save_to_log_dir=False)


class RecordingCLI(LightningCLI):
    """Overrides what programs override: arguments of its own, the hooks around the subcommand, the subcommand."""

    calls: list[str] = []

    def add_arguments_to_parser(self, parser):
        parser.add_argument("--note", type=str, default="none")
        parser.set_defaults({"model.hidden_dim": 5})

    def before_instantiate_classes(self):
        self.calls.append(f"before_instantiate:{self._get(self.config, 'note')}")

    def after_instantiate_classes(self):
        self.calls.append(f"after_instantiate:{self.model.encoder[0].out_features}")

    def before_fit(self):
        self.calls.append("before_fit")

    def fit(self, model, **kwargs):
        self.calls.append(f"fit:{sorted(kwargs)}:{self.trainer.max_epochs}")

    def after_fit(self):
        self.calls.append("after_fit")


def test_overridden_methods_run_in_lightnings_order(monkeypatch):
    monkeypatch.setenv("PL_FIT__TRAINER__MAX_EPOCHS", "3")  # read only with default_env
    RecordingCLI.calls = []
    RecordingCLI(LitAutoEncoder, MyDataModule, args=["fit", "--note=hi"], parser_kwargs={"default_env": True})
    assert RecordingCLI.calls == ["before_instantiate:hi", "after_instantiate:5", "before_fit",
                                  "fit:['ckpt_path', 'datamodule', 'weights_only']:3", "after_fit"]
    RecordingCLI.calls = []
    RecordingCLI(LitAutoEncoder, MyDataModule, args=["fit"])
    assert RecordingCLI.calls[-2] == "fit:['ckpt_path', 'datamodule', 'weights_only']:1000"  # the env is not read


def test_a_rejected_value_is_one_paragraph_with_status_2(capsys):
    with pytest.raises(SystemExit) as exited:
        LightningCLI(LitAutoEncoder, MyDataModule, args=["fit", "--model.hidden_dim=-1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--model LitAutoEncoder(hidden_dim=-1, learning_rate=0.01) could not be built" in err
    with pytest.raises(SystemExit) as exited:
        LightningCLI(LitAutoEncoder, MyDataModule, args=["fit", "--trainer.strategy=ddpp"])
    assert exited.value.code == 2 and "Did you mean 'ddp'" in capsys.readouterr().err


def test_a_class_that_is_not_a_module_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        LightningCLI(torch.nn.Linear, args=["fit"])
    assert exited.value.code == 2
    assert "give a subclass of torchfleet's Trainer, Module, DataModule or Callback" in capsys.readouterr().err


def test_no_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        LightningCLI(LitClassifier, args=[])
    assert exited.value.code == 2
    assert "fit" in capsys.readouterr().err


def test_the_lightning_names_come_from_torchfleet_cli_without_loading_them_early():
    code = ("import sys, torchfleet.cli as c; assert 'jsonargparse' not in sys.modules; "
            "from torchfleet.cli import (LightningCLI, LightningArgumentParser, SaveConfigCallback, "
            "ReduceLROnPlateau, OptimizerCallable, LRSchedulerCallable, LRSchedulerTypeUnion, ArgsType, "
            "instantiate_class); assert c.CLI and c.main; print(LightningCLI.__module__)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(root, "src"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torchfleet.cli_lightning"


def test_trainer_objects_from_class_paths_and_the_trainers_own_refusal(tmp_path, capsys):
    cli = cli_main(run=False, args=["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val_loss",
                                    "--trainer.callbacks.patience=7", "--trainer.logger=CSVLogger",
                                    f"--trainer.logger.save_dir={tmp_path}"])
    [stopper] = [cb for cb in cli.trainer.callbacks if type(cb).__name__ == "EarlyStopping"]
    assert (stopper.monitor, stopper.patience) == ("val_loss", 7)
    assert type(cli.trainer.loggers[0]).__name__ == "CSVLogger"
    assert cli.trainer.log_dir.startswith(str(tmp_path))
    with pytest.raises(SystemExit) as exited:  # names no class: the Trainer says what it accepts
        cli_main(run=False, args=["--trainer.logger=csv"])
    assert exited.value.code == 2 and "logger='csv' is not valid" in capsys.readouterr().err


def make_trainer(max_epochs: int = 1, enable_progress_bar: bool = False) -> tf.Trainer:
    """A program's own way of building its Trainer (no callbacks argument)."""
    return tf.Trainer(max_epochs=max_epochs, enable_progress_bar=enable_progress_bar, logger=False)


def test_a_function_as_trainer_class_without_callbacks():
    with pytest.warns(UserWarning, match="takes no callbacks argument"):
        cli = LightningCLI(LitAutoEncoder, MyDataModule, trainer_class=make_trainer, run=False,
                           args=["--trainer.max_epochs=4"])
    assert cli.trainer.max_epochs == 4 and cli.trainer.loggers == []
    assert not any(isinstance(cb, SaveConfigCallback) for cb in cli.trainer.callbacks)


def test_save_config_callback_keeps_the_model_configuration_in_checkpoints():
    cli = classifier_main(run=False, args=["--model=WideClassifier", "--model.width=8"])
    [saver] = [cb for cb in cli.trainer.callbacks if isinstance(cb, SaveConfigCallback)]
    recorded = saver.state_dict()["model_config"]
    assert recorded["class_path"].endswith(".WideClassifier") and recorded["init_args"]["width"] == 8
    yaml.safe_dump(recorded)  # plain values only


def test_trainer_defaults_callbacks_given_as_class_paths_are_built():
    cli = LightningCLI(LitAutoEncoder, MyDataModule, run=False, trainer_defaults={
        "callbacks": [{"class_path": "torchfleet.callbacks.EarlyStopping", "init_args": {"monitor": "val_loss"}},
                      ReconstructionProbe(num_samples=2)]})
    kinds = {type(cb).__name__: cb for cb in cli.trainer.callbacks}
    assert kinds["EarlyStopping"].monitor == "val_loss" and kinds["ReconstructionProbe"].num_samples == 2
