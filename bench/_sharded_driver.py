"""What the drivers bench/sharded.py and bench/memory.py share: starting one run and reading its results.

The drivers import no torch: every run is a fresh set of processes, started here, that hands its
results back in JSON files. Raw variants (``raw_*``, bench/_sharded_raw.py) start under torchrun;
torchfleet variants (bench/_sharded_fleet.py) start with plain ``python`` and their strategy starts
the second rank.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUN_TIMEOUT_S = 900
# variables a run must not inherit: they would make a process look like one rank of some other job
_FOREIGN = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE",
            "GROUP_RANK", "TORCHELASTIC_RUN_ID", "TF_GLOBAL_SEED", "BENCH_T0", "BENCH_IMPORTED")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a run: one torch thread per process, DeepSpeed's op builds in torchfleet's cache."""
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/torchfleet/torch_extensions"))
    env.update(extra or {})
    return env


def command(variant: str, cfg: dict, out: str, memory: bool) -> list[str]:
    args = [variant, "--out", out]
    for key in ("width", "blocks", "seq", "batch", "steps", "warmup", "batches_per_epoch"):
        args += [f"--{key.replace('_', '-')}", str(cfg[key])]
    if memory:
        args.append("--memory")
    if cfg.get("precision", "32-true") != "32-true":
        args += ["--precision", cfg["precision"]]
    if variant.startswith("raw_"):
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
                "--master-addr=127.0.0.1", f"--master-port={free_port()}", os.path.join(HERE, "_sharded_raw.py"),
                *args]
    return [sys.executable, os.path.join(HERE, "_sharded_fleet.py"), *args]


def run_once(variant: str, cfg: dict, work: str, tag: str, memory: bool = False,
             env_extra: dict[str, str] | None = None) -> list[dict]:
    """Start one run and wait for it; returns the results it wrote (rank 0's, or every rank's with ``memory``).

    Exits the driver with the run's last output when the run fails or times out.
    """
    out = os.path.join(work, f"{tag}.json")
    log_path = os.path.join(work, f"{tag}.log")
    env = run_env(env_extra)
    cmd = command(variant, cfg, out, memory)
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
    base, ext = os.path.splitext(out)
    paths = [f"{base}.rank{r}{ext}" for r in range(2)] if memory else [out]
    if rc != 0 or not all(os.path.exists(p) for p in paths):
        with open(log_path) as f:
            tail = f.read()[-4000:]
        what = "timed out" if rc is None else f"exited with {rc}" if rc else "wrote no result"
        sys.exit(f"\n{variant} ({tag}) {what}: {' '.join(cmd)}\n--- its output (last 4000 characters of {log_path}) "
                 f"---\n{tail}")
    results = []
    for p in paths:
        with open(p) as f:
            result = json.load(f)
        result.setdefault("marks", {})["exit"] = exited
        results.append(result)
    return results


def available(variants: list[str]) -> dict[str, str]:
    """Which torchfleet variants can run here: {variant: "" or why not}; raw variants are not checked."""
    fleet = [v for v in variants if not v.startswith("raw_")]
    if not fleet:
        return {v: "" for v in variants}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "_sharded_fleet.py"), "--check", ",".join(fleet)],
                          env=run_env(), capture_output=True, text=True, timeout=300)
    try:
        why = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        sys.exit(f"could not check the torchfleet strategies:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return {v: why.get(v, "") for v in variants}


def extensions_note() -> str:
    """A warning when DeepSpeed's CPU communication op is not built yet in the cache the runs use."""
    folder = run_env()["TORCH_EXTENSIONS_DIR"]
    if os.path.exists(os.path.join(folder, "deepspeed_shm_comm", "deepspeed_shm_comm.so")):
        return ""
    return (f"note: {folder} holds no build of DeepSpeed's deepspeed_shm_comm op yet: the first raw DeepSpeed run "
            "compiles it (~100 s, once)")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for pkg in ("torch", "torchfleet", "deepspeed"):
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            parts.append(f"{pkg} (not installed)")
    return ", ".join(parts) + f", python {sys.version.split()[0]}, {os.cpu_count()} CPU cores"


def load_average() -> str:
    """The 1-minute load average and the CPU count: how busy the machine was (another job skews timings)."""
    try:
        return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    except OSError:
        return "load average unknown"
