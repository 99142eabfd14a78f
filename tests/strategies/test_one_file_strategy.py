"""Issue 21's claim: a new multi-process strategy is one file in strategies/ plus its registration.

``MESH_STRATEGY`` is such a file, written only against the public pieces (ParallelStrategy, ``arguments.takes``,
``processes.ProcessOptions``): FSDP2 over a 2-D device mesh (data x model), the shape of Lightning's
ModelParallelStrategy. The cheap test checks what it gets without writing any of it (its signature with the shared
keywords and their defaults, the checked process options, the launcher, max_restarts); the distributed one
registers it and trains with the Trainer on 2 processes over gloo, the script re-run for rank 1.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
import torch

from torchfleet.errors import ConfigurationError

MESH_STRATEGY = '''
from __future__ import annotations

from typing import Any

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

from torchfleet.strategies.arguments import PARALLEL, pick, takes
from torchfleet.strategies.parallel import ParallelStrategy
from torchfleet.strategies.processes import ProcessOptions


class MeshStrategy(ParallelStrategy):
    """FSDP2 over a (data, model) mesh: shards over the model dimension, replicates over the data one."""

    @takes("data_parallel_size", "accelerator", "parallel_devices", "cluster_environment", "checkpoint_io",
           "precision", "process_group_backend", "timeout", "start_method", "precision_plugin", "max_restarts")
    def __init__(self, given: dict[str, Any], data_parallel_size: int = 1) -> None:
        super().__init__(**pick(given, PARALLEL))
        self.processes = ProcessOptions.of(given)
        self.data_parallel_size = data_parallel_size
        self.mesh = None

    def setup_module(self, module):
        shape = (self.data_parallel_size, self.world_size // self.data_parallel_size)
        self.mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=("data", "model"))
        fully_shard(module, mesh=self.mesh)
        register_fsdp_forward_method(module, "training_step")
        return module

    def setup_and_build_optimizers(self, module, build):
        module = self.setup_module_and_optimizers(module, [])[0]
        return module, build()
'''

TRAIN = '''
import json
import sys

import torch
import torch.distributed as dist

import torchfleet as tf
from mesh_strategy import MeshStrategy
from tests.helpers import Regressor, loader, quiet
from torchfleet.strategies import StrategyRegistry

StrategyRegistry.register("mesh", MeshStrategy, data_parallel_size=1, description="FSDP2 on a 2-D mesh")
trainer = tf.Trainer(strategy="mesh", devices=2, max_steps=3, **quiet())
strategy = trainer.strategy
trainer.fit(Regressor(), loader(n=32, batch_size=4))
weight = trainer.lightning_module.net[0].weight  # a DTensor: this rank's shard of the (16, 8) weight
seen = {"rank": trainer.global_rank, "world": trainer.world_size, "launcher": type(strategy.launcher).__name__,
        "joined": dist.is_initialized(), "backend": dist.get_backend() if dist.is_initialized() else None,
        "mesh": list(strategy.mesh.shape), "steps": trainer.global_step, "rows": [weight.to_local().shape[0], weight.full_tensor().shape[0]]}
with open(f"{sys.argv[1]}/rank{trainer.global_rank}.json", "w") as f:
    json.dump(seen, f)
'''


def _load(tmp_path):
    (tmp_path / "mesh_strategy.py").write_text(MESH_STRATEGY)
    spec = importlib.util.spec_from_file_location("mesh_strategy", tmp_path / "mesh_strategy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MeshStrategy


def test_a_strategy_in_one_file_gets_the_shared_keywords_options_and_launcher(tmp_path):
    from torchfleet.environments.local import LocalEnvironment
    from torchfleet.launchers.processes import ProcessLauncher
    from torchfleet.launchers.script import ScriptLauncher

    mesh_strategy = _load(tmp_path)
    params = inspect.signature(mesh_strategy).parameters
    assert list(params)[:2] == ["data_parallel_size", "accelerator"]
    assert params["timeout"].default == timedelta(minutes=30) and params["start_method"].default == "popen"
    assert params["max_restarts"].default == 0 and params["process_group_backend"].default is None

    strategy = mesh_strategy(data_parallel_size=2, timeout=5, process_group_backend="gloo")
    assert strategy.timeout == timedelta(seconds=5) and strategy.process_group_backend == "gloo"
    strategy.configure([torch.device("cpu")] * 2, 1, LocalEnvironment())
    assert isinstance(strategy.launcher, ScriptLauncher) and strategy.world_size == 2
    strategy.max_restarts = 2
    assert strategy.launcher.max_restarts == 2

    spawned = mesh_strategy(None, start_method="spawn")  # positions as declared: the first is its own keyword
    spawned.configure([torch.device("cpu")] * 2, 1, LocalEnvironment())
    assert isinstance(spawned.launcher, ProcessLauncher) and spawned.data_parallel_size is None

    for bad in ({"start_method": "thread"}, {"timeout": -1}, {"max_restarts": -1}):
        with pytest.raises(ConfigurationError):
            mesh_strategy(**bad)
    with pytest.raises(TypeError, match="unexpected keyword"):
        mesh_strategy(sharding="full")


@pytest.mark.distributed
def test_a_strategy_in_one_file_registered_trains_on_two_processes(tmp_path):
    from tests.distributed.test_ddp import ROOT, pythonpath

    _load(tmp_path)
    script = tmp_path / "train_mesh.py"
    script.write_text(TRAIN)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=180,
                          env={**env, "OMP_NUM_THREADS": "1",
                               "PYTHONPATH": os.pathsep.join([str(tmp_path), pythonpath()])}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, s in enumerate(seen):
        assert (s["rank"], s["world"], s["launcher"], s["joined"], s["backend"]) == (rank, 2, "ScriptLauncher", True,
                                                                                    "gloo")
        # sharded over the model dimension of the mesh: each rank holds half of the rows
        assert s["mesh"] == [1, 2] and s["steps"] == 3 and s["rows"] == [8, 16]
