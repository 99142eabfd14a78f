"""What the rank scripts of bench/sharded.py and bench/memory.py share: arguments, model, data, clock, probes.

Not a benchmark by itself: bench/sharded.py and bench/memory.py start _sharded_raw.py (a hand-written
``fully_shard`` or ``deepspeed.initialize`` loop under torchrun) and _sharded_fleet.py (the same
training through ``torchfleet.Trainer``). Both train the same model on the same data with Adam and
one torch thread per process (2 ranks, DistributedSampler seeded 0 and shuffled, mean squared error)
and write JSON results:

* the model: ``--blocks`` residual MLP blocks ``x + fc2(gelu(fc1(layernorm(x))))`` of width
  ``--width`` (hidden 4 x width), applied to ``--seq`` positions of a random input; every block is one
  FSDP unit (``fully_shard`` per block, then the root) and DeepSpeed ZeRO-3 gathers it per block;
* throughput (global rank 0 writes ``--out``): ``steps_per_s`` (steps after the warm-up over the time
  they took, time.perf_counter at the end of every step), ``steps_per_s_windowed`` (rate of the
  median of ~50 windows of those steps), ``marks`` (seconds since the driver started the command:
  ``imported``, ``process_group``, ``engine_ready``, ``first_step``), rank 0's CPU time per steady
  step, ``checksum`` = [sum, sum of squares] of the full trained parameters (gathered from the shards
  by every rank, in float64): equal across variants that trained alike;
* memory (``--memory``, every rank writes ``--out`` with ``.rank<r>`` inserted): see MemoryProbe.

DeepSpeed builds C++ ops on first use (``deepspeed_shm_comm`` on every CPU start, ~100 s once; cached
in TORCH_EXTENSIONS_DIR, which the drivers point at ~/.cache/torchfleet/torch_extensions unless set).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import time
from typing import Any

import torch
import torch.nn.functional as F
from _ddp_common import Clock, since_launch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args(variants: list[str], raw: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variant", choices=variants)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--blocks", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True, help="positions per sample")
    parser.add_argument("--batch", type=int, required=True, help="samples per process and step")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--batches-per-epoch", type=int, default=8, help="per process")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--precision", default="32-true", help="the Trainer's precision (torchfleet variants only)")
    parser.add_argument("--out", required=True, help="JSON result (rank 0; every rank with --memory)")
    parser.add_argument("--memory", action="store_true",
                        help="memory run: probe model states after step 1 and through step 2 (see MemoryProbe)")
    parser.add_argument("--cprofile", default="", help="dump cProfile stats of rank 0's steady steps here")
    parser.add_argument("--timers", action="store_true", help="(accepted for Clock; unused)")
    if raw:
        parser.add_argument("--ds-config", choices=["matched", "minimal"],
                            default=os.environ.get("BENCH_DS_CONFIG", "matched"),
                            help="raw DeepSpeed config: torchfleet's default ZeRO settings (matched), or the stage "
                            "alone (minimal); default: $BENCH_DS_CONFIG or matched")
    args = parser.parse_args()
    os.environ.setdefault("BENCH_T0", repr(time.time()))  # run by hand: count from here
    return args


class Block(nn.Module):
    """One residual MLP block; the unit FSDP shards and ZeRO-3 gathers."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def make_model(width: int, blocks: int) -> nn.Sequential:
    return nn.Sequential(*(Block(width) for _ in range(blocks)))


def param_count(width: int, blocks: int) -> int:
    return blocks * (2 * width + 4 * width * width + 4 * width + 4 * width * width + width)


def dataset(args: argparse.Namespace, world: int) -> torch.utils.data.TensorDataset:
    """The same tensors in every process and variant: ``batches_per_epoch`` batches per rank."""
    n = args.batches_per_epoch * args.batch * world
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, args.seq, args.width, generator=g)
    y = torch.randn(n, args.seq, args.width, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, y)


