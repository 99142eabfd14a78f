"""ddp, fsdp, TP2xDP2 and PP2xDP2 (model_parallel) on 4 CPU processes: torchfleet's Trainer against raw loops.

    python bench/model_parallel.py               # 2 interleaved repeats of 8 variants, ~11 minutes on a busy 2-core VM
    python bench/model_parallel.py --quick       # smoke run: 1 repeat, 12 steps
    python bench/model_parallel.py --torchrun    # the Trainer's scripts started by torchrun as well
    python bench/model_parallel.py --only pp2dp2,ddp    # some pairs only (the Trainer variants' names)
    options: --repeats N, --steps N, --warmup N, --dim N, --layers N, --seq N, --vocab N, --global-batch N

The model is the tensor/sequence/loss-parallel example's Transformer (src/torchfleet/examples/tp_transformer.py)
at a bench size (defaults: dim 128, 4 heads, 4 layers, sequence 64, vocabulary 512, global batch 8 sequences).
Each variant is a fresh set of 4 processes (1 torch thread each, gloo) started by this driver:

  raw_ddp / raw_fsdp / raw_tp2dp2 / raw_pp2dp2
      torchrun + bench/_mp_raw.py: the same parallelisation written by hand (DistributedDataParallel;
      fully_shard per block then the model; the example's parallelize on a (2, 2) mesh and loss_parallel;
      torch.distributed.pipelining's PipelineStage + Schedule1F1B over 2 microbatches on a (pipeline 2, data 2)
      mesh, each stage's blocks then the stage fully_shard over the data-parallel pair);
  ddp / fsdp / tp2dp2 / pp2dp2
      bench/_mp_fleet.py: torchfleet.Trainer(strategy="ddp" / FSDPStrategy(auto_wrap_policy={Block}) /
      ModelParallelStrategy(2, 2) / ModelParallelStrategy(pipeline_parallel_size=2, data_parallel_size=2,
      tensor_parallel_size=1, pipeline_schedule="1F1B", microbatches=2)).
PP2xDP2 trains the example's GPT with the same initial weights rearranged into one nn.Sequential (which stage
declarations need; bench/_mp_common.py's gpt_sequential): stage 0 holds the embedding and blocks 0-1, stage 1
blocks 2-3, the final norm and the output layer.

Variants run interleaved (raw_ddp, ddp, raw_fsdp, fsdp, ...); the table shows medians over the repeats:
tokens/s (steady steps/s x global batch x sequence length; the ratio is to the raw loop of the same
parallelisation), the windowed steps/s (the median of windows of steps, less moved by the machine stalling),
the largest peak RSS of the 4 ranks and each rank's parameters + gradients + AdamW state. The last column says
whether the trained parameters' sum equals its raw loop's (same model, data and order: it must).
This driver imports no torch; on a small shared VM, compare the spread before reading a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PAIRS = (("raw_ddp", "ddp"), ("raw_fsdp", "fsdp"), ("raw_tp2dp2", "tp2dp2"), ("raw_pp2dp2", "pp2dp2"))
LABELS = {"raw_ddp": "raw DDP", "ddp": 'Trainer(strategy="ddp")', "raw_fsdp": "raw fully_shard",
          "fsdp": "Trainer(FSDPStrategy)", "raw_tp2dp2": "raw TP2xDP2 (parallelize_module + FSDP2)",
          "tp2dp2": "Trainer(ModelParallelStrategy(2, 2))",
          "raw_pp2dp2": "raw PP2xDP2 (PipelineStage 1F1B + FSDP2)",
          "pp2dp2": "Trainer(ModelParallelStrategy(pp=2, dp=2))"}
SIZE_ARGS = ("vocab", "dim", "heads", "layers", "seq", "global_batch", "steps", "warmup")
_FOREIGN = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(variant: str, args: argparse.Namespace, out: str) -> dict:
    sizes = [x for k in SIZE_ARGS for x in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4", "--master-addr=127.0.0.1",
                f"--master-port={free_port()}"]
    if variant.startswith("raw_"):
        cmd = [*torchrun, "_mp_raw.py"]
    else:  # the Trainer starts ranks 1-3 itself, or (--torchrun) joins the ranks torchrun started
        cmd = [*torchrun, "_mp_fleet.py"] if args.torchrun else [sys.executable, "_mp_fleet.py"]
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([*cmd, variant, *sizes, "--out", out], cwd=HERE, env=env, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0 or not os.path.exists(out):
        sys.exit(f"{variant} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    with open(out) as f:
        return json.load(f)


def report(args: argparse.Namespace, results: dict[str, list[dict]], pairs: tuple[tuple[str, str], ...]) -> None:
    med = statistics.median
    print(f"\nGPT dim {args.dim}, {args.heads} heads, {args.layers} layers, sequence {args.seq}, vocabulary "
          f"{args.vocab}, global batch {args.global_batch}; {args.steps} steps ({args.warmup} warm-up); 4 processes "
          f"x 1 thread, gloo; median of {args.repeats}; Trainer started by "
          f"{'torchrun' if args.torchrun else 'python (it starts ranks 1-3)'}")
    print(f"{'variant':<42} {'tokens/s':>9} {'x raw':>6} {'windowed steps/s':>17} {'peak RSS MiB':>13} "
          f"{'state MiB/rank':>15} {'same params':>12}")
    for raw, fleet in pairs:
        base = med(r["tokens_per_s"] for r in results[raw])
        for variant in (raw, fleet):
            runs = results[variant]
            tokens = med(r["tokens_per_s"] for r in runs)
            windowed = med(r["steps_per_s_windowed"] for r in runs)
            rss = med(max(x["peak_rss_mib"] for x in r["ranks"]) for r in runs)
            state = med(max(x["state_mib"] for x in r["ranks"]) for r in runs)
            ref = results[raw][0]["checksum"]
            same = all(abs(r["checksum"] - ref) <= 1e-6 * max(1.0, abs(ref)) for r in runs)
            print(f"{LABELS[variant]:<42} {tokens:>9.0f} {tokens / base:>6.3f} {windowed:>17.3f} {rss:>13.0f} "
                  f"{state:>15.2f} {'yes' if same else 'NO':>12}")
    spread = {v: f"{min(r['tokens_per_s'] for r in rs):.0f}..{max(r['tokens_per_s'] for r in rs):.0f}"
              for v, rs in results.items()}
    print("  tokens/s min..max: " + ", ".join(f"{v} {s}" for v, s in spread.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--torchrun", action="store_true", help="start the Trainer variants with torchrun too")
    parser.add_argument("--only", default=",".join(fleet for _, fleet in PAIRS),
                        help="the pairs to run, by their Trainer variant's name (default: all)")
    for name, default in (("vocab", 512), ("dim", 128), ("heads", 4), ("layers", 4), ("seq", 64),
                          ("global-batch", 8), ("steps", 30), ("warmup", 5)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps, args.warmup = 1, 12, 3
    only = args.only.split(",")
    pairs = tuple(pair for pair in PAIRS if pair[1] in only)
    if len(pairs) != len(only):
        parser.error(f"--only takes some of {', '.join(fleet for _, fleet in PAIRS)}; got {args.only}")
    work = tempfile.mkdtemp(prefix="bench-mp-")
    results: dict[str, list[dict]] = {v: [] for pair in pairs for v in pair}
    for rep in range(args.repeats):
        for variant in results:
            result = run_once(variant, args, os.path.join(work, f"{variant}-{rep}.json"))
            results[variant].append(result)
            print(f"  repeat {rep + 1}/{args.repeats} {variant:<11} {result['tokens_per_s']:8.0f} tokens/s", flush=True)
    report(args, results, pairs)


if __name__ == "__main__":
    main()
