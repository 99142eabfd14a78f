"""A small GPT-style Transformer trained with tensor, sequence and loss parallelism and FSDP2 (strategy="model_parallel").

    python src/torchfleet/examples/tp_transformer.py --devices 4                   # TP2 x DP2 on 4 CPU processes
    python src/torchfleet/examples/tp_transformer.py --devices 4 --tp 4            # TP4
    python src/torchfleet/examples/tp_transformer.py --devices 8 --accelerator cuda --tp 4 --precision bf16-mixed
    python src/torchfleet/examples/tp_transformer.py --devices 1                   # one process, no mesh to split

The Module parallelises itself in ``configure_model`` with ``self.device_mesh`` ("data_parallel" x
"tensor_parallel"), as Megatron-LM's layout does it:

- attention and feed-forward: the first linear layers column-wise (each tensor-parallel rank holds some heads and
  some hidden units), the last row-wise (their partial outputs summed across the ranks);
- sequence parallel: between those regions the residual stream is split along the sequence, and the norms run on
  each rank's part of it (``SequenceParallel``): activations outside the attention and feed-forward are not
  repeated on every tensor-parallel rank;
- loss parallel: the output layer's logits stay split along the vocabulary (a DTensor), and the cross-entropy
  runs on the shards inside ``torch.distributed.tensor.parallel.loss_parallel()``, forward and backward (the
  Module's ``backward`` hook), so the whole logits are never gathered;
- FSDP2 (``fully_shard``) on every block, then the whole model, over the "data_parallel" dimension.

Under any other strategy (and in one process) ``device_mesh`` is None and the same Module trains unparallelised.
The data are random token sequences whose next token follows from the current one (so the loss falls); they are
read in order (a sampler of the program's own), so every mesh sees the same global batches as one process, and
a 4-process run ends with the weights of the 1-process run (tests/examples/test_tp_transformer.py).
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, SequentialSampler, TensorDataset

import torchfleet as tf


@dataclass
class Config:
    vocab: int = 64
    dim: int = 32
    heads: int = 4
    layers: int = 2
    seq: int = 16
    hidden: int = 64


class Attention(nn.Module):
    """Causal self-attention; under tensor parallelism each rank computes its ``heads / tp`` heads."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.head_dim = cfg.dim // cfg.heads
        self.wq, self.wk, self.wv = (nn.Linear(cfg.dim, cfg.dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        # -1: the heads this rank holds (all of them without tensor parallelism)
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q), rotate(k)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def rotate(x: Tensor) -> Tensor:
    """Rotary position embedding over the (whole) sequence dimension 2 of ``(batch, heads, seq, head_dim)``."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    angles = torch.arange(x.shape[2], device=x.device, dtype=torch.float32)[:, None] * freqs
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class FeedForward(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm Transformer block. ``recompute``: activation checkpointing (set per block in configure_model)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(cfg.dim)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.dim)
        self.feed_forward = FeedForward(cfg)
        self.recompute = False

    def _forward(self, x: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))

    def forward(self, x: Tensor) -> Tensor:
        if self.recompute and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class GPT(nn.Module):
    """Token embedding, ``layers`` blocks, a final norm and an output layer over the vocabulary."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def parallelize(model: GPT, mesh, *, mp_policy=None, recompute: bool = False, compile_backend: str | None = None) -> GPT:
    """Tensor + sequence + loss parallel over ``mesh["tensor_parallel"]``, then FSDP2 over ``mesh["data_parallel"]``.

    ``mp_policy``: FSDP2's ``MixedPrecisionPolicy`` (e.g. bfloat16 compute, float32 gradient reduction);
    ``recompute``: activation checkpointing in every block; ``compile_backend``: ``torch.compile`` every block.
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp = mesh["tensor_parallel"]
    if tp.size() > 1:
        parallelize_module(model, tp, {
            # the embedding's output leaves split along the sequence (dimension 1)
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            # logits split along the vocabulary, kept as a DTensor for loss_parallel
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        })
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        for block in model.layers:
            parallelize_module(block, tp, {
                "attention_norm": SequenceParallel(),
                "attention": gather,
                "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": gather,
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            })
    dp = mesh["data_parallel"]
    shard = {"mesh": dp} if mp_policy is None else {"mesh": dp, "mp_policy": mp_policy}
    for block in model.layers:
        block.recompute = recompute
        if compile_backend is not None:
            block.compile(backend=compile_backend)
        fully_shard(block, **shard)
    fully_shard(model, **shard)
    return model


class TPTransformer(tf.Module):
    """The Trainer's Module: ``GPT`` parallelised in ``configure_model``, cross-entropy under loss_parallel.

    ``fsdp_bf16``: FSDP2 computes in bfloat16 (``MixedPrecisionPolicy``), keeping float32 parameters and
    reducing gradients in float32; ``recompute`` / ``compile_backend``: per block, see ``parallelize``.
    """

    def __init__(self, lr: float = 3e-3, fsdp_bf16: bool = False, recompute: bool = False,
                 compile_backend: str | None = None, **config) -> None:
        super().__init__()
        self.cfg = Config(**config)
        self.lr, self.fsdp_bf16, self.recompute, self.compile_backend = lr, fsdp_bf16, recompute, compile_backend
        torch.manual_seed(0)
        self.model = GPT(self.cfg)
        self.losses: list[float] = []
        self.logits_dtype: torch.dtype | None = None

    def configure_model(self) -> None:
        if self.device_mesh is None:  # another strategy, or one process: nothing to split
            return
        policy = None
        if self.fsdp_bf16:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        parallelize(self.model, self.device_mesh, mp_policy=policy, recompute=self.recompute,
                    compile_backend=self.compile_backend)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.model(tokens)

    def _loss_context(self) -> contextlib.AbstractContextManager:
        from torch.distributed.tensor.parallel import loss_parallel

        mesh = self.device_mesh
        return loss_parallel() if mesh is not None and mesh["tensor_parallel"].size() > 1 else contextlib.nullcontext()

    def training_step(self, batch, batch_idx):
        tokens, targets = batch
        logits = self(tokens)
        self.logits_dtype = logits.dtype
        with self._loss_context():  # the vocabulary-split logits: cross-entropy on the shards
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        whole = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        self.losses.append(float(whole.detach()))
        self.log("train_loss", whole.detach(), sync_dist=True, prog_bar=True)
        return loss

    def backward(self, loss: Tensor, *args, **kwargs) -> None:
        with self._loss_context():  # loss_parallel's backward must run inside it too
            loss.backward(*args, **kwargs)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)


class InOrder(SequentialSampler):
    """Read in order: the Trainer deals a sampler of one's own to the data-parallel ranks as it is (rank r of the
    "data_parallel" dimension takes items r, r + dp, ...), so each step's global batch is one process's."""


def make_data(cfg: Config, n: int = 64, seed: int = 1234) -> TensorDataset:
    """``n`` sequences: a random start, then each token ``(3 * previous + 1) mod vocab`` with 10% random noise."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.empty(n, cfg.seq + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, cfg.vocab, (n,), generator=g)
    for i in range(1, cfg.seq + 1):
        noise = torch.rand(n, generator=g) < 0.1
        tokens[:, i] = torch.where(noise, torch.randint(0, cfg.vocab, (n,), generator=g),
                                   (3 * tokens[:, i - 1] + 1) % cfg.vocab)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def loader(cfg: Config, per_rank_batch: int, n: int = 64) -> DataLoader:
    data = make_data(cfg, n)
    return DataLoader(data, batch_size=per_rank_batch, sampler=InOrder(data))


