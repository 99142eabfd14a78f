"""Hang and desync diagnosis: every collective torchfleet issues is numbered, named and located.

The recorder: each collective torchfleet issues (``self.log(sync_dist=True)``'s reduction, ``all_gather``,
``barrier``, ``broadcast``, ``reduce_boolean_decision``, checkpoint barriers, the gradient
synchronisation of ``backward`` and the preemption agreement) goes through ``collective(name)``: it
gets this process's next sequence number, its name and the user's call site (file:line of the first
frame outside torchfleet and torch). The record is also written to a small per-rank file (the "black
box", a memory map: about a microsecond per collective), so that it survives the process whatever
kills it (a gloo abort, SIGKILL). Ranks that run the same program issue the same collectives in the
same order, so the same number names the same collective on every rank; where it does not, the ranks
desynchronised.

The watchdog: a thread per rank (``start``) that wakes every ``tick`` seconds. When this rank has been
inside one collective longer than ``hang_timeout``, it writes its Python stacks (faulthandler, every
thread) beside its black box and ends the process with ``HANG_EXIT_CODE``. When the launching process
asks (the ``dump`` file appears in the run's folder, because some rank failed or hung), it writes its
stacks too. The launching process (launchers/supervise.py) then reads every rank's black box and
stacks and raises one report (``report``): for each rank the collective it is in or last finished,
and whether the ranks disagree (a desync, naming both call sites) or all wait (a hang).

Under torchrun (no supervising launcher) each rank prints its own part of the report to stderr and
exits non-zero; the first rank to time out tells the others through the rendezvous store.

On CUDA (nccl), ``nccl_flight_recorder_env`` switches on PyTorch's own NCCL flight recorder before the
process group is created, and the report points to its dump.
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torchfleet.errors import ConfigurationError

#: the exit code of a rank that the watchdog ended because it waited in one collective longer than hang_timeout
HANG_EXIT_CODE = 76
#: the default ``hang_timeout`` (seconds), on CPU and GPU
DEFAULT_HANG_TIMEOUT_S = 300.0

_BOX_SIZE = 4096
_HEADER = struct.Struct("<4sqqbdd")  # magic, pid, seq, state, started, ended
#: the box also keeps the last _SLOTS collectives (seq, then "name\0site\0where"), slot seq % _SLOTS, so the report can
#: compare the ranks at the first number where they differ even when one rank has run past it
_SLOT_START, _SLOT_SIZE, _SLOTS = 128, 248, 16
_SLOT_SEQ = struct.Struct("<q")
_MAGIC = b"TFWD"
_NOT_IN, _IN, _DONE, _FAILED = 0, 1, 2, 3
_STATES = {_IN: "in", _DONE: "done", _FAILED: "failed"}

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


#: file name -> _USER (the user's code), _FOREIGN (torch, the standard library, torchfleet's collective plumbing) or
#: _OWN (torchfleet code that asks for a collective: named when no user code is on the stack)
_INTERNAL: dict[str, int] = {}
_USER, _FOREIGN, _OWN = 0, 1, 2
#: torchfleet files that only pass a collective on: never the place to name
_PLUMBING = ("watchdog.py", "module.py", "strategies" + os.sep, os.path.join("trainer", "logging.py"))


def _internal(name: str) -> int:
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"] + os.sep
    purelib = sysconfig.get_paths()["purelib"] + os.sep
    if name.startswith(_PKG_DIR):
        kind = _FOREIGN if name[len(_PKG_DIR):].startswith(_PLUMBING) else _OWN
    # "<string>": the ``python -c`` of a spawned process (ddp_spawn), with no source to point to
    elif (name.startswith((_torch_dir(), "<frozen")) or name == "<string>"
          or (name.startswith(stdlib) and not name.startswith(purelib))):
        kind = _FOREIGN
    else:
        kind = _USER
    _INTERNAL[name] = kind
    return kind


def call_site(depth: int = 2, function: bool = False) -> str:
    """``file:line`` (``function``: then `` in <function>``) of the first frame outside torchfleet, torch and the
    standard library (the user's code).

    With no user code on the stack (a collective the Trainer issues in a spawned rank), the torchfleet code that
    asked for it, e.g. ``torchfleet/trainer/eval_loop.py:40 in publish_epoch``.
    """
    frame = sys._getframe(depth)
    known = _INTERNAL
    own = None
    while frame is not None:
        name = frame.f_code.co_filename
        kind = known.get(name)
        if kind is None:
            kind = _internal(name)
        if kind == _USER:
            return f"{name}:{frame.f_lineno} in {frame.f_code.co_name}" if function else f"{name}:{frame.f_lineno}"
        if kind == _OWN and own is None:
            own = frame
        frame = frame.f_back
    if own is None:
        return "(no user code on the stack)"
    where = os.path.relpath(own.f_code.co_filename, os.path.dirname(_PKG_DIR[:-1]))
    return f"{where}:{own.f_lineno} in {own.f_code.co_name}"


# --------------------------------------------------------------------------- the recorder
class _Recorder:
    """This process's collectives: the number of the last one begun, the current one, where the loops are."""

    __slots__ = ("seq", "name", "site", "where", "state", "started", "ended", "bounded", "box", "position",
                 "next_site", "label")

    def __init__(self) -> None:
        self.seq = 0
        self.name = ""
        self.site = ""
        self.where = ""
        self.state = _NOT_IN
        self.started = 0.0
        self.ended = 0.0
        self.bounded = True
        self.box: mmap.mmap | None = None
        #: where the Trainer's loops are, e.g. ("training", epoch, batch); None outside a batch
        self.position: tuple | None = None
        #: the call site the next collective reports instead of its own (self.log's line for its sync)
        self.next_site: str | None = None
        #: what the collectives issued now are for ("self.log 'loss' sync_dist"), set by ``labelled``
        self.label: str | None = None


_REC = _Recorder()


def set_position(position: tuple | None) -> None:
    """The Trainer's loops say where they are (stage, epoch, batch): shown in reports and part of the fingerprint."""
    _REC.position = position


class labelled:  # noqa: N801 - a context manager
    """``with labelled("self.log 'loss' sync_dist", site):`` names the collectives issued inside (and the first's site)."""

    __slots__ = ("previous",)

    def __init__(self, label: str | None, site: str | None = None) -> None:
        self.previous = _REC.label
        if label is not None:  # None keeps the label of an enclosing block
            _REC.label = label
        if site:
            _REC.next_site = site

    def __enter__(self) -> labelled:
        return self

    def __exit__(self, *exc: Any) -> None:
        _REC.label = self.previous
        _REC.next_site = None


def set_next_site(site: str | None) -> None:
    """The call site the next collective is reported at (where the user asked for it, e.g. a self.log line)."""
    _REC.next_site = site


def _describe_position(position: tuple | None) -> str:
    if position is None:
        return ""
    stage, epoch, batch = position
    at = ", epoch end" if batch == "end" else f" batch {batch}"  # "end": the epoch-end hooks and reductions
    return f"{stage} epoch {epoch}{at}" if epoch is not None else f"{stage}{at}"


class collective:  # noqa: N801 - used as a statement: ``with collective("barrier(save)"):``
    """Record one collective: ``with collective(name): dist.barrier()``.

    ``bounded=False``: a wait of unknown length (rank 0 downloading a data set) that the watchdog leaves alone.
    """

    __slots__ = ("seq",)

    def __init__(self, name: str, site: str | None = None, bounded: bool = True) -> None:
        rec = _REC
        rec.seq += 1
        self.seq = rec.seq
        if rec.label is not None and "(" not in name:
            name = f"{name}({rec.label})"
        rec.name = name
        if site is None:
            site, rec.next_site = rec.next_site, None
        rec.site = site if site is not None else call_site()
        rec.where = _describe_position(rec.position)
        rec.bounded = bounded
        rec.started = time.monotonic()
        rec.state = _IN
        if rec.box is not None:
            _write_box(rec)

    def __enter__(self) -> collective:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        rec = _REC
        rec.state = _DONE if exc_type is None else _FAILED
        rec.ended = time.monotonic()
        box = rec.box
        if box is not None:
            _HEADER.pack_into(box, 0, _MAGIC, os.getpid(), rec.seq, rec.state, rec.started, rec.ended)

    def fingerprint(self) -> int:
        """A number in [1, 65536] that every rank computes alike for the same collective at the same point."""
        rec = _REC
        return (zlib.crc32(f"{self.seq}|{rec.name}|{rec.where}".encode()) & 0xFFFF) + 1


def current() -> dict[str, Any]:
    """This process's record: the collective it is in, or the last it finished."""
    rec = _REC
    return {"seq": rec.seq, "state": _STATES.get(rec.state, "none"), "name": rec.name, "site": rec.site,
            "where": rec.where, "started": rec.started, "ended": rec.ended, "pid": os.getpid(), "position": rec.position}


def _write_box(rec: _Recorder) -> None:
    box = rec.box
    assert box is not None
    text = f"{rec.name}\0{rec.site}\0{rec.where}".encode(errors="replace")[: _SLOT_SIZE - _SLOT_SEQ.size - 1]
    start = _SLOT_START + (rec.seq % _SLOTS) * _SLOT_SIZE
    _SLOT_SEQ.pack_into(box, start, rec.seq)
    box[start + _SLOT_SEQ.size:start + _SLOT_SEQ.size + len(text) + 1] = text + b"\0"
    _HEADER.pack_into(box, 0, _MAGIC, os.getpid(), rec.seq, rec.state, rec.started, rec.ended)


def box_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"collectives-{rank}.bin")


