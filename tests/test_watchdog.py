"""The watchdog's pieces without processes: hang_timeout checking, the NCCL flight recorder variables,
the black box round trip and the report's reading of records (hang versus desync)."""

from __future__ import annotations

from datetime import timedelta

import pytest

import torchfleet as tf
from torchfleet import watchdog
from torchfleet.errors import ConfigurationError


@pytest.mark.parametrize("value,seconds", [(5, 5.0), (2.5, 2.5), (timedelta(minutes=2), 120.0), (None, None), (0, None)])
def test_hang_timeout_accepts_seconds_timedeltas_and_off(value, seconds):
    assert tf.Trainer(accelerator="cpu", hang_timeout=value).hang_timeout == seconds
    assert tf.Fleet(accelerator="cpu", hang_timeout=value).hang_timeout == seconds


def test_hang_timeout_defaults_to_five_minutes_and_reaches_the_strategy():
    trainer = tf.Trainer(accelerator="cpu", strategy="ddp", devices=2)
    assert trainer.hang_timeout == 300.0 and trainer.strategy.hang_timeout == 300.0
    fleet = tf.Fleet(accelerator="cpu", strategy="ddp", devices=2, hang_timeout=7)
    assert fleet.strategy.hang_timeout == 7.0


@pytest.mark.parametrize("bad", [-1, "5", True, float("nan"), float("inf"), [5]])
def test_bad_hang_timeout_is_refused_with_what_is_accepted(bad):
    with pytest.raises(ConfigurationError, match=r"Trainer\(hang_timeout=.*timedelta.*None or 0"):
        tf.Trainer(accelerator="cpu", hang_timeout=bad)
    with pytest.raises(ConfigurationError, match=r"Fleet\(hang_timeout="):
        tf.Fleet(accelerator="cpu", hang_timeout=bad)


def test_nccl_flight_recorder_variables_are_set_without_overriding_the_users(tmp_path):
    env = {"MASTER_PORT": "1234"}
    prefix = watchdog.nccl_flight_recorder_env(env, folder=str(tmp_path / "fr"))
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
    assert prefix == str(tmp_path / "fr" / "rank_") and (tmp_path / "fr").is_dir()
    mine = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/trace_"}
    assert watchdog.nccl_flight_recorder_env(mine) == "/x/trace_"
    assert mine == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
                    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/trace_"}


def test_nccl_trace_folder_is_private_and_never_a_guessable_name(tmp_path, monkeypatch):
    import os
    import stat

    from torchfleet.launchers.supervise import remove_run_folder

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", None)
    # the name the old code used, made first by someone else: never written into
    (tmp_path / "tmp" / "torchfleet-nccl-trace-1234").mkdir()
    first = watchdog.nccl_flight_recorder_env({"MASTER_PORT": "1234"})
    second = watchdog.nccl_flight_recorder_env({"MASTER_PORT": "1234"})
    assert os.path.dirname(first) != os.path.dirname(second)  # a new folder each time (mkdtemp)
    for prefix in (first, second):
        folder = os.path.dirname(prefix)
        assert folder.startswith(str(tmp_path / "tmp")) and folder != str(tmp_path / "tmp" / "torchfleet-nccl-trace-1234")
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    # under our launchers: one folder the ranks share, inside the launch's private folder
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    prefix = watchdog.nccl_flight_recorder_env({"MASTER_PORT": "1"}, run_dir=str(run))
    assert prefix == str(run / "nccl-trace" / "rank_") and stat.S_IMODE(os.stat(run / "nccl-trace").st_mode) == 0o700
    (run / "collectives-0.bin").write_bytes(b"x")
    remove_run_folder(str(run))  # no dump: all goes
    assert not run.exists()
    run.mkdir()
    watchdog.nccl_flight_recorder_env({"MASTER_PORT": "1"}, run_dir=str(run))
    (run / "nccl-trace" / "rank_0").write_bytes(b"dump")
    (run / "collectives-0.bin").write_bytes(b"x")
    remove_run_folder(str(run))  # the dump a report pointed to stays where it said
    assert sorted(os.listdir(run)) == ["nccl-trace"] and (run / "nccl-trace" / "rank_0").read_bytes() == b"dump"


def _rec(seq, state, name, site="a.py:1"):
    return {"seq": seq, "state": state, "name": name, "site": site, "where": "", "waited": 1.0}


def test_same_number_different_collectives_is_a_desync_naming_both_sites():
    kind, lines = watchdog.analyse({0: _rec(7, "in", "barrier(x)", "t.py:10"), 1: _rec(7, "in", "all_gather", "t.py:20")})
    assert kind == "desync"
    assert "rank 0 barrier(x) at t.py:10" in lines[0] and "rank 1 all_gather at t.py:20" in lines[0]


def test_a_rank_behind_and_outside_a_collective_is_a_hang_not_a_desync():
    kind, lines = watchdog.analyse({0: _rec(7, "in", "barrier(x)"), 1: _rec(6, "done", "all_reduce")})
    assert kind == "hang" and "rank 1 never reached" in lines[0]
    kind, _ = watchdog.analyse({0: _rec(7, "in", "barrier(x)"), 1: _rec(6, "in", "all_reduce")})
    assert kind == "desync"  # both wait, in different collectives: neither can finish
    assert watchdog.analyse({0: _rec(7, "in", "barrier"), 1: _rec(7, "in", "barrier")})[0] == "hang"
    assert watchdog.analyse({0: _rec(7, "done", "barrier"), 1: _rec(7, "done", "barrier")})[0] == ""


