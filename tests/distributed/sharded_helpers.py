"""What the sharded-strategy tests share: running a training script as a real launch, comparing weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env(**extra: str) -> dict[str, str]:
    """This environment for a launch: one torch thread, the repo importable, no rank variables of our own."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for var in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        env.pop(var, None)
    env.update(extra)
    return env


def run_script(script: str, cfg: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``python script '<cfg as JSON>'`` (it starts its own ranks) and wait for it."""
    return subprocess.run([sys.executable, script, json.dumps(cfg)], capture_output=True, text=True,
                          timeout=timeout, env=child_env(), cwd=ROOT)


def load_results(cfg: dict, proc: subprocess.CompletedProcess) -> dict:
    """The results rank 0 wrote to ``cfg["out"]``, after checking that the launch succeeded."""
    assert proc.returncode == 0, proc.stderr[-6000:]
    return torch.load(cfg["out"], weights_only=False)


def assert_close(got: dict, want: dict, atol: float) -> None:
    """Same keys, and every tensor within ``atol`` (max absolute difference) of the wanted one."""
    assert got.keys() == want.keys()
    for k in want:
        diff = (got[k].float() - want[k].float()).abs().max().item()
        assert diff <= atol, f"{k}: max |diff| {diff:.3g} > {atol}"


def train_reference(build, **kwargs) -> dict:
    """One process, the global batch: weights, global step and val_loss every sharded run must match."""
    import torchfleet as tf

    tf.seed_everything(0)
    model, trainer, train, val = build("single_device", 1, **kwargs)
    trainer.fit(model, train, val)
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "global_step": trainer.global_step, "val_loss": float(trainer.callback_metrics["val_loss"])}