def stacks_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"stacks-{rank}.txt")


def read_box(path: str, now: float | None = None) -> dict[str, Any] | None:
    """A rank's last record from its black box; None when there is none."""
    try:
        with open(path, "rb") as f:
            data = f.read(_BOX_SIZE)
    except OSError:
        return None
    if len(data) < _HEADER.size or data[:4] != _MAGIC:
        return None
    _, pid, seq, state, started, ended = _HEADER.unpack_from(data, 0)
    history = {}
    for slot in range(_SLOTS):
        start = _SLOT_START + slot * _SLOT_SIZE
        (number,) = _SLOT_SEQ.unpack_from(data, start)
        if number > 0:
            text = data[start + _SLOT_SEQ.size:start + _SLOT_SIZE].split(b"\0\0", 1)[0].decode(errors="replace")
            history[number] = tuple((text.split("\0") + ["", "", ""])[:3])
    name, site, where = history.get(seq, ("", "", ""))
    now = time.monotonic() if now is None else now
    return {"seq": seq, "state": _STATES.get(state, "none"), "name": name, "site": site, "where": where,
            "pid": pid, "waited": (now - started) if state == _IN else (ended - started), "history": history}


# --------------------------------------------------------------------------- hang_timeout
def parse_hang_timeout(value: Any, owner: str = "Trainer") -> float | None:
    """``hang_timeout`` in seconds (None: no watchdog). Accepts seconds (int/float), a timedelta, None or 0."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        seconds = float("nan")
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise ConfigurationError(
            f"{owner}(hang_timeout={value!r}) is not valid: give the longest time, in seconds (a number or a "
            "datetime.timedelta), that a rank may wait in one collective before the run is stopped with a report "
            f"of what every rank was doing (default {DEFAULT_HANG_TIMEOUT_S:g}), or None or 0 to switch the "
            "watchdog off."
        )
    return seconds or None


# --------------------------------------------------------------------------- NCCL flight recorder
#: (variable, value): torch 2.13 reads TORCH_FR_* and still the older TORCH_NCCL_* names
_FR_BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_FR_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FLIGHT_RECORDER_ENTRIES = "2000"


def nccl_flight_recorder_env(environ: dict[str, str] | Any = None, folder: str | None = None,
                             run_dir: str | None = None) -> str:
    """Switch on PyTorch's NCCL flight recorder (before init_process_group); the dump files' prefix.

    Sets the ring buffer size, dump-on-timeout and where the dump goes, leaving alone any of them the user
    set. The dump of rank r is ``<prefix><r>``, in ``folder``, else in ``nccl-trace`` of the launcher's private run
    folder ``run_dir`` (shared by the ranks), else in a new private folder (mkdtemp)."""
    env = os.environ if environ is None else environ
    if not any(env.get(k) for k in _FR_BUFFER):
        env.update(dict.fromkeys(_FR_BUFFER, FLIGHT_RECORDER_ENTRIES))
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    prefix = next((env[k] for k in _FR_FILE if env.get(k)), None)
    if prefix is None:
        job = env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID") or env.get("MASTER_PORT") or str(os.getpid())
        if folder is None:  # never a name others can guess and create first
            folder = os.path.join(run_dir, "nccl-trace") if run_dir else tempfile.mkdtemp(prefix=f"torchfleet-nccl-{job}-")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        prefix = os.path.join(folder, "rank_")
        env.update(dict.fromkeys(_FR_FILE, prefix))
    return prefix


def _dump_nccl_trace(rank: int) -> str | None:
    """Ask the NCCL flight recorder for its entries now and write them where it would on a timeout."""
    prefix = next((os.environ[k] for k in _FR_FILE if os.environ.get(k)), None)
    if prefix is None:
        return None
    try:
        import torch.distributed as dist

        if dist.get_backend() != "nccl":
            return None
        from torch._C._distributed_c10d import _dump_nccl_trace as dump

        data = dump()
        path = f"{prefix}{rank}"
        with open(path, "wb") as f:
            f.write(data)
        return path
    except Exception:  # noqa: BLE001 - best effort: the report stands without it
        return None


# --------------------------------------------------------------------------- the watchdog
DUMP_REQUEST = "dump"
HANG_MARKER = "hang"
_STORE_KEY = "torchfleet/watchdog/hang"


@dataclass
class _Watch:
    folder: str
    rank: int
    world_size: int
    timeout: float | None
    supervised: bool
    store: Any
    nccl_prefix: str | None
    stop: threading.Event
    dumped: bool = False
    #: under torchrun, the other ranks' records read from the store when this rank found a desync
    peers: dict | None = None


_WATCH: _Watch | None = None


def active() -> _Watch | None:
    return _WATCH


def start(rank: int, world_size: int, hang_timeout: float | None, folder: str | None, store: Any = None,
          nccl_prefix: str | None = None) -> None:
    """In a rank, after the process group is up: open its black box and start the watchdog thread (once)."""
    global _WATCH
    if _WATCH is not None:
        _WATCH.timeout = hang_timeout
        return
    supervised = folder is not None
    if folder is None:  # torchrun, srun: a folder of this rank's own, removed when the process exits
        import atexit
        import shutil

        folder = tempfile.mkdtemp(prefix=f"torchfleet-watch-{rank}-")
        atexit.register(shutil.rmtree, folder, True)
    path = box_path(folder, rank)
    with open(path, "wb") as f:
        f.write(b"\0" * _BOX_SIZE)
    with open(path, "r+b") as f:
        _REC.box = mmap.mmap(f.fileno(), _BOX_SIZE)
    if _REC.seq:
        _write_box(_REC)
    _WATCH = _Watch(folder, rank, world_size, hang_timeout, supervised, store, nccl_prefix, threading.Event())
    # a rank killed by a fatal signal (gloo aborts a process whose collective received the wrong size) leaves its
    # stacks: beside its black box under our launchers, on stderr under torchrun
    if not faulthandler.is_enabled():
        try:
            target = open(stacks_path(folder, rank) + ".fatal", "w") if supervised else sys.stderr  # noqa: SIM115
            faulthandler.enable(file=target, all_threads=True)
        except (OSError, ValueError, AttributeError):
            pass
    threading.Thread(target=_run, args=(_WATCH,), name="torchfleet-watchdog", daemon=True).start()


def stop() -> None:
    """Stop the watchdog thread (the black box stays, for a later run in this process)."""
    global _WATCH
    watch, _WATCH = _WATCH, None
    if watch is not None:
        watch.stop.set()


def tick_for(timeout: float | None) -> float:
    if timeout is None:
        return 1.0
    return min(1.0, max(0.05, timeout / 10))


def _run(watch: _Watch) -> None:
    while not watch.stop.wait(tick_for(watch.timeout)):
        try:
            _check(watch)
        except Exception:  # noqa: BLE001 - the watchdog must never be what fails a run
            pass


def probe_after(timeout: float | None) -> float:
    """How long a rank waits in one collective before it compares its record with the other ranks' (desync)."""
    return min(2.0, timeout / 2) if timeout else 2.0


