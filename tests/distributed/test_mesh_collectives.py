"""Collectives over a device mesh dimension (``group=``) with 4 real gloo processes (TP2 x DP2), one launch
(tests/distributed/scripts/mesh_collectives.py): results equal a hand reduction over the dimension's ranks, a rank
outside a group gets the clear error, and a rank that skips a collective over "tensor_parallel" is reported naming
that dimension and its ranks, while the groups' differing numbers of their own collectives are no desync."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.distributed import sharded_helpers
from tests.distributed.test_ddp import ROOT

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "distributed", "scripts", "mesh_collectives.py")


def _line(marker: str) -> str:
    with open(SCRIPT) as f:
        return next(f"mesh_collectives.py:{n}" for n, text in enumerate(f, 1) if f"# {marker}" in text)


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> tuple[dict, str]:
    out = str(tmp_path_factory.mktemp("mesh_collectives"))
    proc = sharded_helpers.run_script(SCRIPT, {"out": out, "hang_timeout": 20}, timeout=240)
    assert proc.returncode != 0, proc.stderr[-3000:]
    results = {}
    for rank in range(4):
        path = os.path.join(out, f"rank-{rank}.json")
        assert os.path.exists(path), proc.stderr[-3000:]
        with open(path) as f:
            results[rank] = json.load(f)
    return results, proc.stderr


def test_collectives_over_a_mesh_dimension_equal_a_hand_reduction(launch):
    results, _ = launch
    for rank, got in results.items():
        # mesh (data_parallel=2, tensor_parallel=2) over ranks 0..3: tensor-parallel groups {0,1} {2,3},
        # data-parallel groups {0,2} {1,3}; rank r contributes r + 1
        tp = [2 * (rank // 2), 2 * (rank // 2) + 1]
        dp = [rank % 2, rank % 2 + 2]
        assert got["tp_sum"] == [float(sum(r + 1 for r in tp))], rank
        assert got["tp_gather"] == [float(r + 1) for r in tp], rank
        assert got["dp_mean"] == [sum(r + 1 for r in dp) / 2], rank
        assert got["world_sum"] == [10.0], rank


def test_a_rank_outside_the_group_gets_a_clear_error_at_once(launch):
    results, _ = launch
    assert results[0]["pair_sum"] == results[1]["pair_sum"] == [3.0]
    for rank in (2, 3):
        error = results[rank]["pair_error"]
        assert error.startswith(f"GroupMembershipError: Rank {rank} called all_reduce over the mesh dimension 'pair' "
                                "whose ranks are 0,1, and is not one of them"), error
        assert "group='tensor_parallel'" in error


def test_a_reduce_op_where_the_group_goes_says_to_name_it(launch):
    results, _ = launch
    for got in results.values():
        error = got["reduce_op_as_group"]
        assert error.startswith("ConfigurationError: all_reduce(group='sum')"), error
        assert "all_reduce(data, reduce_op='sum')" in error and "('data_parallel', 'tensor_parallel')" in error


def test_a_rank_skipping_a_collective_over_the_dimension_is_reported_naming_it(launch):
    _, stderr = launch
    desync = next((line for line in stderr.splitlines() if "Desync:" in line), None)
    assert desync is not None, stderr[-4000:]
    # rank 2 waits for rank 3 in the tensor-parallel collective; rank 3 went on to the barrier
    assert re.search(r"rank 2 is in #\d+ all_reduce\(fleet\.all_reduce\) over 'tensor_parallel' \(ranks 2,3\) "
                     rf"\(called at \S*{_line('TP-LINE')}\) while rank 3 waits in #\d+ barrier\(end of step\) "
                     rf"\(called at \S*{_line('STEP-LINE')}\)", desync), desync
    # ranks 0 and 1 ran three more collectives over their own group than ranks 2 and 3: not what is reported
    assert "(ranks 0,1)" not in desync
    # each rank's line (a rank whose peer the watchdog ended may have failed in its collective meanwhile)
    assert re.search(r"rank 2: (failed )?in #\d+ all_reduce\(fleet\.all_reduce\) over 'tensor_parallel' \(ranks 2,3\)",
                     stderr), stderr[-4000:]
    assert re.search(r"rank 0: (failed )?in #\d+ barrier\(end of step\)", stderr)
