"""The bundled tensor/sequence/loss-parallel Transformer example, trained under several settings in one launch.

``python tp_transformer_train.py '<JSON>'``: ``{"devices": n, "out": path, "runs": [...]}``; every run is
``{"name", "dp": int, "tp": int}`` (``"strategy": "single_device"`` for one process without a mesh) with optional
``"precision"`` (the Trainer's), ``"fsdp_bf16"`` (FSDP2's bfloat16 MixedPrecisionPolicy), ``"recompute"``
(activation checkpointing per block), ``"compile"`` (a torch.compile backend per block) and ``"accelerator"``.
The global batch is ``GLOBAL_BATCH`` at every mesh. Rank 0 writes per run: the whole float32 weights, the losses
of every step averaged over the data-parallel ranks, the dtype of the logits, the dtypes of the stored parameters,
the number of graphs compiled, the forwards of block 0's attention and the mesh.
"""

from __future__ import annotations

import json
import sys

import torch

import torchfleet as tf
from tests.distributed.scripts.model_parallel_train import full_weights
from torchfleet.examples import tp_transformer as example

GLOBAL_BATCH, EPOCHS, N_SAMPLES = 8, 2, 32
STEPS = EPOCHS * N_SAMPLES // GLOBAL_BATCH


class Graphs:
    """A torch.compile backend that counts the graphs dynamo captures and runs them as captured (inductor's C++
    compilation would take minutes on a CPU runner; what is checked is that the compiled path trains)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return gm.forward


def build(run: dict, devices: int):
    """The Module, Trainer and loader of one run (the tests build their one-process references with it)."""
    from torchfleet.strategies import ModelParallelStrategy

    graphs = Graphs() if run.get("compile") else None
    model = example.TPTransformer(fsdp_bf16=run.get("fsdp_bf16", False), recompute=run.get("recompute", False),
                                  compile_backend=graphs)
    if run.get("strategy") == "single_device":
        strategy, dp = "single_device", 1
    else:
        dp, tp = run.get("dp", 1), run.get("tp", 1)
        strategy = ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp)
    calls = model.attention_calls = []  # one entry per forward of block 0's attention (twice a step if recomputed)
    model.model.layers[0].attention.register_forward_hook(lambda *_: calls.append(1))
    model.model.output.register_forward_hook(lambda m, i, out: setattr(model, "logits_layout", layout(out)))
    trainer = tf.Trainer(strategy=strategy, accelerator=run.get("accelerator", "cpu"), devices=devices,
                         precision=run.get("precision", "32-true"), max_epochs=EPOCHS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    return model, trainer, example.loader(model.cfg, GLOBAL_BATCH // dp, N_SAMPLES), graphs


def layout(t: torch.Tensor) -> str:
    """A DTensor's mesh dimensions and placements, or "plain"."""
    from torch.distributed.tensor import DTensor

    return f"{t.device_mesh.mesh_dim_names} {t.placements}" if isinstance(t, DTensor) else "plain"


def stored_dtypes(module: torch.nn.Module) -> set[str]:
    from torch.distributed.tensor import DTensor

    return {str((p.to_local() if isinstance(p, DTensor) else p).dtype) for p in module.parameters()}


def train(run: dict, devices: int) -> dict:
    tf.seed_everything(0)
    model, trainer, data, graphs = build(run, devices)
    trainer.fit(model, data)
    mesh = model.device_mesh
    # each data-parallel replica's loss is over its part of the global batch: their mean is the global batch's
    losses = torch.tensor(model.losses)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(losses)
        losses /= torch.distributed.get_world_size()
    return {
        "weights": full_weights(model), "losses": losses.tolist(), "global_step": trainer.global_step,
        "logits_dtype": str(model.logits_dtype), "param_dtypes": stored_dtypes(model),
        "graphs": None if graphs is None else graphs.count, "attention_calls": len(model.attention_calls),
        "logits_layout": model.logits_layout,
        "mesh": None if mesh is None else (tuple(mesh.mesh_dim_names), tuple(mesh.shape)),
    }


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    results = {run["name"]: train(run, cfg.get("devices", 4)) for run in cfg["runs"]}
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        torch.save(results, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