def _check(watch: _Watch) -> None:
    rec = _REC
    timeout = watch.timeout
    if timeout is not None and rec.state == _IN and rec.bounded:
        waited = time.monotonic() - rec.started
        if waited > timeout:
            _fire(watch)
            return
        if waited > probe_after(timeout):
            if _local_desync(watch) if watch.supervised else _store_desync(watch):
                _fire(watch, "found the ranks waiting in different collectives (a desync)")
                return
    if watch.dumped:
        return
    if watch.supervised:
        if os.path.exists(os.path.join(watch.folder, DUMP_REQUEST)):
            write_stacks(watch)
    elif watch.store is not None and watch.store.check([_STORE_KEY]):
        # torchrun: another rank timed out; print this rank's part, then leave (torchrun stops the rest)
        sys.stderr.write(_own_part(watch, "stops: another rank found a hang or a desync"))
        sys.stderr.flush()
        _exit_unsupervised(watch)


def _local_desync(watch: _Watch) -> bool:
    """Whether the ranks whose black boxes lie beside this one's wait in different collectives (read, not asked)."""
    records = {}
    for entry in os.listdir(watch.folder):
        if entry.startswith("collectives-") and entry.endswith(".bin"):
            rank = int(entry[len("collectives-"):-len(".bin")])
            records[rank] = read_box(os.path.join(watch.folder, entry))
    threshold = probe_after(watch.timeout)
    waiting = {r: rec for r, rec in records.items() if rec is not None and rec["state"] == "in"
               and rec["waited"] > threshold}
    return len(waiting) > 1 and analyse(waiting)[0] == "desync"


