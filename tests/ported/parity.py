"""Running the ported programs as launches under torchfleet or Lightning, and comparing what they ended with.

Shared by the tests (tests/ported/test_lightning_parity.py) and by tools/record_lightning_ported.py, which
records Lightning's results as the fixture CI compares with (CI has no Lightning).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

import torch

from tests.ported.lightning_imports import lightning_variant

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUNNER = os.path.join(HERE, "run_programs.py")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "lightning_ported")

#: one process, and ddp and fsdp on 2 processes
#: (the GAN's two manual_backward calls with toggled optimizers leave parameters unused: Lightning asks for
#: find_unused_parameters, so its users pass this strategy; torchfleet would turn it on by itself)
MODES = {"single": {"strategy": "auto", "devices": 1},
         "ddp": {"strategy": "ddp", "devices": 2, "strategies": {"gan": "ddp_find_unused_parameters_true"}},
         "fsdp": {"strategy": "fsdp", "devices": 2}}  # torchfleet only: Lightning's FSDP needs a GPU
#: every program (Fabric ones as "fleet:<name>"), in the order a launch runs them: Trainer programs first
PROGRAMS = ("gan", "autoencoder", "transformer", "classifier", "dqn", "language_model",
            "fleet:image_classifier", "fleet:ppo", "fleet:kfold")
#: programs Lightning cannot run in a mode, with the reason (they are left out of its runs and of the fixture)
LIGHTNING_CANNOT = {
    ("classifier", "ddp"): "sync_batchnorm=True: torch's SyncBatchNorm refuses CPU modules (torchfleet's CPUSyncBatchNorm "
                           "all-reduces over gloo)",
}

_LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK",
                     "TF_GLOBAL_SEED", "PL_GLOBAL_SEED")


def _env(lightning: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARIABLES}
    env["OMP_NUM_THREADS"] = "1"  # the same threads in both libraries, for bitwise comparisons
    if lightning:
        env.pop("PYTHONPATH", None)  # the variant imports only Lightning (and its own folder)
    else:
        # this checkout's torchfleet, whatever else is installed
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "src"), ROOT, env.get("PYTHONPATH")) if p)
    return env


def programs_for(mode: str, lightning: bool = False) -> list[str]:
    """The programs a launch in ``mode`` runs (under Lightning, those it can run)."""
    return [p for p in PROGRAMS if not (lightning and (p, mode) in LIGHTNING_CANNOT)]


def launch(mode: str, folder: str, python: str | None = None, names: list[str] | None = None,
           strategy: str | None = None) -> dict[str, Any]:
    """Run the programs in ``mode`` as one launch (``python``: Lightning's interpreter, with its variant of the
    programs written under ``folder``); what rank 0 saved, by program name."""
    lightning = python is not None
    cfg = {**MODES[mode], "programs": names or programs_for(mode, lightning), "root": os.path.join(folder, "root"),
           "out": os.path.join(folder, "results.pt")}
    if strategy is not None:
        cfg["strategy"] = strategy
    os.makedirs(cfg["root"], exist_ok=True)
    script = lightning_variant(os.path.join(folder, "variant")) if lightning else RUNNER
    proc = subprocess.run([python or sys.executable, script, json.dumps(cfg)], capture_output=True, text=True,
                          timeout=600, env=_env(lightning), cwd=folder)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return torch.load(cfg["out"], weights_only=True)


def fixture_path(mode: str) -> str:
    return os.path.join(FIXTURES, f"{mode}.pt")


def differences(got: Any, want: Any, rtol: float = 0.0, atol: float = 0.0, path: str = "") -> list[str]:
    """Where ``got`` differs from ``want`` (nested dicts, lists, tensors, numbers): exactly when both tolerances
    are 0, else beyond ``atol + rtol * |want|`` elementwise. An empty list: equal."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or got.keys() != want.keys():
            return [f"{path}: keys {sorted(got) if isinstance(got, dict) else type(got)} != {sorted(want)}"]
        return [d for k in want for d in differences(got[k], want[k], rtol, atol, f"{path}.{k}" if path else k)]
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return [f"{path}: {got!r} != {want!r}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, rtol, atol, f"{path}[{i}]")]
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            return [f"{path}: {got!r} is not shaped as {tuple(want.shape)} {want.dtype}"]
        if rtol == atol == 0.0:
            return [] if torch.equal(got, want) else [f"{path}: not bitwise equal"]
        if want.dtype.is_floating_point:
            excess = (got.double() - want.double()).abs() - (atol + rtol * want.double().abs())
            return [] if excess.max().item() <= 0 else [f"{path}: beyond tolerance by {excess.max().item():.3g}"]
        return [] if torch.equal(got, want) else [f"{path}: {got.tolist()} != {want.tolist()}"]
    if isinstance(want, float) and isinstance(got, (int, float)) and not (rtol == atol == 0.0):
        ok = math.isclose(got, want, rel_tol=rtol, abs_tol=atol) or (math.isnan(got) and math.isnan(want))
        return [] if ok else [f"{path}: {got!r} != {want!r}"]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]
