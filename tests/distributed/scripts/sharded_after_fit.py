"""What user code can do with a sharded module once a stage has ended, under fsdp and DeepSpeed; a JSON argument drives it.

``cfg["runs"]`` are run in turn by one launch (2 ranks). Each run is ``{"name", "strategy", "keep_sharded"}``
with a ``case``:

- ``"stages"``: fit; then every rank calls the model and a submodule of the root (``model.head``), rank 0
  alone calls it once more, and ``trainer.save_checkpoint`` writes the final checkpoint; then ``trainer.test``,
  the model is called again, and a second Trainer fits the same module ``REFIT_STEPS`` more steps and writes
  its final checkpoint. ``"precision"`` is the Trainer's (default "32-true"); ``"checkpointing"``: fsdp recomputes
  each encoder layer's activations in backward (applied once, kept across the stages).
- ``"keep_sharded"``: fit with ``keep_sharded=True``; every rank calls the model together (it is still
  sharded), the final checkpoint is written, and ``trainer.test`` reuses the shards.
- ``"raises"``: a fit that raises at step 2 on every rank (caught here); then ``trainer.test``.
- ``"fleet"``: a Fleet loop of two steps, then ``fleet.strategy.unshard_module(model)`` (with ``"teardown"``:
  ``fleet.strategy.teardown()``); rank 0 alone calls the model.
- ``"rank_zero_forward"``: fit, where a ``@rank_zero_only`` callback calls the model after step 2 on rank 0
  alone (the run must end with a desync report naming that line; nothing is written).
- ``"ddp_sync_batchnorm"``: fit ``BNNet`` under ddp with ``sync_batchnorm=True``; what the model was during fit
  (the DDP wrapper, the synchronised BatchNorm) and after it (teardown: the Module, its own BatchNorm1d); every rank
  and rank 0 alone call it (eval mode), and the final checkpoint is written.

Every rank writes ``{out}.<rank>.pt`` (torch.save) with, per run: the outputs of its calls and what its
parameters were after fit (whole / sharded, dtype), and the paths of the checkpoints.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf
from tests.distributed.trainer_order import InOrder
from torchfleet.callbacks import Callback
from torchfleet.utilities import rank_zero_only

try:
    from tests.distributed.scripts import deepspeed_train, fsdp_train
except ImportError:  # run as a script from its folder
    import deepspeed_train  # type: ignore[no-redef]
    import fsdp_train  # type: ignore[no-redef]

#: global batch 12, 4 steps an epoch; the second fit of "stages" trains this many steps more
BATCH, EPOCHS, REFIT_STEPS = 6, 1, 3


class TestStep:
    """``test_step``: the mean squared error, synchronised."""

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)


class FSDPNet(TestStep, fsdp_train.TinyTransformer):
    """The fsdp tests' model (two encoder layers, each an FSDP unit) with a test_step."""


class DeepSpeedNet(TestStep, deepspeed_train.TinyTransformer):
    """The DeepSpeed tests' model (one encoder layer) with a test_step."""


