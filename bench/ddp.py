"""DDP on 2 CPU processes over gloo: torchfleet's ddp, ddp_spawn and ddp_fork against a raw torchrun loop.

    python bench/ddp.py            # full: 3 interleaved repeats of both models, ~10 minutes on 2 cores
    python bench/ddp.py --quick    # smoke run, < 60 s: tiny model, 150 steps, 1 repeat
    options: --repeats N, --only tiny|big, --variants raw,ddp,ddp_spawn,ddp_fork, --tiny-steps N,
             --big-steps N, --timers (diagnostic runs timing the pieces of a step), --save results.json, --keep

Variants (every run is a fresh set of processes started by this driver; 1 torch thread per process:
OMP_NUM_THREADS=1 and torch.set_num_threads(1) in every process):
  raw        ``python -m torch.distributed.run --nproc-per-node=2 bench/_ddp_raw.py``: init_process_group,
             DistributedDataParallel, DataLoader + DistributedSampler, SGD, mean cross-entropy;
  ddp        ``python bench/_ddp_fleet.py ddp``: torchfleet.Trainer(strategy="ddp"), which re-runs that
             script for rank 1;
  ddp_spawn  the same with strategy="ddp_spawn" (two spawned processes; the launching one waits);
  ddp_fork   the same with strategy="ddp_fork".
  ddp_nowatch  (only when named in --variants) ddp with hang_timeout=None: no watchdog thread; bench/faults.py
             compares it with ddp for the watchdog's cost.
The Trainer is set up as a user would for speed (logger=False, enable_checkpointing=False,
enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, no validation) and its
training_step calls self.log on the loss every step. Same model, data, sampler order and optimizer in
every variant: each run's parameter checksum must agree with raw's. Models: (a) tiny MLP 32-64-10,
batch 32 per process, 2000 steps (50 warm-up): what the framework and the launch cost; (b) MLP
1024-4096-4096-10, batch 64 per process, 20 steps (5 warm-up): compute and the gradient all-reduce
dominate.

Metrics, taken in global rank 0 (bench/_ddp_common.py):
  steps/s             steady state: the steps after the warm-up over the time they took (time.perf_counter
                      at the end of every step); "windowed": the rate of the median of ~50 windows of
                      those steps, which a stall of the machine moves less;
  launch->first step  wall time (time.time) from just before this driver starts the command (handed to
                      the run in BENCH_T0) until rank 0's first training step begins: interpreter start,
                      imports, starting the other processes, rendezvous, DDP and optimizer setup.
Variants run interleaved (raw, ddp, spawn, fork, raw, ...); the table shows the median over repeats, its
ratio to raw and the targets (steps/s >= 0.95x raw; launch->first step <= raw + 1 s), and beside steps/s rank
0's CPU time (user + system, every thread) per steady step and its ratio to raw. Below it: the launch
split into the marks each run records (imports done, process group up, DDP ready, first step, process
exit), the best launch, the spread of steps/s, rank 0's CPU time per steady step (whole process and
main thread: less sensitive to a noisy machine than wall time) and the median of the per-repeat ratios.

This driver imports no torch: each run is a subprocess and hands its result back in a JSON file.
On a small shared VM the spread between runs is large; compare the spread before reading a ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

SIZES = {
    "tiny": {"widths": [32, 64, 10], "batch": 32, "steps": 2000, "warmup": 50, "batches_per_epoch": 500},
    "big": {"widths": [1024, 4096, 4096, 10], "batch": 64, "steps": 20, "warmup": 5, "batches_per_epoch": 25},
}
QUICK = {"tiny": {"steps": 150, "warmup": 20}, "big": {"steps": 4, "warmup": 2}}
VARIANTS = {
    "raw": "raw torchrun + DDP",
    "ddp": 'Trainer(strategy="ddp")',
    "ddp_spawn": 'Trainer(strategy="ddp_spawn")',
    "ddp_fork": 'Trainer(strategy="ddp_fork")',
    "ddp_nowatch": 'Trainer(strategy="ddp", hang_timeout=None)',
}
MARKS = ("imported", "process_group", "ddp_ready", "first_step", "exit")
TARGET_RATIO = 0.95
TARGET_LAUNCH_S = 1.0
RUN_TIMEOUT_S = 900
# variables a run must not inherit: they would make a process look like one rank of some other job
_FOREIGN = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE",
            "GROUP_RANK", "TORCHELASTIC_RUN_ID", "TF_GLOBAL_SEED", "BENCH_T0", "BENCH_IMPORTED")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(variant: str, cfg: dict, out: str, timers: bool) -> list[str]:
    args = [variant, "--widths", ",".join(map(str, cfg["widths"])), "--batch", str(cfg["batch"]),
            "--steps", str(cfg["steps"]), "--warmup", str(cfg["warmup"]),
            "--batches-per-epoch", str(cfg["batches_per_epoch"]), "--out", out]
    if timers:
        args.append("--timers")
    if variant == "raw":
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
                "--master-addr=127.0.0.1", f"--master-port={free_port()}", os.path.join(HERE, "_ddp_raw.py"), *args]
    return [sys.executable, os.path.join(HERE, "_ddp_fleet.py"), *args]


def run_once(variant: str, cfg: dict, work: str, tag: str, timers: bool = False) -> dict:
    """Start one run, wait for it, return rank 0's JSON result with the time of exit added to its marks."""
    out = os.path.join(work, f"{tag}.json")
    log_path = os.path.join(work, f"{tag}.log")
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env["OMP_NUM_THREADS"] = "1"
    cmd = command(variant, cfg, out, timers)
    with open(log_path, "w") as log:
        t0 = time.time()
        env["BENCH_T0"] = repr(t0)
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group: the ranks it started go too
            proc.wait()
            rc = None
        exited = time.time() - t0
    if rc != 0 or not os.path.exists(out):
        with open(log_path) as f:
            tail = f.read()[-4000:]
        what = "timed out" if rc is None else f"exited with {rc}" if rc else "wrote no result"
        sys.exit(f"\n{variant} ({tag}) {what}: {' '.join(cmd)}\n--- its output (last 4000 characters of {log_path}) "
                 f"---\n{tail}")
    with open(out) as f:
        result = json.load(f)
    result["marks"]["exit"] = exited
    return result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def report(size: str, cfg: dict, repeats: int, results: dict[str, list[dict]]) -> None:
    widths = "-".join(map(str, cfg["widths"]))
    print(f"\n({'a' if size == 'tiny' else 'b'}) {size} MLP {widths}, batch {cfg['batch']} per process, {cfg['steps']} "
          f"steps ({cfg['warmup']} warm-up), 2 processes x 1 thread, gloo; median of {repeats}")
    print(f"targets: steps/s >= {TARGET_RATIO}x raw, launch->first step <= raw + {TARGET_LAUNCH_S} s "
          "(ok/MISS after each figure)")

    def med(runs: list[dict], key: str) -> float:
        return median([r["marks"][key] if key in MARKS else r[key] for r in runs])

    base = results.get("raw") or []
    print(f"{'variant':<30} {'steps/s':>9} {'x raw':>6} {'':>4}  {'windowed':>9} {'x raw':>6} {'':>4}  "
          f"{'CPU µs/step':>11} {'x raw':>6}  {'launch->1st step s':>18} {'vs raw':>7} {'':>4}")
    for variant, runs in results.items():
        cells = []
        for key in ("steps_per_s", "steps_per_s_windowed"):
            value, ref = med(runs, key), med(base, key) if base else math.nan
            ok = "" if variant == "raw" else verdict(value / ref >= TARGET_RATIO)
            cells.append(f"{value:>9.{2 if value < 100 else 1}f} {value / ref:>6.3f} {ok:>4}")
        cpu, ref = med(runs, "cpu_us_per_step"), med(base, "cpu_us_per_step") if base else math.nan
        cells.append(f"{cpu:>11.0f} {cpu / ref:>6.3f}")
        launch, ref = med(runs, "first_step"), med(base, "first_step") if base else math.nan
        ok = "" if variant == "raw" else verdict(launch - ref <= TARGET_LAUNCH_S)
        cells.append(f"{launch:>18.2f} {launch - ref:>+7.2f} {ok:>4}")
        print(f"{VARIANTS[variant]:<30} " + "  ".join(cells))
    print("  windowed = the median of ~50 windows of the steady steps (robust to the machine stalling a process); "
          "CPU µs/step = rank 0's CPU time (user + system, every thread) per steady step")
    print(f"  per run: launch marks (median s after launch: {', '.join(MARKS)}), best launch->first step, "
          "steps/s min..max, rank 0's CPU time per steady step (process, main thread), median of per-repeat ratios "
          "to raw (steps/s, windowed)")
    for variant, runs in results.items():
        marks = " ".join(f"{median([r['marks'][m] for r in runs if m in r['marks']]):5.2f}" for m in MARKS)
        best = min(r["marks"]["first_step"] for r in runs)
        spread = [r["steps_per_s"] for r in runs]
        paired = ""
        if base and variant != "raw":
            pairs = list(zip(runs, base))
            paired = "  paired x raw " + " ".join(
                f"{median([r[k] / b[k] for r, b in pairs]):.3f}" for k in ("steps_per_s", "steps_per_s_windowed"))
        cpu = median([r["cpu_us_per_step"] for r in runs])
        main_cpu = median([r["main_thread_cpu_us_per_step"] for r in runs])
        print(f"  {variant:<10} marks {marks}  best {best:5.2f}  steps/s {min(spread):.4g}..{max(spread):.4g}  "
              f"CPU µs/step {cpu:.0f} (main thread {main_cpu:.0f}){paired}")
    if base:
        ref = base[0]["checksum"]
        off = [(v, r["checksum"]) for v, runs in results.items() for r in runs
               if not math.isclose(r["checksum"], ref, rel_tol=1e-4, abs_tol=1e-4)]
        print("  same trained parameters as raw in every run: "
              + ("yes" if not off else "NO: " + ", ".join(f"{v} {c:.6g} vs {ref:.6g}" for v, c in off)))


