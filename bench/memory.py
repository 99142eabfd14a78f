"""Per-rank memory of model states under ddp, fsdp and deepspeed, 2 CPU processes, fp32 Adam, ~100M parameters.

    python bench/memory.py            # full: the 100.7M-parameter model, 5 variants, ~3-4 minutes on 2 cores
    python bench/memory.py --quick    # smoke run, < 90 s: an 8.4M-parameter model
    python bench/memory.py --precision bf16-mixed   # the ZeRO paper's mixed-precision case
    python bench/memory.py --variants ""            # only the DeepSpeed peaks below (~1-2 minutes)
    options: --variants ddp,fsdp,... (add raw_fsdp, raw_deepspeed_stage_3, deepspeed_stage_1, ..._offload),
             --width W --blocks B (model size), --save results.json, --keep

Variants (each a fresh pair of processes, gloo, 1 torch thread each; torchfleet.Trainer with the
registered strategy of that name, ``auto_wrap_policy={Block}`` for fsdp*): ddp (the baseline), fsdp
(FSDP2 FULL_SHARD), fsdp_cpu_offload, deepspeed_stage_2, deepspeed_stage_3. On request: deepspeed_stage_1,
deepspeed_stage_2_offload, deepspeed_stage_3_offload (CPU offload builds DeepSpeed's cpu_adam op on first
use, ~4 min), and the engines driven by hand without torchfleet (raw_fsdp, raw_fsdp_cpu_offload,
raw_deepspeed_stage_1/2/3: a ``fully_shard`` or ``deepspeed.initialize`` loop under torchrun, with
DeepSpeed's own default config) to see what torchfleet adds.

Model: 12 residual MLP blocks of width 1024 (100.7M parameters, every block its own FSDP unit), fp32,
torch.optim.Adam, 1 sample of 16 positions per rank and step (activations are tiny next to the model
states), 3 steps. Each rank counts what it holds (bench/_sharded_common.py, MemoryProbe): every tensor
Python can reach, grouped by the storage behind it and labelled params / grads / optimizer state /
master copy (a fp32 copy of the parameters an optimizer updates) / gathered (whole parameters rebuilt
for compute) / engine buffers / other. A DTensor counts its local shard, ZeRO-3 its partition
(``ds_tensor``), DeepSpeed its flat buffers and partitions.

Metrics (per rank; the table shows the larger of the two ranks):
  model states         params + grads + optimizer + master, the ZeRO paper's "model states": the peak
                       over the points sampled in step 2 (before every block's forward, when every
                       block's backward starts, after backward, after the optimizer step) and, in the
                       detail lines, the value after step 1's optimizer step; in bytes per parameter
                       and GB (10^9 bytes), next to the ZeRO paper's prediction for fp32 Adam with N=2
                       ranks (DDP 4+4+8 = 16 B/param; ZeRO-1 4+4+8/N; ZeRO-2 4+(4+8)/N; ZeRO-3 and FSDP
                       FULL_SHARD 16/N) and as a ratio to ddp's (target: fsdp and deepspeed_stage_3
                       <= 0.6x ddp);
  offloaded            the part of the model states the engine declares offloaded to the CPU (on a
                       CPU-only machine it sits in the same RAM);
  buffers              engine buffers (DeepSpeed's reduce/all-gather buckets, FSDP2's communication
                       buffers; DDP's C++ gradient buckets, read from DDP's logging data) at the sampled
                       peak of all tensors: allocated, and resident (pages really in RAM, mincore(2): a
                       bucket made by torch.empty costs address space until written);
  all tensors          the peak over the sampled points of every tensor Python can see, resident;
  RSS                  the process's resident set: after imports before the model exists, its peak up
                       to the end of step 1 (model creation, wrapping, first step: the whole model is
                       built in every process before it is sharded), and its peak during step 2
                       (/proc/self/status VmHWM, reset with /proc/self/clear_refs before step 2).
DeepSpeed peaks (after the table; --no-peaks leaves them out): one more launch of 2 ranks, the measuring
harness of tests/distributed/test_memory_estimate.py (tests/distributed/scripts/memory_train.py: torch's
MemTracker over the third step, DeepSpeed's flat buffers, master partition, gradient partitions and buckets
counted once each, see docs/memory.md), ZeRO 2 and 3 x activation checkpointing x fp32 / bf16-mixed on 4 MLP
blocks of width 128 and 1024 rows, 20,000-element buckets: the planner's peak, parameters and optimizer
states (master partition included) beside the measured ones, the larger of the 2 ranks.
The runs set MALLOC_MMAP_THRESHOLD_=131072 so that freed tensors go back to the system and RSS follows
the live tensors (--no-malloc-tuning to leave glibc's defaults).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time

from _sharded_driver import available, extensions_note, load_average, run_once, versions

FULL = {"width": 1024, "blocks": 12, "seq": 16, "batch": 1, "steps": 3, "warmup": 1, "batches_per_epoch": 2}
QUICK = {"width": 512, "blocks": 4}
DEFAULT_VARIANTS = ["ddp", "fsdp", "fsdp_cpu_offload", "deepspeed_stage_2", "deepspeed_stage_3"]
OPTIONAL = ["deepspeed_stage_1", "deepspeed_stage_2_offload", "deepspeed_stage_3_offload", "raw_fsdp",
            "raw_fsdp_cpu_offload", "raw_deepspeed_stage_1", "raw_deepspeed_stage_2", "raw_deepspeed_stage_3"]
TARGET = 0.6
TARGETED = ("fsdp", "deepspeed_stage_3")
N = 2


def predicted(variant: str, precision: str = "32-true") -> tuple[float, str]:
    """The ZeRO paper's model-state bytes per parameter for Adam on N ranks, and the formula.

    fp32: params 4 + grads 4 + Adam 8. Mixed precision (the paper's case): 16-bit params 2 + 16-bit
    grads 2 + fp32 master copy and Adam 12; torchfleet's ddp under "-mixed" keeps fp32 params and
    grads (autocast), 4 + 4 + 8, the same 16.
    """
    name = variant.removeprefix("raw_").removesuffix("_cpu_offload").removesuffix("_offload")
    if precision.endswith("-mixed"):
        return {"ddp": (16.0, "4+4+8"), "fsdp": (16.0 / N, "16/N"), "deepspeed_stage_3": (16.0 / N, "16/N"),
                "deepspeed_stage_2": (2 + 14.0 / N, "2+14/N"),
                "deepspeed_stage_1": (4 + 12.0 / N, "2+2+12/N")}.get(name, (float("nan"), "?"))
    if name == "ddp":
        return 16.0, "4+4+8"
    if name in ("fsdp", "deepspeed_stage_3"):
        return 16.0 / N, "16/N"
    if name == "deepspeed_stage_2":
        return 4 + 12.0 / N, "4+12/N"
    if name == "deepspeed_stage_1":
        return 8 + 8.0 / N, "4+4+8/N"
    return float("nan"), "?"


def planner_prediction(variant: str, cfg: dict) -> dict[str, float] | None:
    """What ``torchfleet.estimate_memory`` predicts per rank for ``variant`` (torchfleet variants only): the model
    states (params + grads + optimizer states and master copy, offloaded ones included, as the probe counts them on the
    CPU), the offloaded bytes and
    the peak of live tensors. The same Net and strategy as the runs (_sharded_fleet.py), built on the meta device,
    estimated in this process on fake tensors before anything is launched."""
    if variant.startswith("raw_"):
        return None
    import types

    import torch
    from _sharded_fleet import Net, strategy

    import torchfleet

    clock = types.SimpleNamespace(step_start=lambda: None)
    with torch.device("meta"):
        net = Net(types.SimpleNamespace(width=cfg["width"], blocks=cfg["blocks"], lr=1e-3), clock)
    shape = (cfg["batch"], cfg["seq"], cfg["width"])
    estimate = torchfleet.estimate_memory(net, (torch.empty(shape), torch.empty(shape)), strategy=strategy(variant),
                                          devices=N, precision=cfg.get("precision", "32-true"))
    # on the CPU the probe counts offloaded model states with the others: the same sum here
    return {"model_states": estimate.parameters + estimate.gradients + estimate.optimizer_states + estimate.offloaded,
            "offloaded": estimate.offloaded, "peak": estimate.peak}


def worst(ranks: list[dict], get) -> float:
    return max(get(r) for r in ranks)


def report(cfg: dict, results: dict[str, list[dict]]) -> None:
    params = next(iter(results.values()))[0]["params"]
    gb = 1e9
    print(f"\nmodel states per rank: {cfg['blocks']} MLP blocks of width {cfg['width']} = {params / 1e6:.1f}M "
          f"parameters, {cfg.get('precision', '32-true')}, Adam, 2 ranks (gloo, CPU); the larger of the 2 ranks; "
          "GB = 10^9 bytes")
    print(f"target: fsdp and deepspeed_stage_3 model states <= {TARGET}x ddp's")
    cols = [("ZeRO", 8), ("predicts", 7), ("", 6), ("measured", 8), ("(peak)", 6), ("x ddp", 6), ("", 4),
            ("params", 6), ("grads", 6), ("optim", 6), ("master", 6), ("offloaded", 9)]
    units = ["", "B/param", "GB", "B/param", "GB", "", "", "B/param", "", "", "", "GB"]
    print(f"{'variant':<26} " + " ".join(f"{c:>{w}}" for c, w in cols))
    print(f"{'':<26} " + " ".join(f"{u:>{w}}" for u, (_, w) in zip(units, cols)))
    ddp = results.get("ddp")
    ddp_peak = worst(ddp, lambda r: r["peak_model_states"]["model_states"]) if ddp else float("nan")
    for variant, ranks in results.items():
        pred, formula = predicted(variant, cfg.get("precision", "32-true"))
        peak = worst(ranks, lambda r: r["peak_model_states"]["model_states"])
        at = max(ranks, key=lambda r: r["peak_model_states"]["model_states"])["peak_model_states"]
        ratio = peak / ddp_peak
        ok = ("ok" if ratio <= TARGET else "MISS") if variant in TARGETED and ddp else ""
        off = worst(ranks, lambda r: r["peak_model_states"]["offloaded"])
        cells = [formula, f"{pred:.2f}", f"{pred * params / gb:.3f}", f"{peak / params:.2f}", f"{peak / gb:.3f}",
                 f"{ratio:.3f}" if ddp else "-", ok] + [f"{at['bytes'][c] / params:.2f}" for c in ("params", "grads", "optimizer", "master")] \
            + [f"{off / gb:.3f}"]
        print(f"{variant:<26} " + " ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, cols)))
    print("\nbeside the model states, per rank (GB; the larger of the 2 ranks)")
    cols2 = [("model states", 12), ("buffers", 9), ("buffers", 9), ("gathered", 8), ("all tensors", 11),
             ("RSS: no model", 13), ("peak to step 1", 14), ("peak step 2", 11)]
    units2 = ["after step 1", "allocated", "resident", "", "resident", "", "", ""]
    print(f"{'variant':<26} " + " ".join(f"{c:>{w}}" for c, w in cols2))
    print(f"{'':<26} " + " ".join(f"{u:>{w}}" for u, (_, w) in zip(units2, cols2)))
    for variant, ranks in results.items():
        after1 = worst(ranks, lambda r: r["after_step1"]["model_states"])
        def peak(r: dict, get) -> float:
            return max(get(s) for s in r["samples"])

        buffers = worst(ranks, lambda r: peak(r, lambda s: s["bytes"]["buffers"] + s["ddp_buckets"]))
        buffers_res = worst(ranks, lambda r: peak(r, lambda s: s["resident"]["buffers"] + s["ddp_buckets"]))
        gathered = worst(ranks, lambda r: peak(r, lambda s: s["bytes"]["gathered"]))
        every = worst(ranks, lambda r: peak(r, lambda s: s["all_tensors_resident"] + s["ddp_buckets"]))
        cells = [after1, buffers, buffers_res, gathered, every,
                 worst(ranks, lambda r: r["rss_before_model"]), worst(ranks, lambda r: r["peak_rss_to_step1"]),
                 worst(ranks, lambda r: r["peak_rss_step2"])]
        print(f"{variant:<26} " + " ".join(f"{c / gb:>{w}.3f}" for c, (_, w) in zip(cells, cols2)))
    print("\nplanner (torchfleet.estimate_memory, predicted in this process before the runs) vs measured, per rank "
          "(MB = 10^6 bytes)")
    cols3 = [("model states", 12), ("model states", 12), ("error", 7), ("offloaded", 9), ("offloaded", 9),
             ("peak", 8)]
    units3 = ["predicted", "measured", "", "predicted", "measured", "predicted"]
    print(f"{'variant':<26} " + " ".join(f"{c:>{w}}" for c, w in cols3))
    print(f"{'':<26} " + " ".join(f"{u:>{w}}" for u, (_, w) in zip(units3, cols3)))
    for variant, ranks in results.items():
        pred = planner_prediction(variant, cfg)
        if pred is None:
            continue
        measured = worst(ranks, lambda r: r["peak_model_states"]["model_states"])
        off = worst(ranks, lambda r: r["peak_model_states"]["offloaded"])
        cells = [f"{pred['model_states'] / 1e6:.2f}", f"{measured / 1e6:.2f}",
                 f"{(pred['model_states'] - measured) / measured:+.1%}", f"{pred['offloaded'] / 1e6:.2f}",
                 f"{off / 1e6:.2f}", f"{pred['peak'] / 1e6:.2f}"]
        print(f"{variant:<26} " + " ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, cols3)))
    print("  measured: the probe's model states at their sampled peak (the larger rank); the planner's peak of live "
          "tensors is measured against MemTracker in tests/test_memory_estimate.py and tests/distributed")
    print("  model states after step 1: right after the first optimizer step (before zero_grad); buffers, gathered "
          "and all tensors: the peak over step 2's sampled points (DDP's C++ gradient buckets included)")
    print("\nwhere the bytes are (rank 0 at its model-state peak; GB by holder, largest first):")
    for variant, ranks in results.items():
        snap = ranks[0]["peak_model_states"]
        top = list(snap["detail"].items())[:6]
        print(f"  {variant:<24} at '{snap['point']}': " + ", ".join(f"{k} {v / gb:.3f}" for k, v in top if v))
    off = [v for v in results if ranks_differ(results[v])]
    if off:
        print("  trained parameters differ between the ranks' views in: " + ", ".join(off))


def deepspeed_peaks() -> None:
    """Measure tests/memory_runs.py's DEEPSPEED_RUNS in one launch and print the planner's figures beside them."""
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import torch
    from tests.distributed.sharded_helpers import ROOT, run_script
    from tests.memory_runs import DEEPSPEED_RUNS, predict_deepspeed

    shape = {"width": 128, "blocks": 4, "rows": 1024}
    work = tempfile.mkdtemp(prefix="bench-memory-ds-")
    out = os.path.join(work, "memory.pt")
    started = time.time()
    proc = run_script(os.path.join(ROOT, "tests", "distributed", "scripts", "memory_train.py"),
                      dict(shape, out=out, runs=DEEPSPEED_RUNS), timeout=900)
    took = time.time() - started
    if proc.returncode != 0:
        print(f"\nDeepSpeed peaks: the launch failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return
    ranks = [torch.load(f"{out}.{rank}", weights_only=False) for rank in (0, 1)]
    shutil.rmtree(work, ignore_errors=True)
    print(f"\nDeepSpeed peak per rank, planner vs measured: 4 MLP blocks of width 128, 1024 rows, AdamW, 2 ranks "
          f"(gloo, CPU), 20,000-element buckets; MemTracker over step 3, the larger rank; bytes (launch {took:.0f} s)")
    cols = [("peak predicted", 14), ("peak measured", 13), ("error", 7), ("params pred", 11), ("measured", 9),
            ("states pred", 11), ("measured", 9), ("run s", 5)]
    print(f"{'variant':<14} " + " ".join(f"{c:>{w}}" for c, w in cols))
    for run in DEEPSPEED_RUNS:
        measured = {k: max(r[run["name"]][k] for r in ranks) for k in ("peak", "parameters", "optimizer_states")}
        pred = predict_deepspeed(run, shape["width"], shape["blocks"], shape["rows"])
        seconds = max(r[run["name"]]["seconds"] for r in ranks)
        cells = [pred.peak, measured["peak"], f"{(pred.peak - measured['peak']) / measured['peak']:+.2%}",
                 pred.parameters, measured["parameters"], pred.optimizer_states, measured["optimizer_states"],
                 f"{seconds:.1f}"]
        print(f"{run['name']:<14} " + " ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, cols)))
    print("  ds2/ds3: ZeRO stage; _ac: activation checkpointing (the model checkpoints its blocks); _bf16: "
          "bf16-mixed (DeepSpeed trains the module in bf16, fp32 master partition and states)")


def ranks_differ(ranks: list[dict]) -> bool:
    a, b = ranks[0].get("checksum"), ranks[-1].get("checksum")
    return bool(a and b) and any(abs(x - y) > 1e-6 * max(1.0, abs(x)) for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run (< 90 s): width {QUICK['width']}, {QUICK['blocks']} blocks")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help="comma-separated, from " + ", ".join(DEFAULT_VARIANTS + OPTIONAL))
    parser.add_argument("--width", type=int, help=f"block width (default {FULL['width']})")
    parser.add_argument("--blocks", type=int, help=f"number of blocks (default {FULL['blocks']})")
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"],
                        help="the Trainer's precision (bf16-mixed: the ZeRO paper's mixed-precision case; "
                             "torchfleet variants only)")
    parser.add_argument("--no-peaks", action="store_true",
                        help="leave out the DeepSpeed peaks (planner vs measured, one more 2-rank launch)")
    parser.add_argument("--no-malloc-tuning", action="store_true", help="leave glibc's mmap threshold alone")
    parser.add_argument("--save", help="write every rank's result to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the runs' logs and results (the folder is printed)")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in DEFAULT_VARIANTS + OPTIONAL]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {', '.join(DEFAULT_VARIANTS + OPTIONAL)}")
    cfg = dict(FULL, **(QUICK if args.quick else {}))
    for key in ("width", "blocks"):
        if getattr(args, key):
            cfg[key] = getattr(args, key)
    cfg["precision"] = args.precision
    if args.precision != "32-true" and any(v.startswith("raw_") for v in variants):
        parser.error("--precision applies to the torchfleet variants only; leave the raw_ variants out")

    print(f"{versions()}; {load_average()} at the start")
    why = available(variants)
    for v, reason in why.items():
        if reason:
            print(f"  skipping {v}: its strategy cannot be built here ({reason[:200]})")
    variants = [v for v in variants if not why[v]]
    if any("deepspeed" in v for v in variants) and extensions_note():
        print("  " + extensions_note())
    env = {} if args.no_malloc_tuning else {"MALLOC_MMAP_THRESHOLD_": "131072"}
    work = tempfile.mkdtemp(prefix="bench-memory-")
    started = time.time()
    results: dict[str, list[dict]] = {}
    for variant in variants:
        t = time.time()
        ranks = run_once(variant, cfg, work, variant, memory=True, env_extra=env)
        results[variant] = ranks
        peak = max(r["peak_model_states"]["model_states"] for r in ranks)
        print(f"  {variant:<26} model states {peak / 1e9:6.3f} GB per rank ({peak / ranks[0]['params']:5.2f} B/param), "
              f"run {time.time() - t:5.1f} s", flush=True)
    if results:
        report(cfg, results)
    if not args.no_peaks:
        reason = why["deepspeed_stage_2"] if "deepspeed_stage_2" in why else available(["deepspeed_stage_2"])[
            "deepspeed_stage_2"]
        if reason:
            print(f"  skipping the DeepSpeed peaks: {reason[:200]}")
        else:
            deepspeed_peaks()
    print(f"\ntotal {time.time() - started:.0f} s; {load_average()} at the end")
    if args.save:
        with open(args.save, "w") as f:
            json.dump({"config": cfg, "runs": results}, f, indent=1)
    if args.keep:
        print(f"logs and results: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