class BNNet(TestStep, tf.Module):
    """Two linear layers with a BatchNorm between them (over the sequence's positions), for sync_batchnorm under ddp."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.nn.Linear(deepspeed_train.DIM, 16)
        self.norm = torch.nn.BatchNorm1d(deepspeed_train.SEQ)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.norm(self.inner(x))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class DuringFit(Callback):
    """What the strategy had made of the model while training ran."""

    def __init__(self) -> None:
        self.seen: dict = {}

    def on_train_end(self, trainer, module):
        from torch.nn.parallel import DistributedDataParallel

        self.seen = {"wrapped": isinstance(trainer.strategy.model, DistributedDataParallel),
                     "norm": type(module.norm).__name__}


def ddp_sync_batchnorm(run: dict, ckpt_dir: str) -> dict:
    model, during = BNNet(), DuringFit()
    trainer = tf.Trainer(strategy="ddp", sync_batchnorm=True, accelerator="cpu", devices=2, max_epochs=EPOCHS,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, callbacks=[during])
    trainer.fit(model, loader())
    out: dict = {"during": during.seen, "norm": type(model.norm).__name__, "leftovers": layer_leftovers(model),
                 "unwrapped": trainer.model is model and trainer.strategy.model is model}
    model.eval()
    with torch.no_grad():
        out["forward"] = model(inputs())
        if trainer.is_global_zero:  # alone: nothing of DDP's is left to wait for the other rank
            out["rank_zero_forward"] = model(inputs())
    out["fit_ckpt"] = os.path.join(ckpt_dir, f"{run['name']}-fit.ckpt")
    trainer.save_checkpoint(out["fit_ckpt"])
    return out


def new_model(run: dict) -> torch.nn.Module:
    return FSDPNet() if run["strategy"] == "fsdp" else DeepSpeedNet()


def inputs() -> torch.Tensor:
    """The inputs every rank feeds the model after fit (the test feeds the consolidated checkpoint the same)."""
    return fsdp_train.make_data()[:5][0]


def make_strategy(name: str, keep_sharded: bool, checkpointing: bool = False) -> tf.strategies.Strategy:
    from torch import nn

    from torchfleet.strategies import DeepSpeedStrategy, FSDPStrategy

    if name == "fsdp":
        layers = {nn.TransformerEncoderLayer}
        return FSDPStrategy(auto_wrap_policy=layers, activation_checkpointing_policy=layers if checkpointing else None,
                            keep_sharded=keep_sharded)
    stage = int(name.rsplit("_", 1)[1])
    return DeepSpeedStrategy(stage=stage, keep_sharded=keep_sharded)


def trainer_for(run: dict, max_steps: int = -1, callbacks=(), hang_timeout: float | None = 300) -> tf.Trainer:
    strategy = make_strategy(run["strategy"], run.get("keep_sharded", False), run.get("checkpointing", False))
    return tf.Trainer(strategy=strategy, accelerator="cpu", devices=2, precision=run.get("precision", "32-true"),
                      max_epochs=EPOCHS, max_steps=max_steps, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      callbacks=list(callbacks), hang_timeout=hang_timeout)


def loader() -> DataLoader:
    # a sampler of the program's own (the Trainer would shuffle the default one): the global batches are those of
    # the tests' one-process references, which read the data in order
    data = fsdp_train.make_data()
    return DataLoader(data, batch_size=BATCH, sampler=InOrder(data))


def test_loader() -> DataLoader:
    return DataLoader(TensorDataset(*fsdp_train.make_data()[:16]), batch_size=4)


def describe(module: torch.nn.Module) -> dict:
    """Whether each parameter is whole and ordinary: not a DTensor, no ZeRO attributes, its full shape."""
    from torch.distributed.tensor import DTensor

    return {name: {"plain": not isinstance(p, DTensor) and not any(k.startswith("ds_") for k in vars(p)),
                   "shape": tuple(p.shape), "dtype": str(p.dtype)}
            for name, p in module.named_parameters()}


def layer_leftovers(module: torch.nn.Module) -> list[str]:
    """Strategy hooks or attributes still on the layers: forward hooks, ``ds_*`` attributes, FSDP classes.

    Activation checkpointing's hooks stay on purpose: they only recompute in backward, needing no other rank.
    """
    from torch.distributed.fsdp import FSDPModule

    found = []
    for name, layer in module.named_modules():
        hooks = [*layer._forward_pre_hooks.values(), *layer._forward_hooks.values()]
        if any(getattr(h, "__module__", "") != "torch.distributed._composable.checkpoint_activation" for h in hooks):
            found.append(f"{name or 'root'}: forward hooks")
        found += [f"{name or 'root'}.{k}" for k in vars(layer) if k.startswith("ds_")]
        if isinstance(layer, FSDPModule):
            found.append(f"{name or 'root'}: {type(layer).__name__}")
    return found


class SampleOnRankZero(Callback):
    """A callback that samples from the model on rank 0 only, as image-generation callbacks do."""

    @rank_zero_only
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            module(inputs())  # RANK-ZERO-FORWARD


class StopAtStep2(Callback):
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == 2:
            raise ValueError("stop at step 2")


def raises(run: dict, ckpt_dir: str) -> dict:
    model = new_model(run)
    trainer = trainer_for(run, callbacks=[StopAtStep2()])
    try:
        trainer.fit(model, loader())
        error = None
    except ValueError as exc:
        error = f"{type(exc).__name__}: {exc}"
    out = {"error": error, "params": describe(model)}
    out["test_loss"] = trainer.test(model, test_loader(), verbose=False)[0]["test_loss"]
    out["params_after_test"] = describe(model)
    return out


def fleet(run: dict, ckpt_dir: str) -> dict:
    fleet = tf.Fleet(strategy=make_strategy(run["strategy"], False), accelerator="cpu", devices=2)
    fleet.launch()
    net = new_model(run)
    model, optimizer = fleet.setup(net, torch.optim.AdamW(net.parameters(), lr=0.02))
    for step, (x, y) in enumerate(fleet.setup_dataloaders(loader())):
        if step == 2:
            break
        fleet.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    out: dict = {"params_before": describe(net)}
    with torch.no_grad():
        out["forward_while_sharded"] = model(inputs())  # every rank together
    if run.get("teardown"):
        fleet.strategy.teardown()  # every rank: the end of the script
    else:
        fleet.strategy.unshard_module(net)  # every rank: the end of the loop
    out["params"] = describe(net)
    with torch.no_grad():
        out["forward"] = net(inputs())
        if fleet.is_global_zero:
            out["rank_zero_forward"] = net(inputs())
    fleet.barrier()
    return out


def stages(run: dict, ckpt_dir: str) -> dict:
    model = new_model(run)
    trainer = trainer_for(run)
    trainer.fit(model, loader())
    x = inputs()
    out: dict = {"params": describe(model), "leftovers": layer_leftovers(model)}
    with torch.no_grad():
        out["forward"], out["head"] = model(x), model.head(x)
        if trainer.is_global_zero:  # alone: it must not wait for the other rank
            out["rank_zero_forward"] = model(x)
    if trainer.is_global_zero:  # a backward alone too: no hook left to synchronise gradients
        model(x).sum().backward()
        out["rank_zero_grads"] = all(p.grad is not None for p in model.parameters())
        model.zero_grad(set_to_none=True)
    trainer.strategy.teardown()  # as a Trainer that tears the strategy down at the stage's end will: nothing changes
    out["fit_ckpt"] = os.path.join(ckpt_dir, f"{run['name']}-fit.ckpt")
    trainer.save_checkpoint(out["fit_ckpt"])
    out["test_loss"] = trainer.test(model, test_loader(), verbose=False)[0]["test_loss"]
    with torch.no_grad():
        out["forward_after_test"] = model(x)
    refit = trainer_for(run, max_steps=REFIT_STEPS)
    refit.fit(model, loader())
    out["refit_ckpt"] = os.path.join(ckpt_dir, f"{run['name']}-refit.ckpt")
    refit.save_checkpoint(out["refit_ckpt"])
    with torch.no_grad():
        out["forward_after_refit"] = model(x)
    out["refit_steps"] = refit.global_step
    return out


def keep_sharded(run: dict, ckpt_dir: str) -> dict:
    model = new_model(run)
    trainer = trainer_for(run)
    trainer.fit(model, loader())
    out: dict = {"params": describe(model)}
    with torch.no_grad():
        out["forward"] = model(inputs())  # every rank together: the sharded model gathers
    out["fit_ckpt"] = os.path.join(ckpt_dir, f"{run['name']}-fit.ckpt")
    trainer.save_checkpoint(out["fit_ckpt"])
    engine = getattr(trainer.strategy, "engine", None)
    out["test_loss"] = trainer.test(model, test_loader(), verbose=False)[0]["test_loss"]
    out["engine_reused"] = engine is not None and trainer.strategy.engine is engine
    out["params_after_test"] = describe(model)
    return out


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    results = {}
    for run in cfg["runs"]:
        tf.seed_everything(0)
        if run["case"] == "rank_zero_forward":
            model = FSDPNet()
            trainer_for(run, callbacks=[SampleOnRankZero()], hang_timeout=60).fit(model, loader())
            results[run["name"]] = {"finished": True}
        else:
            case = {"stages": stages, "keep_sharded": keep_sharded, "raises": raises, "fleet": fleet,
                    "ddp_sync_batchnorm": ddp_sync_batchnorm}[run["case"]]
            results[run["name"]] = case(run, cfg["ckpt_dir"])
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    torch.save(results, f"{cfg['out']}.{rank}.pt")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
