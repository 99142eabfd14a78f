"""The launches the model-parallel tests share (their fixtures are in tests/conftest.py, session-scoped).

Starting ranks costs seconds (a 4-process launch about 10 s on 2 cores, more under load), so the runs of
tests/strategies/test_model_parallel.py, test_pipeline.py, test_model_parallel_features.py and
tests/examples/test_tp_transformer.py go to one launch per world size (scripts/model_parallel_launch.py, which gives
each script's runs to that script's ``main``), in the order their checkpoints need: 4 processes, then 1 (model_parallel's
resume the 4-process checkpoints and a consolidated copy made before it; pipeline's write ``mesh_1x1.ckpt`` and
``fleet_single.ckpt``), then 2 (model_parallel's resume the 4-process checkpoints; pipeline's the 1-process ones).
Each script's runs write their own results file in their own folder, as a launch of that script alone would; a
session launches the runs of the test files it collected only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tests.distributed import sharded_helpers
from tests.distributed.scripts import model_parallel_train as mp_script
from tests.distributed.sharded_helpers import load_results

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "model_parallel_launch.py")
#: the folder each part's results and checkpoints go to, and the script that runs them
PARTS = {"model_parallel": "model_parallel_train", "pipeline": "pipeline_train", "tp_example": "tp_transformer_train",
         "features": "tp_transformer_train"}
WORDS = {4: "four", 2: "two", 1: "one"}
#: the test file that reads each part's results, under tests/
READERS = {"model_parallel": "strategies/test_model_parallel.py", "pipeline": "strategies/test_pipeline.py",
           "tp_example": "examples/test_tp_transformer.py", "features": "strategies/test_model_parallel_features.py"}


def model_parallel_runs(d: str) -> dict[int, list[dict]]:
    """tests/strategies/test_model_parallel.py's runs (model_parallel_train.py), by world size."""
    mp = {"strategy": "model_parallel"}
    save_at = mp_script.SAVE_AT
    return {
        4: [
            {"name": "tp2dp2", **mp, "dp": 2, "tp": 2, "save_at": save_at, "ckpt_dir": d},
            {"name": "tp2dp2_file", **mp, "dp": 2, "tp": 2, "distributed": False, "save_at": save_at,
             "ckpt_dir": d},
            {"name": "clip", **mp, "dp": 2, "tp": 2, "clip": 0.05},
            {"name": "accumulate", **mp, "dp": 2, "tp": 2, "accumulate": 2},
            {"name": "auto_from_2x2", **mp, "resume": f"{d}/tp2dp2.ckpt"},
            {"name": "dp4_from_file", **mp, "dp": 4, "tp": 1, "resume": f"{d}/tp2dp2_file.ckpt"},
            {"name": "uneven", **mp, "dp": 1, "tp": 4, "hidden": 6, "expect_error": True},
        ],
        2: [
            {"name": "fleet_tp2", "fleet": True, "dp": 1, "tp": 2, "ckpt_dir": d},
            {"name": "fsdp_from_2x2", "strategy": "fsdp", "resume": f"{d}/tp2dp2.ckpt"},
            {"name": "ddp_from_2x2", "strategy": "ddp", "resume": f"{d}/tp2dp2.ckpt"},
        ],
        1: [
            {"name": "single_from_2x2", "strategy": "single_device", "resume": f"{d}/tp2dp2.ckpt"},
            {"name": "mesh_1x1_from_file", **mp, "resume": f"{d}/tp2dp2_file.ckpt"},
            {"name": "single_from_consolidated", "strategy": "single_device", "resume": f"{d}/consolidated.ckpt"},
            # on one rank: under the script launcher an error in every rank ends the run (tested in test_faults)
            {"name": "unconfigured", **mp, "unconfigured": True, "expect_error": True},
        ],
    }


#: two stages per rank: the Stack's 5 layers in 4 stages
INTERLEAVED = {"schedule": "Interleaved1F1B", "stages_per_rank": 2, "split": ["layers.1", "layers.2", "layers.4"]}