_RECORD_KEY = "torchfleet/watchdog/record/"


def _store_desync(watch: _Watch) -> bool:
    """Without a launcher's folder (torchrun): publish this rank's wait in the rendezvous store, read the others'."""
    store = watch.store
    if store is None:
        return False
    import json

    mine = current()
    mine["waited"] = time.monotonic() - mine["started"]
    mine["at"] = time.time()
    store.set(f"{_RECORD_KEY}{watch.rank}", json.dumps(mine))
    fresh = 4 * tick_for(watch.timeout) + 1.0  # a record older than this belongs to an earlier wait
    records = {watch.rank: mine}
    for rank in range(watch.world_size):
        key = f"{_RECORD_KEY}{rank}"
        if rank == watch.rank or not store.check([key]):
            continue
        rec = json.loads(store.get(key))
        if rec["state"] == "in" and time.time() - rec["at"] < fresh:
            records[rank] = rec
    if len(records) > 1 and analyse(records)[0] == "desync":
        watch.peers = records
        return True
    return False


def _exit_unsupervised(watch: _Watch) -> None:
    """Under torchrun: remove this rank's own folder (atexit does not run after os._exit), end with HANG_EXIT_CODE."""
    import shutil

    shutil.rmtree(watch.folder, ignore_errors=True)
    os._exit(HANG_EXIT_CODE)


