"""The hang watchdog under nccl: the report, and PyTorch's NCCL flight recorder switched on and dumped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.distributed.test_watchdog import HANG_EXIT_CODE, ROOT, SCRIPT, _line
from tests.gpu.conftest import needs_cuda


@needs_cuda(2, "a rank asleep while the other waits in an nccl barrier: hang report and flight recorder dump")
def test_nccl_hang_reports_and_dumps_the_flight_recorder(tmp_path):
    prefix = str(tmp_path / "fr_rank_")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), ROOT]),
               TORCH_FR_DUMP_TEMP_FILE=prefix)
    for var in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        env.pop(var, None)
    cfg = json.dumps({"case": "sleep", "hang_timeout": 5, "accelerator": "cuda"})
    proc = subprocess.run([sys.executable, SCRIPT, cfg], capture_output=True, text=True, timeout=180, env=env,
                          cwd=ROOT)
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr[-3000:]
    assert "Rank 0 waited in one collective longer than hang_timeout" in proc.stderr
    assert _line("BARRIER-LINE") in proc.stderr
    assert f"NCCL flight recorder dumps (nccl runs): {prefix}<rank>" in proc.stderr
    assert os.path.getsize(prefix + "0") > 0  # rank 0's watchdog asked the recorder for its entries
