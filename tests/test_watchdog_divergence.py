"""The watchdog's report of ranks whose programs took different paths, and the call sites it names, without
processes (tests/distributed/test_loop_shape.py checks the same with real ranks under ddp_spawn)."""

from __future__ import annotations

import os
import threading

from torchfleet import watchdog


def _rec(seq, state, name, where, site="t.py:1"):
    return {"seq": seq, "state": state, "name": name, "site": site, "where": where, "waited": 1.0,
            "history": {seq: (name, site, where)}}


def test_the_same_collective_at_different_loop_positions_is_a_control_flow_divergence():
    # rank 0 validated (its epoch-end reduction), rank 1 skipped validation: the same name and number, elsewhere
    name = "all_gather_object(self.log sync_dist names, epoch end)"
    kind, lines = watchdog.analyse({0: _rec(3, "in", name, "validate epoch 0, epoch end"),
                                    1: _rec(3, "in", name, "training epoch 0, epoch end")})
    text = "\n".join(lines)
    assert kind == "desync"
    assert "control-flow divergence inside the run" in text and "not a network problem" in text
    assert "the collective itself does not complete" not in text
    assert "Loop positions: rank 0 validate epoch 0, epoch end (#3); rank 1 training epoch 0, epoch end (#3)." in lines


def test_different_numbers_of_collectives_name_each_ranks_position():
    r0 = _rec(9, "in", "barrier(x)", "training epoch 1 batch 4")
    r1 = _rec(7, "in", "all_reduce(self.log 'a' sync_dist)", "validate batch 2")
    kind, lines = watchdog.analyse({0: r0, 1: r1})
    assert kind == "desync"
    assert "rank 0 training epoch 1 batch 4 (#9); rank 1 validate batch 2 (#7)" in "\n".join(lines)
    assert "control-flow divergence" in "\n".join(lines)


def test_every_rank_in_the_same_collective_at_the_same_position_is_still_a_hang():
    same = "training epoch 0 batch 3"
    kind, lines = watchdog.analyse({0: _rec(5, "in", "backward", same), 1: _rec(5, "in", "backward", same)})
    assert kind == "hang" and "the collective itself does not complete" in lines[0]


def test_positions_name_the_epoch_end():
    assert watchdog._describe_position(("training", 2, "end")) == "training epoch 2, epoch end"
    assert watchdog._describe_position(("test", None, "end")) == "test, epoch end"
    assert watchdog._describe_position(("validate", 1, 4)) == "validate epoch 1 batch 4"


def test_without_user_code_the_site_is_torchfleets_own_caller_not_a_spawned_string():
    # a spawned rank's stack: the ``python -c`` of multiprocessing ("<string>"), then torchfleet's loops only
    package = os.path.dirname(os.path.dirname(os.path.abspath(watchdog.__file__)))  # torchfleet/, above watchdog/
    loop_file = os.path.join(package, "trainer", "some_loop.py")
    plumbing_file = os.path.join(package, "strategies", "some_strategy.py")
    namespace = {"call_site": watchdog.call_site}
    exec(compile("def collective():\n    return call_site(1)\n", plumbing_file, "exec"), namespace)
    exec(compile("\n\ndef loop():\n    return collective()\n", loop_file, "exec"), namespace)
    exec(compile("def main(out):\n    out.append(loop())\n", "<string>", "exec"), namespace)
    out: list[str] = []
    thread = threading.Thread(target=namespace["main"], args=(out,))  # no pytest (user) frames below it
    thread.start()
    thread.join()
    assert out == [f"torchfleet{os.sep}trainer{os.sep}some_loop.py:4 in loop"]


def test_a_fleet_loop_without_positions_gets_no_positions_line():
    kind, lines = watchdog.analyse({0: _rec(4, "in", "all_reduce(fleet.all_reduce)", ""),
                                    1: _rec(4, "in", "barrier(end of step)", "")})
    assert kind == "desync" and not any(line.startswith("Loop positions") for line in lines)
    assert "control-flow divergence inside the run" in lines[-1]


def _grec(seq, state, name, group, site="t.py:1"):
    return {"seq": seq, "state": state, "name": name, "site": site, "where": "", "waited": 1.0, "group": group,
            "history": {(group, seq) if group else seq: (name, site, "")}}


def test_groups_running_different_numbers_of_their_own_collectives_are_no_desync():
    tp01, tp23 = watchdog.group_text([0, 1], "tensor_parallel"), watchdog.group_text([2, 3], "tensor_parallel")
    # {0,1} is at its 9th collective over its group, {2,3} at its 4th; nobody waits: nothing to report
    records = {0: _grec(9, "done", "all_reduce", tp01), 1: _grec(9, "done", "all_reduce", tp01),
               2: _grec(4, "done", "all_reduce", tp23), 3: _grec(4, "done", "all_reduce", tp23)}
    assert watchdog.analyse(records) == ("", [])
    # every group waits in its own collective: a hang of the collectives themselves, not ranks disagreeing
    for rec in records.values():
        rec["state"] = "in"
    kind, lines = watchdog.analyse(records)
    assert kind == "hang" and "over 'tensor_parallel' (ranks 0,1)" in lines[0] and "(ranks 2,3)" in lines[0]


def test_a_rank_of_the_group_that_never_reached_its_collective_is_named_with_the_group():
    tp23 = watchdog.group_text([2, 3], "tensor_parallel")
    records = {0: _rec(5, "done", "barrier(end of step)", ""), 1: _rec(5, "done", "barrier(end of step)", ""),
               2: _grec(3, "in", "all_reduce(self.all_reduce)", tp23, "t.py:7"),
               3: _rec(5, "done", "barrier(end of step)", "", "t.py:8")}
    kind, lines = watchdog.analyse(records)
    assert kind == "hang"
    assert lines[0].startswith("Hang: rank 2 waits in #3 all_reduce(self.all_reduce) over 'tensor_parallel' "
                               "(ranks 2,3) (called at t.py:7), which rank 3 never reached")


def test_group_text_names_the_dimension_and_lists_a_long_progression_short():
    from torchfleet.watchdog.groups import group_ranks

    text = watchdog.group_text(list(range(0, 64, 4)), "data_parallel")
    assert text == "data_parallel|0,4,...,60" and group_ranks(text) == set(range(0, 64, 4))
    assert watchdog.over(text) == " over 'data_parallel' (ranks 0,4,...,60)"
    assert watchdog.over(watchdog.group_text([3, 1])) == " over ranks 1,3" and watchdog.over("") == ""