def write_stacks(watch: _Watch) -> None:
    """This rank's Python stacks (every thread) beside its black box, once."""
    watch.dumped = True
    path = stacks_path(watch.folder, watch.rank)
    with open(path + ".tmp", "w") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
    os.replace(path + ".tmp", path)


def _fire(watch: _Watch, why: str | None = None) -> None:
    """This rank waited too long in one collective (or in a different one than others): dump, tell, end."""
    nccl = _dump_nccl_trace(watch.rank) if watch.nccl_prefix else None
    if not watch.supervised:
        if watch.store is not None:
            try:
                watch.store.set(_STORE_KEY, str(watch.rank))
            except Exception:  # noqa: BLE001
                pass
        sys.stderr.write(_own_part(watch, why or f"waited longer than hang_timeout={watch.timeout:g}s", nccl))
        sys.stderr.flush()
        time.sleep(min(2.0, 4 * tick_for(watch.timeout)))  # the others' watchdogs see the store key and print
        _exit_unsupervised(watch)
    write_stacks(watch)
    try:
        with open(os.path.join(watch.folder, HANG_MARKER), "w") as f:
            f.write(f"{watch.rank} {watch.timeout}")
    except OSError:
        pass
    handler = _in_process_supervisor
    if handler is not None:
        handler(watch)  # the launching process is this rank (ddp's rank 0): it reports and exits
    os._exit(HANG_EXIT_CODE)


#: set by the script launcher in rank 0, which is also the launching process: reports a hang of this rank itself
_in_process_supervisor: Any = None


def set_in_process_supervisor(handler: Any) -> None:
    global _in_process_supervisor
    _in_process_supervisor = handler


def explain_failure(exc: BaseException) -> None:
    """Under torchrun: a rank whose collective failed (the peer aborted, "Connection reset by peer") prints its part."""
    watch = _WATCH
    if watch is None or watch.supervised or _REC.state != _FAILED:
        return
    summary = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    sys.stderr.write(_own_part(watch, f"failed in a collective ({type(exc).__name__}: {summary})"))
    sys.stderr.flush()


