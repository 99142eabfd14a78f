"""How much `import torchfleet` costs on top of `import torch` (median of interleaved runs).

    python bench/import_time.py [--repeats 15]

Each measurement is a fresh interpreter (`python -X importtime` is not used: it slows imports).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "import torch": "import torch",
    "import torchfleet": "import torch, torchfleet",
    "from torchfleet import Trainer, Module, Fleet": "import torch; from torchfleet import Trainer, Module, Fleet",
}


def once(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    for code in CASES.values():  # warm the file cache
        once(code)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):
        for name, code in CASES.items():
            times[name].append(once(code))
    base = statistics.median(times["import torch"])
    print(f"{'case':<48} {'median s':>9} {'extra vs torch':>15}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<48} {med:>9.3f} {med - base:>+14.3f}s")


if __name__ == "__main__":
    main()