def test_the_first_number_where_the_histories_differ_names_the_skipped_collective():
    # rank 1 skipped #7 (a synced log at batch 2) and ran on: its #7 is batch 3's backward
    r0 = _rec(8, "in", "backward")
    r0["history"] = {6: ("backward", "t.py:60", "batch 2"), 7: ("all_reduce(self.log)", "t.py:37", "batch 2"),
                     8: ("backward", "t.py:60", "batch 3")}
    r1 = _rec(7, "failed", "backward")
    r1["history"] = {6: ("backward", "t.py:60", "batch 2"), 7: ("backward", "t.py:60", "batch 3")}
    kind, lines = watchdog.analyse({0: r0, 1: r1})
    assert kind == "desync"
    assert lines[0] == ("Desync: the ranks called different collectives as #7: rank 0 all_reduce(self.log) at t.py:37 "
                        "(batch 2), rank 1 backward at t.py:60 (batch 3).")


def test_black_box_round_trip(tmp_path, monkeypatch):
    rec = watchdog._Recorder()
    monkeypatch.setattr(watchdog.numbering, "_REC", rec)  # the recorder lives there
    import mmap

    path = watchdog.box_path(str(tmp_path), 3)
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    with open(path, "r+b") as f:
        rec.box = mmap.mmap(f.fileno(), 4096)
    watchdog.set_position(("training", 1, 5))
    with watchdog.labelled("self.log 'x' sync_dist", "mine.py:12"), watchdog.collective("all_reduce"):
        inside = watchdog.read_box(path)
    after = watchdog.read_box(path)
    assert inside["state"] == "in" and after["state"] == "done" and inside["seq"] == after["seq"] == 1
    assert after["name"] == "all_reduce(self.log 'x' sync_dist)" and after["site"] == "mine.py:12"
    assert after["where"] == "training epoch 1 batch 5"
    assert after["history"][1] == ("all_reduce(self.log 'x' sync_dist)", "mine.py:12", "training epoch 1 batch 5")
    with watchdog.collective("barrier"):
        pass
    assert watchdog.read_box(path)["seq"] == 2
    assert watchdog.read_box(path)["site"].endswith("test_watchdog.py:" + str(_line_of("with watchdog.collective(\"barrier\")")))



def test_black_box_numbers_a_group_collective_within_its_group(tmp_path, monkeypatch):
    rec = watchdog._Recorder()
    monkeypatch.setattr(watchdog.numbering, "_REC", rec)
    import mmap

    path = watchdog.box_path(str(tmp_path), 0)
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    with open(path, "r+b") as f:
        rec.box = mmap.mmap(f.fileno(), 4096)
    tp = watchdog.group_text([0, 1], "tensor_parallel")
    for name, group in (("barrier", ""), ("all_reduce", tp), ("all_reduce", tp), ("barrier", "")):
        with watchdog.collective(name, site="s.py:1", group=group):
            pass
    box = watchdog.read_box(path)
    assert box["seq"] == 2 and box["group"] == "" and box["name"] == "barrier"  # the world's second
    assert box["history"][(tp, 2)] == ("all_reduce", "s.py:1", "") and set(box["history"]) == {1, 2, (tp, 1), (tp, 2)}
    assert watchdog.describe_record(0, {**box, "group": tp}).startswith(
        "rank 0: not in a collective; its last was #2 barrier over 'tensor_parallel' (ranks 0,1)")


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(n for n, line in enumerate(f, 1) if text in line and "_line_of" not in line)


_EXIT_PROGRAM = """
import atexit, threading, time
from torch.distributed import TCPStore
from torchfleet.watchdog import hang

calls = []
class Store:  # the rendezvous store as torchrun's ranks have it, counting the watchdog's questions
    def __init__(self):
        self.real = TCPStore("127.0.0.1", 0, 1, True)
    def check(self, keys):
        calls.append(threading.current_thread().name)
        return self.real.check(keys)

# registered before the watchdog starts, so it runs after the watchdog's own exit handler, still before finalising
atexit.register(lambda: print("at exit: watchdog alive", hang._THREAD.is_alive(), "asked", len(calls) > 0, flush=True))
hang.start(0, 2, 0.5, None, Store())  # no launcher's folder: as under torchrun; a tick of 0.05 s
time.sleep(0.5)
"""


def test_the_watchdog_thread_has_stopped_before_the_interpreter_finalises():
    # Issue 32 item 9: under torchrun the watchdog thread asks the rendezvous store every tick; a daemon thread inside
    # that C++ call when Python finalises aborts the process (SIGABRT) after a run that finished. It must be stopped
    # and joined at exit, while the interpreter is whole (scripts/stress_multinode_exit.py measures the runs)
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _EXIT_PROGRAM], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "at exit: watchdog alive False asked True" in proc.stdout, proc.stdout + proc.stderr