def _own_part(watch: _Watch, why: str, nccl: str | None = None) -> str:
    import io

    rec = read_box(box_path(watch.folder, watch.rank)) or current()
    buf = io.StringIO()
    lines = [f"torchfleet: rank {watch.rank} of {watch.world_size} {why}.",
             "  " + describe_record(watch.rank, rec, watch.timeout)]
    if watch.peers:
        lines += ["  " + describe_record(r, rec) for r, rec in sorted(watch.peers.items()) if r != watch.rank]
        lines += ["  " + line for line in analyse(watch.peers)[1]]
    if nccl:
        lines.append(f"  NCCL flight recorder dump: {nccl}")
    elif watch.nccl_prefix:
        lines.append(f"  NCCL flight recorder dumps: {watch.nccl_prefix}<rank>")
    lines.append(f"  Python stacks of rank {watch.rank}:")
    buf.write("\n".join(lines) + "\n")
    tmp = tempfile.TemporaryFile("w+")
    faulthandler.dump_traceback(file=tmp, all_threads=True)
    tmp.seek(0)
    buf.write(_indent(tmp.read()))
    return buf.getvalue()


# --------------------------------------------------------------------------- the report
def describe_record(rank: int, rec: dict[str, Any] | None, timeout: float | None = None) -> str:
    if rec is None or not rec.get("seq"):
        return f"rank {rank}: no torchfleet collective yet"
    where = f", {rec['where']}" if rec.get("where") else ""
    at = f" called at {rec['site']}{where}"
    if rec["state"] == "in":
        return f"rank {rank}: in #{rec['seq']} {rec['name']} for {rec['waited']:.1f}s,{at}"
    verb = "failed in" if rec["state"] == "failed" else "not in a collective; its last was"
    return f"rank {rank}: {verb} #{rec['seq']} {rec['name']},{at}"


def _indent(text: str, prefix: str = "    ") -> str:
    return "".join(prefix + line for line in text.splitlines(keepends=True))


def analyse(records: dict[int, dict[str, Any] | None]) -> tuple[str, list[str]]:
    """(kind, lines): kind is "desync", "hang" or ""; lines explain it, naming the call sites."""
    known = {r: rec for r, rec in records.items() if rec is not None and rec.get("seq")}
    if len(known) < 2:
        return "", []
    # the first number at which two ranks' recent collectives differ (name or place in the loop)
    common = sorted(set.union(*(set(rec.get("history") or {}) for rec in known.values())))
    for seq in common:
        seen = {r: rec["history"][seq] for r, rec in known.items() if seq in (rec.get("history") or {})}
        if len(seen) > 1 and len({(n, w) for n, _, w in seen.values()}) > 1:
            a = next(iter(seen))
            b = next(r for r in seen if (seen[r][0], seen[r][2]) != (seen[a][0], seen[a][2]))
            (na, sa, wa), (nb, sb, wb) = seen[a], seen[b]
            return _desync(known, (
                f"Desync: the ranks called different collectives as #{seq}: rank {a} {na} at {sa}"
                f"{f' ({wa})' if wa else ''}, rank {b} {nb} at {sb}{f' ({wb})' if wb else ''}."
            ))
    by_seq: dict[int, list[int]] = {}
    for r, rec in known.items():
        by_seq.setdefault(rec["seq"], []).append(r)
    # the same number, different collectives: the ranks left the common order before this one
    for seq, ranks in sorted(by_seq.items()):
        names = {known[r]["name"] for r in ranks}
        if len(names) > 1:
            a, b = ranks[0], next(r for r in ranks if known[r]["name"] != known[ranks[0]]["name"])
            return _desync(known, (
                f"Desync: the ranks called different collectives as #{seq}: rank {a} {known[a]['name']} at "
                f"{known[a]['site']}{_at(known[a])}, rank {b} {known[b]['name']} at {known[b]['site']}{_at(known[b])}."
            ))
    waiting = {r: rec for r, rec in known.items() if rec["state"] == "in"}
    if len(by_seq) > 1:
        top = max(by_seq)
        ahead = by_seq[top]
        behind = sorted(r for r in known if known[r]["seq"] < top)
        behind_waiting = [r for r in behind if r in waiting]
        a = ahead[0]
        if behind_waiting:
            b = behind_waiting[0]
            return _desync(known, (
                f"Desync: rank {a} is in #{top} {known[a]['name']} (called at {known[a]['site']}{_at(known[a])}) "
                f"while rank {b} waits in #{known[b]['seq']} {known[b]['name']} (called at {known[b]['site']}"
                f"{_at(known[b])}): the ranks issued different numbers of collectives."
            ))
        b = behind[0]
        return "hang", [
            f"Hang: rank {a} waits in #{top} {known[a]['name']} (called at {known[a]['site']}{_at(known[a])}), "
            f"which rank{'s' if len(behind) > 1 else ''} {', '.join(map(str, behind))} never reached: rank {b}'s "
            f"last collective was #{known[b]['seq']} {known[b]['name']} (called at {known[b]['site']}{_at(known[b])}); "
            "it is still in its own code or in a collective torchfleet does not see (its stack is below), or it "
            "skipped this collective (code that runs on some ranks only)."
        ]
    if len(waiting) == len(known):
        seq = next(iter(by_seq))
        return "hang", [f"Hang: every rank waits in the same collective #{seq} {known[next(iter(known))]['name']}: "
                        "the collective itself does not complete (network, or a process outside this run)."]
    return "", []


