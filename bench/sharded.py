"""Sharded training on 2 CPU processes: torchfleet's fsdp and deepspeed against the same engines driven by hand.

    python bench/sharded.py            # full: 3 interleaved repeats of 6 variants, ~8-10 minutes on 2 cores
    python bench/sharded.py --quick    # smoke run, < 90 s: 1 repeat, 16 steps
    options: --repeats N, --steps N, --variants raw_fsdp,fsdp,... (also fsdp_cpu_offload, deepspeed_stage_1
             and their raw_ twins), --raw-ds-config matched|minimal, --no-warm, --save results.json, --keep

Variants (every run a fresh pair of processes started by this driver, gloo, 1 torch thread per process:
OMP_NUM_THREADS=1 and torch.set_num_threads(1)), in pairs of the same engine:
  raw_fsdp               ``torchrun --nproc-per-node=2 bench/_sharded_raw.py``: init_process_group,
                         ``fully_shard`` on every block then on the root (FSDP2, FULL_SHARD), Adam,
                         loss.backward(), opt.step(), opt.zero_grad(set_to_none=True);
  fsdp                   ``python bench/_sharded_fleet.py fsdp``: torchfleet.Trainer(strategy=FSDPStrategy with
                         auto_wrap_policy={Block}), which re-runs that script for rank 1;
  raw_deepspeed_stage_N  ``deepspeed.init_distributed("gloo")``, ``deepspeed.initialize(model, Adam, config)``,
                         engine.backward(loss), engine.step(); the config holds the micro batch size and
                         the ZeRO settings torchfleet's DeepSpeedStrategy uses by default (stage N, 200M-element
                         buckets, overlap_comm, contiguous_gradients), so that the ratio measures torchfleet and
                         not a choice of buckets (``--raw-ds-config minimal``: the stage alone, DeepSpeed's
                         defaults); N = 2, 3;
  deepspeed_stage_N      ``python bench/_sharded_fleet.py deepspeed_stage_N``: Trainer(strategy="deepspeed_stage_N").
The Trainer is set up as a user would for speed (logger=False, enable_checkpointing=False,
enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, no validation) and its
training_step calls self.log on the loss every step. Same model (8 residual MLP blocks of width 256,
6.3M parameters, fp32), data (4 samples of 64 positions per rank and step; DistributedSampler shuffled
with seed 0), loss (MSE) and optimizer (Adam, lr 1e-3) everywhere; a torchfleet variant whose strategy
cannot be built here (not written yet, deepspeed missing) is skipped, saying why.

Metrics, taken in global rank 0 (bench/_sharded_common.py):
  steps/s             steady state: the steps after the warm-up (10) over the time they took
                      (time.perf_counter at the end of every step); "windowed": the rate of the median of
                      ~50 windows of those steps, which a stall of the machine moves less;
  x raw               the ratio to the raw loop of the same engine (target: >= 1/1.10 = 0.909, i.e. a
                      torchfleet step takes at most 1.10x the raw one);
  launch->first step  wall time from just before this driver starts the command until rank 0's first
                      training step begins (imports, second process, rendezvous, wrapping / engine set-up);
  same parameters     [sum, sum of squares] of the full trained parameters (gathered from the shards)
                      must agree with the raw twin's to 1e-5 relative: both trained alike.
Variants run interleaved (raw_fsdp, fsdp, raw_deepspeed_stage_2, ..., then again); before the timed
repeats each variant runs once untimed (page cache, DeepSpeed's op builds). The table shows the median
over repeats; below it: launch marks, the spread of steps/s, rank 0's CPU time per steady step, the
median of the per-repeat paired ratios, and any difference between the DeepSpeed configs of the two
sides. This driver imports no torch. On a small shared VM the spread between runs is large: compare
the spread before reading a ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time

from _sharded_driver import available, extensions_note, load_average, median, run_once, versions

CONFIG = {"width": 256, "blocks": 8, "seq": 64, "batch": 4, "steps": 60, "warmup": 10, "batches_per_epoch": 8}
QUICK = {"steps": 16, "warmup": 6}
PAIRS = {"fsdp": "raw_fsdp", "deepspeed_stage_2": "raw_deepspeed_stage_2",
         "deepspeed_stage_3": "raw_deepspeed_stage_3"}
OPTIONAL = {"fsdp_cpu_offload": "raw_fsdp_cpu_offload", "deepspeed_stage_1": "raw_deepspeed_stage_1"}
LABELS = {
    "raw_fsdp": "raw fully_shard loop", "fsdp": 'Trainer(strategy="fsdp")',
    "raw_fsdp_cpu_offload": "raw fully_shard + CPUOffload", "fsdp_cpu_offload": 'Trainer("fsdp_cpu_offload")',
    **{f"raw_deepspeed_stage_{n}": f"raw deepspeed.initialize ZeRO-{n}" for n in (1, 2, 3)},
    **{f"deepspeed_stage_{n}": f'Trainer("deepspeed_stage_{n}")' for n in (1, 2, 3)},
}
TARGET = 1.10
MARKS = ("imported", "process_group", "engine_ready", "first_step", "exit")


def default_variants() -> list[str]:
    return [v for fleet, raw in PAIRS.items() for v in (raw, fleet)]


def all_variants() -> list[str]:
    return [v for pairs in (PAIRS, OPTIONAL) for fleet, raw in pairs.items() for v in (raw, fleet)]


def twin(variant: str) -> str | None:
    """The raw variant a torchfleet variant is compared with (None for a raw one)."""
    return {**PAIRS, **OPTIONAL}.get(variant)


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def close(a: list[float], b: list[float], rel: float = 1e-5) -> bool:
    return all(math.isclose(x, y, rel_tol=rel, abs_tol=rel) for x, y in zip(a, b))


def config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Keys whose values differ between two DeepSpeed configs (nested keys joined with dots)."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, "(absent)"), b.get(key, "(absent)")
        if isinstance(x, dict) and isinstance(y, dict):
            out += config_diff(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append(f"{prefix}{key}: {x} vs {y}")
    return out


def report(cfg: dict, repeats: int, results: dict[str, list[dict]]) -> None:
    print(f"\n{cfg['blocks']} MLP blocks of width {cfg['width']}, {cfg['batch']} x {cfg['seq']} positions per "
          f"process, Adam, {cfg['steps']} steps ({cfg['warmup']} warm-up), 2 processes x 1 thread, gloo; median of "
          f"{repeats}")
    print(f"target: torchfleet steps/s >= raw / {TARGET} = {1 / TARGET:.3f}x raw (ok/MISS after the ratio)")

    def med(runs: list[dict], key: str) -> float:
        return median([r["marks"][key] if key in MARKS else r[key] for r in runs])

    print(f"{'variant':<34} {'steps/s':>8} {'x raw':>6} {'':>4}  {'windowed':>8} {'x raw':>6} {'':>4}  "
          f"{'launch->1st step s':>18} {'vs raw':>7}")
    for variant, runs in results.items():
        base = results.get(twin(variant) or "", [])
        cells = []
        for key in ("steps_per_s", "steps_per_s_windowed"):
            value = med(runs, key)
            if base:
                ratio = value / med(base, key)
                cells.append(f"{value:>8.3f} {ratio:>6.3f} {verdict(ratio >= 1 / TARGET):>4}")
            else:
                cells.append(f"{value:>8.3f} {'':>6} {'':>4}")
        launch = med(runs, "first_step")
        vs = f"{launch - med(base, 'first_step'):>+7.2f}" if base else f"{'':>7}"
        cells.append(f"{launch:>18.2f} {vs}")
        print(f"{LABELS.get(variant, variant):<34} " + "  ".join(cells))
    print(f"  per run: launch marks (median s after launch: {', '.join(MARKS)}), steps/s min..max, rank 0's CPU time "
          "per steady step, median of per-repeat ratios to the raw twin (steps/s, windowed)")
    for variant, runs in results.items():
        marks = " ".join(f"{median([r['marks'][m] for r in runs if m in r['marks']]):5.2f}" for m in MARKS)
        spread = [r["steps_per_s"] for r in runs]
        paired = ""
        base = results.get(twin(variant) or "", [])
        if base:
            pairs = list(zip(runs, base))
            paired = "  paired x raw " + " ".join(
                f"{median([r[k] / b[k] for r, b in pairs]):.3f}" for k in ("steps_per_s", "steps_per_s_windowed"))
        cpu = median([r["cpu_us_per_step"] for r in runs]) / 1000
        print(f"  {variant:<22} marks {marks}  steps/s {min(spread):.3g}..{max(spread):.3g}  CPU ms/step {cpu:.1f}"
              f"{paired}")
    for variant, runs in results.items():
        base = results.get(twin(variant) or "", [])
        if not base:
            continue
        ref = base[0]["checksum"]
        off = [r["checksum"] for r in runs + base if not close(r["checksum"], ref)]
        print(f"  {variant}: same trained parameters as {twin(variant)} in every run: "
              + ("yes" if not off else f"NO: {off[0]} vs {ref}"))
        if variant.startswith("deepspeed"):
            diff = config_diff(runs[0].get("config", {}), base[0].get("config", {}))
            # entries that only restate DeepSpeed's defaults, or logging, do not change a step
            quiet = ("activation_checkpointing", "aio", "fp16.", "bf16.", "steps_per_print", "zero_force_ds_cpu",
                     "zero_allow_untested", "gradient_clipping: 0.0 vs (absent)")
            shown = [d for d in diff if not d.startswith(quiet)]
            print(f"  {variant}: DeepSpeed config, torchfleet vs raw: " + ("; ".join(shown) if shown else "the same")
                  + (f" (+{len(diff) - len(shown)} entries that restate DeepSpeed's defaults: fp16/bf16 off, no "
                     "clipping, aio, activation checkpointing off, logging)" if len(diff) > len(shown) else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run (< 90 s): 1 repeat of {QUICK['steps']} steps ({QUICK['warmup']} warm-up), "
                        "no untimed first runs")
    parser.add_argument("--steps", type=int, help=f"steps per run (default {CONFIG['steps']})")
    parser.add_argument("--variants", default=",".join(default_variants()),
                        help="comma-separated subset of " + ", ".join(all_variants()))
    parser.add_argument("--raw-ds-config", choices=["matched", "minimal"], default="matched",
                        help="the raw DeepSpeed loops' ZeRO settings: torchfleet's defaults, or the stage alone")
    parser.add_argument("--no-warm", action="store_true", help="skip the untimed first run of each variant")
    parser.add_argument("--save", help="write every run's result to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the runs' logs and results (the folder is printed)")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in all_variants()]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {', '.join(all_variants())}")
    repeats = 1 if args.quick else args.repeats
    cfg = dict(CONFIG, **(QUICK if args.quick else {}))
    if args.steps is not None:
        cfg["steps"] = args.steps
    if cfg["steps"] <= cfg["warmup"]:
        parser.error(f"give more steps than the {cfg['warmup']} warm-up steps")
    env = {"BENCH_DS_CONFIG": args.raw_ds_config}

    print(f"{versions()}; {load_average()} at the start")
    why = available(variants)
    for v, reason in why.items():
        if reason:
            print(f"  skipping {v}: its strategy cannot be built here ({reason[:200]})")
    variants = [v for v in variants if not why[v]]
    if any("deepspeed" in v for v in variants) and extensions_note():
        print("  " + extensions_note())
    print(f"variants {', '.join(variants)}; {repeats} repeat(s), interleaved")
    work = tempfile.mkdtemp(prefix="bench-sharded-")
    started = time.time()
    if not args.quick and not args.no_warm:
        warm = dict(cfg, **QUICK)
        for variant in variants:  # page in the interpreter, torch, deepspeed and the scripts once per variant
            run_once(variant, warm, work, f"warm-{variant}", env_extra=env)
        print(f"  untimed first runs done ({time.time() - started:.0f} s)", flush=True)
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for rep in range(repeats):
        for variant in variants:
            result = run_once(variant, cfg, work, f"{rep}-{variant}", env_extra=env)[0]
            results[variant].append(result)
            print(f"  repeat {rep + 1}/{repeats} {variant:<22} {result['steps_per_s']:7.3f} steps/s "
                  f"(windowed {result['steps_per_s_windowed']:7.3f}), first step {result['marks']['first_step']:5.2f} s, "
                  f"exit {result['marks']['exit']:5.2f} s", flush=True)
    if results:
        report(cfg, repeats, results)
    print(f"\ntotal {time.time() - started:.0f} s; {load_average()} at the end")
    if args.save:
        with open(args.save, "w") as f:
            json.dump({"config": cfg, "runs": results}, f, indent=1)
    if args.keep:
        print(f"logs and results: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