def strategy_for(devices: int, tp: int | None):
    """TP x DP over ``devices`` processes (``tp`` default: 2 when the devices are even, else 1); one process: 1x1."""
    from torchfleet.strategies import ModelParallelStrategy

    tp = tp or (2 if devices % 2 == 0 else 1)
    return ModelParallelStrategy(data_parallel_size=devices // tp, tensor_parallel_size=tp), devices // tp


def main(argv: list[str] | None = None) -> TPTransformer:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--tp", type=int, default=None, help="tensor_parallel_size (default 2, or 1 for odd devices)")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--fsdp-bf16", action="store_true", help="FSDP2 MixedPrecisionPolicy(param_dtype=bf16)")
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    strategy, dp = strategy_for(args.devices, args.tp)
    model = TPTransformer(fsdp_bf16=args.fsdp_bf16)
    trainer = tf.Trainer(strategy=strategy, accelerator=args.accelerator, devices=args.devices,
                         precision=args.precision, max_epochs=args.epochs, logger=False, enable_checkpointing=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, loader(model.cfg, args.global_batch // dp))
    if trainer.is_global_zero:
        print(f"config {asdict(model.cfg)}; loss {model.losses[0]:.4f} -> {model.losses[-1]:.4f} "
              f"in {len(model.losses)} steps")
    return model


if __name__ == "__main__":
    main()