def extensions_dir() -> None:
    """Share DeepSpeed's C++ op builds with torchfleet's CI cache unless the user chose a folder."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/torchfleet/torch_extensions"))


def _full(p: torch.Tensor) -> torch.Tensor:
    """The whole parameter on every rank: a collective for DTensors, the tensor itself otherwise."""
    from torch.distributed.tensor import DTensor

    return p.full_tensor() if isinstance(p, DTensor) else p


def param_checksum(module: nn.Module) -> list[float]:
    """[sum, sum of squares] of the full parameters in float64; every rank must call it (gathers shards)."""
    params = list(module.parameters())
    if any(hasattr(p, "ds_tensor") for p in params):  # DeepSpeed ZeRO-3: gather, read, release
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            return _sums(p.detach() for p in params)
    return _sums(_full(p.detach()) for p in params)


def _sums(tensors: Any) -> list[float]:
    s = q = 0.0
    with torch.no_grad():
        for t in tensors:
            t = t.double()
            s += float(t.sum())
            q += float((t * t).sum())
    return [s, q]


class ShardedClock(Clock):
    """bench/_ddp_common.py's clock, with a result whose checksum every rank computed together."""

    def finish_sharded(self, rank: int, checksum: list[float], loss: float, extra: dict | None = None) -> None:
        if self.profiler is not None:
            self.profiler.disable()
        if rank != 0:
            return
        if self.profiler is not None:
            self.profiler.dump_stats(self.args.cprofile)
        from _ddp_common import windowed_rate

        steady = self.n - self.warmup
        result = {
            "variant": self.args.variant,
            "steps": self.n,
            "steady_steps": steady,
            "steps_per_s": steady / (self.t_last - self.t_warm) if steady > 0 else float("nan"),
            "steps_per_s_windowed": windowed_rate(self.ends),
            "marks": self.marks,
            "cpu_us_per_step": (self.cpu_last[0] - self.cpu_warm[0]) / max(steady, 1) * 1e6,
            "main_thread_cpu_us_per_step": (self.cpu_last[1] - self.cpu_warm[1]) / max(steady, 1) * 1e6,
            "checksum": checksum,
            "final_loss": loss,
            "threads": torch.get_num_threads(),
            "world_size": torch.distributed.get_world_size(),
            **(extra or {}),
        }
        write_json(self.args.out, result)


def write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------
# Memory


#: what each storage is counted as; the first four are the ZeRO paper's "model states"
CATEGORIES = ("params", "grads", "optimizer", "master", "gathered", "buffers", "other")
MODEL_STATES = ("params", "grads", "optimizer", "master")

# Attributes of DeepSpeed's ZeRO optimizers and of FSDP2's FSDPParam/FSDPParamGroup, by what they hold
# (read from DeepSpeed 0.19.8 and torch 2.13; an attribute not named here falls to the patterns below).
_KNOWN = {
    # DeepSpeed ZeRO 1/2
    "bit16_groups": "params", "bit16_groups_flat": "params", "parallel_partitioned_bit16_groups": "params",
    "single_partition_of_fp32_groups": "master", "averaged_gradients": "grads", "grads_in_partition": "grads",
    "accumulated_grads_in_cpu": "grads", "ipg_buffer": "buffers",
    "param_buffer_of_bit16_for_cpu_offload_groups": "buffers",
    # DeepSpeed ZeRO 3
    "fp16_groups": "params", "fp16_partitioned_groups": "params", "fp16_partitioned_groups_flat": "params",
    "persistent_parameters": "params", "lp_param_buffer": "params", "fp32_partitioned_groups_flat": "master",
    "grad_partitions_flat_buffer": "grads", "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition": "grads",
    # FSDP2
    "_sharded_param_data": "params", "sharded_param": "params", "_unsharded_param": "gathered",
    "all_gather_outputs": "gathered", "_sharded_post_forward_param_data": "gathered",
    "_all_gather_result": "buffers", "reduce_scatter_states": "buffers",
}
_PATTERNS = [
    (re.compile(r"unsharded|all_gather|post_forward"), "gathered"),
    (re.compile(r"ipg|bucket|buffer"), "buffers"),
    (re.compile(r"grad"), "grads"),
    (re.compile(r"fp32|master"), "master"),
]


def _category(name: str) -> tuple[str, bool]:
    """What an engine attribute holds, and whether its name says so (else: an engine buffer, by default)."""
    leaf = name.split(".")[0]
    if leaf in _KNOWN:
        return _KNOWN[leaf], True
    for pattern, cat in _PATTERNS:
        if pattern.search(leaf):
            return cat, True
    return "buffers", False


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(address, bytes) of the memory behind a tensor; None for tensors without their own (meta, wrappers)."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t._local_tensor
    if t.device.type == "meta":
        return None
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return s.data_ptr(), s.nbytes()


def _is_engine_object(obj: object) -> bool:
    mod = type(obj).__dict__.get("__module__")  # not type(obj).__module__: a metaclass may make that a descriptor
    return isinstance(mod, str) and (mod.startswith("deepspeed.runtime.zero") or mod.startswith("torch.distributed.fsdp._fully_shard")) \
        and not isinstance(obj, nn.Module)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_mincore: Any = None