def report_timers(size: str, timed: dict[str, dict]) -> None:
    print(f"\n  {size}: where rank 0's step time goes (--timers run, µs per steady step; the rest is the loop "
          "itself: fetching the batch, hooks, logging)")
    for variant, result in timed.items():
        per_step = 1e6 / result["steps_per_s"]
        parts = result.get("timers_us", {})
        rest = per_step - sum(parts.values())
        body = ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
        print(f"  {variant:<10} step {per_step:8.1f} = {body}, rest {rest:.1f}")
        threads = ", ".join(f"{k} {v:.2f}" for k, v in sorted(result.get("thread_cpu_s", {}).items(), key=lambda kv: -kv[1]))
        print(f"  {'':<10} rank 0's threads, CPU s over the whole run: {threads}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run (< 60 s): 1 repeat of {QUICK['tiny']['steps']} steps, tiny model only unless "
                        f"--only big ({QUICK['big']['steps']} steps)")
    parser.add_argument("--only", choices=list(SIZES))
    parser.add_argument("--variants", default="raw,ddp,ddp_spawn,ddp_fork",
                        help="comma-separated subset of " + ", ".join(VARIANTS))
    parser.add_argument("--tiny-steps", type=int, default=None, help=f"default {SIZES['tiny']['steps']}")
    parser.add_argument("--big-steps", type=int, default=None, help=f"default {SIZES['big']['steps']}")
    parser.add_argument("--no-warm", action="store_true", help="skip the untimed first run of each variant")
    parser.add_argument("--timers", action="store_true", help="also one diagnostic run per variant with step timers")
    parser.add_argument("--save", help="write every run's result to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the runs' logs and results (the folder is printed)")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    repeats = 1 if args.quick else args.repeats
    sizes = {}
    for size, cfg in SIZES.items():
        if (args.only and size != args.only) or (args.quick and not args.only and size != "tiny"):
            continue  # --quick alone: the tiny model (a run of the big one alone takes ~15-25 s)
        cfg = dict(cfg, **(QUICK[size] if args.quick else {}))
        steps = args.tiny_steps if size == "tiny" else args.big_steps
        if steps is not None:
            cfg["steps"] = steps
        if cfg["steps"] <= cfg["warmup"]:
            parser.error(f"{size}: give more steps than the {cfg['warmup']} warm-up steps")
        sizes[size] = cfg

    work = tempfile.mkdtemp(prefix="bench-ddp-")
    from importlib.metadata import version

    print(f"torch {version('torch')}, torchfleet {version('torchfleet')}, python {sys.version.split()[0]}, {os.cpu_count()} CPU cores; "
          f"variants {', '.join(variants)}; {repeats} repeat(s), interleaved")
    started = time.time()
    saved: dict[str, dict] = {}
    for size, cfg in sizes.items():
        if not args.quick and not args.no_warm:
            warm = dict(cfg, **QUICK[size])
            for variant in variants:  # page in the interpreter, torch and the scripts once per variant
                run_once(variant, warm, work, f"{size}-warm-{variant}")
        results: dict[str, list[dict]] = {v: [] for v in variants}
        for rep in range(repeats):
            for variant in variants:
                result = run_once(variant, cfg, work, f"{size}-{rep}-{variant}")
                results[variant].append(result)
                print(f"  {size} repeat {rep + 1}/{repeats} {variant:<10} {result['steps_per_s']:9.2f} steps/s "
                      f"(windowed {result['steps_per_s_windowed']:9.2f}), "
                      f"first step {result['marks']['first_step']:5.2f} s, exit {result['marks']['exit']:5.2f} s",
                      flush=True)
        report(size, cfg, repeats, results)
        timed = {}
        if args.timers:
            for variant in variants:
                timed[variant] = run_once(variant, cfg, work, f"{size}-timers-{variant}", timers=True)
            report_timers(size, timed)
        saved[size] = {"config": cfg, "runs": results, "timer_runs": timed}
    print(f"\ntotal {time.time() - started:.0f} s")
    if args.save:
        with open(args.save, "w") as f:
            json.dump(saved, f, indent=1)
    if args.keep:
        print(f"logs and results: {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
