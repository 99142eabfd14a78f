"""What proving a "dcp" checkpoint whole and one save's costs (torchfleet.checkpoint.integrity), beside saving and
reading the same checkpoint, on one process.

``python bench/checkpoint_integrity.py [MB] [SHARDS]`` (default 100 MB in 2 shard files, as 2 ranks write them):
saves a model of that size with torchfleet's "dcp" writer, then prints the seconds of the save's own DCP write,
of recording the files (sampled hashes), of reading the checkpoint whole, and of the load-time checks (the chunk
cover and the files against the record), each the best of 3, with the checks' cost as a fraction of the save and
the read, and what hashing every byte would cost instead.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch


def best(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _full_hash(file: str) -> str:
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    with open(file, "rb") as f:
        while chunk := f.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def main() -> None:
    import torch.distributed.checkpoint as dcp

    from torchfleet.checkpoint import integrity
    from torchfleet.checkpoint.dcp import _metadata, files_problem, read_dcp_full

    megabytes = float(sys.argv[1]) if len(sys.argv) > 1 else 100
    shards = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    rows = int(megabytes * 2**20 / 4 / 1024 / 8)
    state = {"state_dict": {f"layer{i}.weight": torch.randn(rows, 1024) for i in range(8)}}
    with tempfile.TemporaryDirectory() as folder:
        # one file per "rank": DCP's single-process writer makes one file per thread
        writer = dcp.FileSystemWriter(folder, thread_count=shards)
        save = best(lambda: dcp.save(state, storage_writer=writer, no_dist=True))
        record = best(lambda: integrity.record(folder, "torchfleet.pt"))
        size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
        marker = integrity.record(folder, "torchfleet.pt")
        read = best(lambda: read_dcp_full(folder))
        cover = best(lambda: integrity.cover_problem(folder, _metadata(folder)))
        files = best(lambda: integrity.files_changed(folder, marker))
        full = best(lambda: [_full_hash(os.path.join(folder, n)) for n in marker["files"]])
        assert files_problem(folder) is not None  # no torchfleet.pt here: only the timing of the parts is measured
    print(f"checkpoint: {size / 2**20:.0f} MiB in {len(marker['files'])} files ({shards} shards + .metadata)")
    print(f"{'step':<34}{'seconds':>10}{'of save':>10}{'of read':>10}")
    for name, seconds in (("DCP write (the save itself)", save), ("record: sampled hashes", record),
                          ("read whole (read_dcp_full)", read), ("check: chunk cover", cover),
                          ("check: files against the record", files), ("full-file blake2b (not used)", full)):
        print(f"{name:<34}{seconds:>10.4f}{seconds / save:>10.1%}{seconds / read:>10.1%}")


if __name__ == "__main__":
    main()