def resident_bytes(address: int, nbytes: int) -> int:
    """How many of the bytes at [address, address + nbytes) sit in RAM now (mincore(2) on their pages).

    A CPU tensor made by torch.empty (DeepSpeed's buckets) costs address space only until it is
    written; this counts what is really resident. Pages shared with neighbours count whole, clipped to
    ``nbytes``. Where mincore is not available, every byte counts.
    """
    global _mincore
    if _mincore is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            _mincore = (ctypes, libc.mincore)
        except (OSError, AttributeError):
            _mincore = False
    if not _mincore:
        return nbytes
    ctypes, mincore = _mincore
    start = address - address % _PAGE
    pages = (address + nbytes - start + _PAGE - 1) // _PAGE
    vec = (ctypes.c_ubyte * pages)()
    if mincore(start, pages * _PAGE, vec) != 0:
        return nbytes
    return min(nbytes, sum(b & 1 for b in vec) * _PAGE)


def rss() -> dict[str, int]:
    """This process's resident set size now and its peak (VmHWM) in bytes (Linux /proc; {} elsewhere)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":")
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def reset_peak_rss() -> bool:
    """Make VmHWM restart from the current RSS (writing 5 to /proc/self/clear_refs, Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class MemoryProbe:
    """Counts the bytes of every tensor this process can reach from Python, by what the bytes hold.

    A snapshot walks ``gc.get_objects()`` for tensors (a DTensor counts its local shard), groups them by
    the storage behind them (views of one flat buffer count once, a whole storage counts even where only
    part of it is viewed: padding included) and labels each storage, first label wins:

    * ``params``: the storages of the module's parameters as the engine leaves them (DDP: the whole
      tensor; FSDP2: the local shard; ZeRO-3: ``param.ds_tensor``, the rank's partition; ZeRO-1/2: the
      flat buffer the parameters are views of);
    * ``grads``: ``param.grad`` (local shard) and gradients DeepSpeed keeps in its own partitions;
    * ``optimizer``: the tensors in a torch optimizer's ``state`` (Adam's exp_avg, exp_avg_sq, step);
    * ``master``: what a torch optimizer updates that is not a model parameter: DeepSpeed's fp32 copy of
      the rank's partition (ZeRO-1/2 clone it even in fp32 training; ZeRO-3 shares the storage in fp32);
    * ``gathered``: whole parameters rebuilt for compute (FSDP2's all-gather output, ZeRO-3's gathered
      ``param.data``) - transient;
    * ``buffers``: other tensors held by the engine (DeepSpeed's reduce buckets, FSDP2's comm buffers);
    * ``other``: every other tensor Python can see (the data set, activations held in Python, ...).

    ``params + grads + optimizer + master`` are the model states of the ZeRO paper. Tensors only C++ can
    see are missed (the autograd graph's saved activations, DDP's gradient buckets): the process RSS
    shows them; DDP's bucket bytes are read from DDP's logging data (``ddp_buckets``). ``offloaded`` counts model-state bytes an engine declares offloaded to the CPU (FSDP2's
    CPUOffloadPolicy, DeepSpeed's offload_optimizer/offload_param).
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.samples: list[dict[str, Any]] = []
        self.sampling = False
        self._handles: list[Any] = []

    # -- one snapshot ------------------------------------------------------------------------------------
    def snapshot(self, point: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        tensor_type = torch.Tensor
        storages: dict[int, int] = {}
        optimizers, engines = [], []
        ddp_buckets = 0
        for obj in gc.get_objects():
            kind = type(obj)
            if issubclass(kind, tensor_type):
                st = _storage(obj)
                if st is not None and st[1] > 0:
                    storages[st[0]] = st[1]
            elif issubclass(kind, DistributedDataParallel):
                ddp_buckets += _ddp_bucket_bytes(obj)
            elif issubclass(kind, torch.optim.Optimizer):
                optimizers.append(obj)
            elif _is_engine_object(obj):
                engines.append(obj)
        labels: dict[int, str] = {}
        detail: dict[str, int] = {}
        offloaded: set[int] = set()

        def label(t: Any, cat: str, where: str, off: bool = False) -> None:
            if not isinstance(t, torch.Tensor):
                return
            st = _storage(t)
            if st is None or st[1] == 0 or st[0] not in storages:
                return
            if st[0] not in labels:
                labels[st[0]] = cat
                detail[where] = detail.get(where, 0) + st[1]
            if off:
                offloaded.add(st[0])

        def walk(e: Any, buffers: bool | None = None) -> None:
            fsdp_off = getattr(e, "offload_to_cpu", False) is True
            opt_off, param_off = _ds_offloaded([e]), getattr(e, "offload_param", False) is True
            for name, value in getattr(e, "__dict__", {}).items():
                cat, named = _category(name)
                off = fsdp_off or (param_off if cat == "params" else opt_off and cat in ("grads", "optimizer", "master"))
                if buffers is None or buffers == (cat == "buffers" and named):
                    for t in _tensors_in(value):
                        label(t, cat, f"{type(e).__name__}.{name}", off and cat in MODEL_STATES)

        # FSDP2 first: during forward/backward the module holds the gathered parameters, not the shards.
        # DeepSpeed's buckets next: while a gradient waits in one, param.grad is a view of the bucket.
        fsdp = [e for e in engines if type(e).__module__.startswith("torch.distributed.fsdp")]
        fsdp_ids = {id(e) for e in fsdp}
        others = [e for e in engines if id(e) not in fsdp_ids]
        for e in others:
            walk(e, buffers=True)
        offloaded_params = {id(e.sharded_param) for e in fsdp
                            if type(e).__name__ == "FSDPParam" and getattr(e, "offload_to_cpu", False)}
        for e in fsdp:
            walk(e)
        ds_off = _ds_offloaded(engines)
        ds_params_off = any(getattr(e, "offload_param", False) is True for e in others)
        params = list(self.module.parameters())
        model_ids = {id(p) for p in params}
        for p in params:
            ds = getattr(p, "ds_tensor", None)
            if ds is not None:
                label(ds, "params", "param.ds_tensor", ds_params_off)
                if p.numel() > 0:
                    label(p, "gathered", "param (gathered by ZeRO-3)")
            else:
                label(p, "params", "module.parameters()", id(p) in offloaded_params)
        for p in params:
            label(p.grad, "grads", "param.grad", id(p) in offloaded_params)
        for opt in optimizers:
            for p, state in opt.state.items():
                for v in state.values() if isinstance(state, dict) else ():
                    label(v, "optimizer", "optimizer.state", id(p) in offloaded_params or ds_off)
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in model_ids:
                        label(p, "master", "optimizer params (not the model's)", ds_off)
                        label(p.grad, "grads", "optimizer params' .grad", ds_off or id(p) in offloaded_params)
        for e in others:
            walk(e, buffers=False)
        by_cat = dict.fromkeys(CATEGORIES, 0)
        resident = dict.fromkeys(CATEGORIES, 0)
        for key, nbytes in storages.items():
            cat = labels.get(key, "other")
            by_cat[cat] += nbytes
            resident[cat] += resident_bytes(key, nbytes)
        snap = {
            "point": point,
            "bytes": by_cat,
            "resident": resident,
            "model_states": sum(by_cat[c] for c in MODEL_STATES),
            "model_states_resident": sum(resident[c] for c in MODEL_STATES),
            "all_tensors": sum(by_cat.values()),
            "all_tensors_resident": sum(resident.values()),
            "ddp_buckets": ddp_buckets,
            "offloaded": sum(storages[k] for k in offloaded if labels.get(k) in MODEL_STATES),
            "detail": dict(sorted(detail.items(), key=lambda kv: -kv[1])),
            "rss": rss().get("VmRSS", 0),
            "probe_s": time.perf_counter() - t0,
        }
        return snap

    # -- sampling through a step ---------------------------------------------------------------------------
    def point(self, name: str) -> None:
        """Take a snapshot now if this step is being sampled."""
        if self.sampling:
            self.samples.append(self.snapshot(name))

    def attach(self) -> None:
        """Hooks that sample before each block's forward and when its backward starts (its output's grad)."""
        blocks = [m for m in self.module.modules() if isinstance(m, Block)]  # fully_shard subclasses it
        for i, block in enumerate(blocks):
            def pre(mod: nn.Module, inputs: Any, i: int = i) -> None:
                self.point(f"forward block {i}")

            def post(mod: nn.Module, inputs: Any, output: Any, i: int = i) -> None:
                if self.sampling and isinstance(output, torch.Tensor) and output.requires_grad:
                    output.register_hook(lambda grad, i=i: self.point(f"backward block {i}"))

            self._handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def _ddp_bucket_bytes(ddp: DistributedDataParallel) -> int:
    """Bytes of DDP's gradient buckets, which its C++ reducer holds (invisible to gc) unless grads view them."""
    if ddp.gradient_as_bucket_view:
        return 0  # then param.grad is a view of a bucket: already counted as grads
    try:
        sizes = ddp._get_ddp_logging_data().get("bucket_sizes", "")
        return sum(int(s) for s in str(sizes).split(",") if s.strip())
    except (RuntimeError, ValueError, AttributeError):
        return 0


