"""Issue 19 item 10: a one-machine run's rendezvous store listens on loopback only, checked on the real sockets.

torch's env:// store listens on every interface (``*:MASTER_PORT``) even with MASTER_ADDR=127.0.0.1; torchfleet
creates the store itself for runs its launchers start on one machine. Read from /proc/net/tcp{,6} while the run
is up, and by connecting to the port on the machine's other addresses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.distributed.scripts.store_bind import other_ipv4_addresses
from tests.distributed.sharded_helpers import child_env

pytestmark = [pytest.mark.distributed]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "distributed", "scripts", "store_bind.py")


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_single_node_store_listens_on_loopback_only(tmp_path, strategy):
    out = tmp_path / "bind.json"
    proc = subprocess.run([sys.executable, SCRIPT, strategy, str(out)], capture_output=True, text=True, timeout=180,
                          env=child_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["listening"] == ["127.0.0.1"], seen  # one listener, on loopback: not 0.0.0.0 nor ::
    assert not any(seen["reached"].values()), seen  # refused on every other address of the machine


def test_the_probe_sees_a_listener_on_every_interface():
    # the check above could pass by reading nothing: a socket bound to all interfaces must show up as such
    import socket

    from tests.distributed.scripts.store_bind import accepted, listening_addresses

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert listening_addresses(port) == ["0.0.0.0"]
        for address in other_ipv4_addresses():
            assert accepted(address, port)