def pipeline_runs(d: str) -> dict[int, list[dict]]:
    """tests/strategies/test_pipeline.py's runs (pipeline_train.py), by world size."""
    pp = {"strategy": "model_parallel", "pp": 2, "tp": 1}
    save_at = mp_script.SAVE_AT
    return {
        4: [
            {"name": "pp2dp2", **pp, "dp": 2, "microbatches": 2, "save_at": save_at, "ckpt_dir": d,
             "validate": True},
            {"name": "pp2dp2_gpipe", **pp, "dp": 2, "schedule": "GPipe", "microbatches": 4},
            {"name": "pp2dp2_clip", **pp, "dp": 2, "clip": 0.05, "log_loss": False},
            {"name": "fleet_pp2dp2", "fleet": True, "pp": 2, "dp": 2, "ckpt_dir": d},
            {"name": "pp2tp2", **pp, "dp": 1, "tp": 2},
            {"name": "pp2dp2_interleaved", **pp, "dp": 2, **INTERLEAVED, "microbatches": 4, "save_at": save_at,
             "ckpt_dir": d, "validate": True},
            {"name": "pp2dp2_bfs", **pp, "dp": 2, **INTERLEAVED, "schedule": "LoopedBFS", "log_loss": False},
            {"name": "uneven_microbatches", **pp, "dp": 2, "microbatches": 3, "expect_error": True},
        ],
        1: [
            {"name": "single_from_pp2dp2", "strategy": "single_device", "resume": f"{d}/pp2dp2.ckpt"},
            {"name": "mesh_1x1", "strategy": "model_parallel", "dp": 1, "tp": 1, "save_at": save_at, "ckpt_dir": d},
            {"name": "fleet_single", "fleet": True, "ckpt_dir": d, "resume": f"{d}/fleet_pp2dp2.ckpt"},
            {"name": "single_from_interleaved", "strategy": "single_device", "resume": f"{d}/pp2dp2_interleaved.ckpt"},
        ],
        2: [
            {"name": "pp2_from_1x1", **pp, "dp": 1, "resume": f"{d}/mesh_1x1.ckpt", "validate": True},
            {"name": "fleet_pp2_from_single", "fleet": True, "pp": 2, "ckpt_dir": d,
             "resume": f"{d}/fleet_single.ckpt"},
            {"name": "pp2_interleaved_clip", **pp, "dp": 1, **INTERLEAVED, "clip": 0.05},
            {"name": "interleaved_whole_module_sharded", **pp, "dp": 1, **INTERLEAVED, "shard_whole": True,
             "expect_error": True},
        ],
    }


def tp_example_runs(d: str) -> dict[int, list[dict]]:
    """tests/examples/test_tp_transformer.py's runs (tp_transformer_train.py)."""
    return {4: [{"name": "tp2dp2", "dp": 2, "tp": 2}, {"name": "tp4", "dp": 1, "tp": 4}]}


def features_runs(d: str) -> dict[int, list[dict]]:
    """tests/strategies/test_model_parallel_features.py's runs (tp_transformer_train.py), TP2xDP2."""
    tp2dp2 = {"dp": 2, "tp": 2}
    return {4: [
        {"name": "bf16_mixed", **tp2dp2, "precision": "bf16-mixed"},
        {"name": "bf16_true", **tp2dp2, "precision": "bf16-true"},
        {"name": "fsdp_bf16", **tp2dp2, "fsdp_bf16": True},
        {"name": "recompute", **tp2dp2, "recompute": True},
        {"name": "compile", **tp2dp2, "compile": True},
    ]}


RUNS = {"model_parallel": model_parallel_runs, "pipeline": pipeline_runs, "tp_example": tp_example_runs,
        "features": features_runs}


def launch(devices: int, dirs: dict[str, str], timeout: float, parts: Iterable[str] = PARTS) -> dict[str, dict]:
    """The runs on ``devices`` processes of each of ``parts``: ``{part: {run name: its results}}``.

    A run that must fail stops the launch's other ranks (the script launcher ends a run when a rank raises: tested in
    test_faults), so it comes last, and each further one gets a launch of its own: one launch on ``devices``
    processes, plus one per further run that must fail."""
    launches: list[dict[str, dict]] = [{}]
    failing = []
    for part in parts:
        script = PARTS[part]
        runs = RUNS[part](dirs[part]).get(devices, [])
        out = os.path.join(dirs[part], f"{WORDS[devices]}.pt")
        passing = [run for run in runs if not run.get("expect_error")]
        if passing:
            launches[0][part] = {"script": script, "out": out, "runs": passing}
        failing += [(part, {"script": script, "out": out.replace(".pt", f"-{run['name']}.pt"), "runs": [run]})
                    for run in runs if run.get("expect_error")]
    for i, (part, cfg) in enumerate(failing):
        if i:
            launches.append({})
        launches[-1][f"{part}:{cfg['runs'][0]['name']}"] = cfg
    results: dict[str, dict] = {part: {} for part in parts}
    for one_launch in launches:
        if not one_launch:
            continue
        proc = sharded_helpers.run_script(SCRIPT, {"devices": devices, "parts": list(one_launch.values())}, timeout)
        for key, cfg in one_launch.items():
            results[key.split(":")[0]].update(load_results(cfg, proc))
    return results