_DESYNC_HINT = ("This is a control-flow divergence inside the run (the ranks took different paths through the "
                "program), not a network problem. Every rank must issue the same collectives in the same order: look "
                "for code that runs on some ranks only (if self.global_rank == ..., a self.log(sync_dist=True) or "
                "all_gather under a condition that differs between ranks, data of different lengths per rank; "
                "evaluation shards are exact, so ranks may run different numbers of validation/test/predict batches "
                "and a collective of your own in validation_step has no partner on a rank that ran out).")


def _desync(known: dict[int, dict[str, Any]], first: str) -> tuple[str, list[str]]:
    """("desync", lines): ``first``, where each rank's loops were at its latest collective (the Trainer's stage,
    epoch and batch; left out when no rank is in a Trainer loop, as in a Fleet loop), then the hint."""
    lines = [first]
    if any(rec.get("where") for rec in known.values()):
        lines.append("Loop positions: " + "; ".join(
            f"rank {r} {rec.get('where') or 'outside the Trainer loops'} (#{rec['seq']})"
            for r, rec in sorted(known.items())) + ".")
    return "desync", [*lines, _DESYNC_HINT]


def main_thread_stack(dump: str) -> str:
    """From a faulthandler dump of every thread, the blocks of threads not started by ``threading`` (the main one)."""
    blocks = [b for b in dump.split("\n\n") if b.strip()]
    main = [b for b in blocks if " in _bootstrap" not in b]
    return "\n\n".join(main or blocks) + "\n"


def _at(rec: dict[str, Any]) -> str:
    return f" ({rec['where']})" if rec.get("where") else ""


def report(folder: str, ranks: Iterator[int] | list[int], timeout: float | None = None,
           stacks_for: str = "outside") -> tuple[str, str]:
    """(kind, text): the collectives table of every rank whose black box is in ``folder``, its analysis, stacks.

    ``stacks_for``: "outside" shows the stacks of ranks that are not waiting in a collective, "all" every rank's.
    """
    now = time.monotonic()
    records = {r: read_box(box_path(folder, r), now) for r in ranks}
    if not any(records.values()):
        return "", ""
    kind, analysis = analyse(records)
    lines = ["Collectives (torchfleet numbers each collective it issues; the same number is the same collective "
             "on every rank):"]
    lines += ["  " + describe_record(r, rec, timeout) for r, rec in sorted(records.items())]
    lines += analysis
    if kind == "hang" and timeout:
        lines.append(f"(hang_timeout={timeout:g}s; raise it on Trainer/Fleet if this wait was legitimate, e.g. rank 0 "
                     "writing a large checkpoint, or pass hang_timeout=None to switch the watchdog off.)")
    for r, rec in sorted(records.items()):
        if stacks_for == "all" or rec is None or rec["state"] == "done":
            text = ""
            for path in (stacks_path(folder, r), stacks_path(folder, r) + ".fatal"):
                try:
                    with open(path) as f:
                        text = main_thread_stack(f.read()) if os.path.getsize(path) else ""
                except OSError:
                    continue
                if text.strip():
                    break
            if not text.strip():
                continue
            lines.append(f"Python stack of rank {r} (main thread):")
            lines.append(_indent(text).rstrip("\n"))
    prefix = next((os.environ[k] for k in _FR_FILE if os.environ.get(k)), None)
    if prefix and os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT"):
        lines.append(f"NCCL flight recorder dumps (nccl runs): {prefix}<rank>")
    return kind, "\n".join(lines)
