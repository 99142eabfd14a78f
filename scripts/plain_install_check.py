"""Does a plain ``pip install torchfleet`` (no extras) train on several processes? One line per check.

CI runs it in a venv that holds only the declared dependencies (.ci/run), because the test extras bring
packages (numpy among them) that a user's plain install may lack. In one 2-process launch over gloo on the
CPU, for ``ddp`` and then ``fsdp``:

- ``fit``: 2 epochs from scratch, with ``sync_dist`` values logged in training and validation (the epoch end
  agrees on the synced names through object collectives);
- ``validate``: the checkpoint written after epoch 1 gives the validation loss that epoch's fit reported;
- ``resume``: fitting on from that checkpoint ends with the weights of the uninterrupted 2-epoch fit;
- ``fsdp matches ddp``: the two strategies' 2-epoch fits end with the same weights (same data, same steps).

    python scripts/plain_install_check.py          # exits 1 when a check fails or a rank crashes

Rank 0 prints the lines; the second rank is the same script, started again by the launcher.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import traceback

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf

DIR_VAR = "TORCHFLEET_PLAIN_CHECK_DIR"  # one folder for both ranks (the launcher passes the environment on)
STRATEGIES = ("ddp", "fsdp")


def make_loader(seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 4, generator=g)
    return DataLoader(TensorDataset(x, torch.sin(x).sum(1, keepdim=True)), batch_size=8)


class Net(tf.Module):
    """A small MLP that logs its losses with ``sync_dist=True``, as a user's model does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def _loss(self, batch):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, sync_dist=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def full_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights (an FSDP parameter is a DTensor; gathering it is a collective: every rank calls)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in module.state_dict().items()}


def trainer(strategy: str, epochs: int, root: str) -> tf.Trainer:
    return tf.Trainer(accelerator="cpu", strategy=strategy, devices=2, max_epochs=epochs, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, default_root_dir=root)


def fit(strategy: str, epochs: int, root: str, ckpt_path: str | None = None) -> tuple[tf.Trainer, Net]:
    model = Net()
    t = trainer(strategy, epochs, root)
    t.fit(model, make_loader(1), make_loader(2), ckpt_path=ckpt_path)
    return t, model


def check_strategy(strategy: str, root: str, say) -> dict[str, torch.Tensor]:
    """The fit, validate and resume checks of one strategy; returns the weights of its 2-epoch fit."""
    t_full, full_model = fit(strategy, 2, root)
    full = full_weights(full_model)
    loss = float(t_full.callback_metrics["train_loss"])
    say(t_full.global_step == 8 and math.isfinite(loss), f"{strategy} fit: 2 epochs, {t_full.global_step} steps (expected 8), synced train_loss {loss:.4f}")

    t_half, _ = fit(strategy, 1, root)
    path = os.path.join(root, f"{strategy}-epoch1.ckpt")
    t_half.save_checkpoint(path)
    reported = float(t_half.callback_metrics["val_loss"])
    validated = float(trainer(strategy, 1, root).validate(Net(), make_loader(2), ckpt_path=path, verbose=False)[0]["val_loss"])
    say(abs(validated - reported) <= 1e-6 * max(1.0, abs(reported)),
        f"{strategy} validate: checkpoint of epoch 1 gives val_loss {validated:.6f}, its fit reported {reported:.6f}")

    t_resumed, resumed_model = fit(strategy, 2, root, ckpt_path=path)
    resumed = full_weights(resumed_model)
    diff = max((resumed[k] - full[k]).abs().max().item() for k in full)
    say(t_resumed.global_step == 8 and diff <= 1e-6,
        f"{strategy} resume: from epoch 1 to step {t_resumed.global_step} (expected 8), largest weight difference "
        f"from the uninterrupted fit {diff:.1e} (tolerance 1e-6)")
    return full


def main() -> int:
    root = os.environ.setdefault(DIR_VAR, tempfile.mkdtemp(prefix="torchfleet-plain-"))
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    failures: list[str] = []

    def say(ok: bool, line: str) -> None:
        if not ok:
            failures.append(line)
        if rank == 0:
            print(f"{'ok  ' if ok else 'FAIL'} {line}", flush=True)

    weights = {}
    for strategy in STRATEGIES:
        try:
            weights[strategy] = check_strategy(strategy, root, say)
        except Exception as exc:  # a crash stops the launch: the ranks can no longer agree on anything
            say(False, f"{strategy}: {type(exc).__name__}: {exc}")
            if rank == 0:
                traceback.print_exc()
            break
    if len(weights) == 2:
        diff = max((weights["fsdp"][k] - weights["ddp"][k]).abs().max().item() for k in weights["ddp"])
        say(diff <= 1e-5, f"fsdp matches ddp: largest weight difference after 2 epochs {diff:.1e} (tolerance 1e-5)")
    if rank == 0:
        import importlib.util

        numpy = "installed" if importlib.util.find_spec("numpy") else "not installed"
        print(f"{'passed' if not failures else 'FAILED'}: torch {torch.__version__}, numpy {numpy}, "
              f"{len(failures)} failed check(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
