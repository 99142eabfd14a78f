"""What the rank scripts of bench/model_parallel.py share: arguments, the example's model and data, the clock.

Not a benchmark by itself: bench/model_parallel.py starts _mp_raw.py (a hand-written loop under torchrun) and
_mp_fleet.py (the same training through ``torchfleet.Trainer``). Both train the Transformer of
src/torchfleet/examples/tp_transformer.py (``GPT``, parallelised by its ``parallelize`` for TP2xDP2) on its data,
read in order and dealt to the data-parallel ranks, with AdamW and one torch thread per process. PP2xDP2 trains
the same ``GPT`` (the same initial weights) rearranged by ``gpt_sequential`` into one ``nn.Sequential``, which
pipeline stages need (the example's ``GPT`` keeps its embedding and output layer outside its ``layers``, so it
cannot declare stages as it is): stage 0 the embedding and the first half of the blocks, stage 1 the rest, the
final norm and the output layer (``SPLIT``), each stage's blocks and then the stage fully_shard over the
"data_parallel" dimension, ``SCHEDULE`` over ``MICROBATCHES`` microbatches of each rank's batch. Rank 0 writes
a JSON result: ``steps_per_s`` (steady steps over their time, time.perf_counter at the end of each step),
``tokens_per_s`` (steps/s x global batch x sequence length), ``checksum`` (the sum of the whole trained
parameters, over every pipeline stage: equal across variants that trained alike) and per rank ``peak_rss_mib`` (the process's peak
resident memory, ru_maxrss) and ``state_mib`` (this rank's parameters, gradients and optimizer state, taken
after the last optimizer step, inside the Trainer's loop: after fit, fsdp hands back a whole model).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections import OrderedDict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _ddp_common import windowed_rate
from torch import Tensor, nn

from torchfleet.examples.tp_transformer import GPT, Config, make_data

#: PP2xDP2: torch.distributed.pipelining's schedule (torchfleet's name for it) and microbatches per rank's batch
SCHEDULE, MICROBATCHES = "1F1B", 2


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("variant")
    for name, default in (("vocab", 512), ("dim", 128), ("heads", 4), ("layers", 4), ("seq", 64),
                          ("global-batch", 8), ("steps", 30), ("warmup", 5)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--out", required=True)
    return p.parse_args()


def config(args: argparse.Namespace) -> Config:
    return Config(vocab=args.vocab, dim=args.dim, heads=args.heads, layers=args.layers, seq=args.seq,
                  hidden=4 * args.dim)


def data(args: argparse.Namespace):
    """Enough sequences for every step in one epoch (no epoch boundary inside the timing)."""
    return make_data(config(args), args.global_batch * args.steps)


def mesh_shape(variant: str, world: int) -> tuple[int, int]:
    """(data parallel, tensor parallel) of a variant's pipeline stage: tp2dp2 splits 2 x 2, pp2dp2 makes 2 stages
    of 2 data-parallel ranks, ddp and fsdp are all data parallel."""
    return (world // 2, 2) if variant.endswith("tp2dp2") else (world // pipeline_size(variant), 1)


def pipeline_size(variant: str) -> int:
    return 2 if variant.endswith("pp2dp2") else 1


def gpt_sequential(cfg: Config) -> nn.Sequential:
    """The example's ``GPT`` (seed 0, as its Module builds it) as one Sequential: tok_embeddings, block0, ...,
    norm, output. Its forward is GPT's forward; the parameters are the same tensors."""
    torch.manual_seed(0)
    gpt = GPT(cfg)
    return nn.Sequential(OrderedDict([("tok_embeddings", gpt.tok_embeddings),
                                      *((f"block{i}", block) for i, block in enumerate(gpt.layers)),
                                      ("norm", gpt.norm), ("output", gpt.output)]))


def split_point(cfg: Config) -> str:
    """Where stage 1 begins in ``gpt_sequential``'s children: the middle block."""
    return f"block{cfg.layers // 2}"


def token_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """The cross-entropy of every variant's step (a microbatch's under pipeline parallelism)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class StepClock:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.ends = args, []

    def step_end(self) -> None:
        self.ends.append(time.perf_counter())

    def finish(self, model: nn.Module, optimizer: torch.optim.Optimizer, stages: int = 1) -> None:
        """Every rank: gather the memory figures and the checksum; rank 0 writes the result. ``stages``: pipeline
        stages, the outermost mesh dimension (rank 0 adds the checksums of ranks 0, world / stages, ...)."""
        from torch.distributed.tensor import DTensor

        def local(t: torch.Tensor) -> torch.Tensor:
            return t.to_local() if isinstance(t, DTensor) else t

        def mib(tensors) -> float:
            return sum(t.numel() * t.element_size() for t in tensors) / 2**20

        params = list(model.parameters())
        with torch.no_grad():  # this rank's stage: full_tensor gathers over the data- and tensor-parallel ranks
            checksum = float(sum((p.full_tensor() if isinstance(p, DTensor) else p).double().sum() for p in params))
        parts = {"params_mib": mib(local(p) for p in params),
                 "grads_mib": mib(local(p.grad) for p in params if p.grad is not None),
                 "optimizer_mib": mib(local(v) for s in optimizer.state.values() for v in s.values()
                                      if isinstance(v, torch.Tensor))}
        mine = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "state_mib": sum(parts.values()), "checksum": checksum, **parts}
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
        if dist.get_rank() != 0:
            return
        checksum = sum(r["checksum"] for r in ranks[::len(ranks) // stages])
        args, steady = self.args, self.ends[self.args.warmup:]
        rate = (len(steady) - 1) / (steady[-1] - steady[0])
        result = {"variant": args.variant, "steps_per_s": rate, "steps_per_s_windowed": windowed_rate(steady),
                  "tokens_per_s": rate * args.global_batch * args.seq, "checksum": checksum, "ranks": ranks}
        with open(args.out, "w") as f:
            json.dump(result, f)