def _ds_offloaded(engines: list[Any]) -> bool:
    """Whether a DeepSpeed ZeRO optimizer among ``engines`` keeps its optimizer partitions offloaded to the CPU."""
    return any(getattr(e, "cpu_offload", False) is True or getattr(e, "offload_optimizer", False) is True
               for e in engines if type(e).__module__.startswith("deepspeed"))


def _tensors_in(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """Tensors inside lists, tuples, dicts and small DeepSpeed holder objects, a few levels deep."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 3:
        return []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v, depth + 1)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v, depth + 1)]
    if type(value).__module__.startswith("deepspeed.runtime.zero") and hasattr(value, "__dict__") \
            and not isinstance(value, nn.Module) and type(value).__name__ in ("IPGBucket",):
        return [t for v in vars(value).values() for t in _tensors_in(v, depth + 1)]
    return []


class MemoryRun:
    """The memory protocol every memory run follows (raw or torchfleet), driven from its training loop.

    ``step_start``/``step_end`` bracket each training step; ``after_backward``/``after_step`` mark those
    points. After step 1's optimizer step: one snapshot ("after step 1") and the peak RSS so far; then
    VmHWM is reset and step 2 is sampled at every point (before each block's forward, at the start of
    each block's backward, after backward, after the optimizer step): the peak of the model states, of
    all tensors, and the peak RSS of step 2. Every rank writes its own JSON.
    """

    def __init__(self, args: argparse.Namespace, module: nn.Module, rank: int, extra: dict | None = None) -> None:
        self.args, self.rank = args, rank
        self.probe = MemoryProbe(module)
        self.probe.attach()
        self.step = 0
        self.result: dict[str, Any] = {"variant": args.variant, "rank": rank, **(extra or {})}
        self.result["rss_before_model"] = _RSS_BEFORE_MODEL

    def step_start(self) -> None:
        self.step += 1
        if self.step == 2:
            self.result["peak_rss_to_step1"] = rss().get("VmHWM", 0)
            self.result["peak_rss_reset"] = reset_peak_rss()
            self.probe.sampling = True
            self.probe.point("step 2 start")

    def after_backward(self) -> None:
        self.probe.point("after backward")

    def after_step(self) -> None:
        if self.step == 1:
            self.result["after_step1"] = self.probe.snapshot("after step 1 (before zero_grad)")
        self.probe.point("after optimizer step")

    def step_end(self) -> None:
        if self.step == 2:
            self.probe.sampling = False
            self.result["peak_rss_step2"] = rss().get("VmHWM", 0)
            samples = self.probe.samples
            keys = ("point", "bytes", "resident", "model_states", "model_states_resident", "all_tensors",
                    "all_tensors_resident", "ddp_buckets", "rss")
            self.result["samples"] = [{k: s[k] for k in keys} for s in samples]
            if samples:
                self.result["peak_model_states"] = max(samples, key=lambda s: s["model_states"])
                self.result["peak_all_tensors"] = max(samples, key=lambda s: s["all_tensors"])
            self.probe.detach()

    def finish(self, extra: dict | None = None) -> None:
        self.result["rss_end"] = rss().get("VmRSS", 0)
        self.result.update(extra or {})
        base, ext = os.path.splitext(self.args.out)
        write_json(f"{base}.rank{self.rank}{ext}", self.result)


_RSS_BEFORE_MODEL = 0


def mark_rss_before_model() -> None:
    """Remember this process's RSS with everything imported, before the model exists."""
    global _RSS_BEFORE_MODEL
    _RSS_BEFORE_MODEL = rss().get("VmRSS", 0)


__all__ = ["Block", "CATEGORIES", "MODEL_STATES", "MemoryProbe", "MemoryRun", "ShardedClock", "dataset",
           "extensions_dir", "loss_fn", "make_model", "param_checksum", "param_count", "parse_args", "rss",
           "since_launch", "write_json"]
