"""Where a 2-rank run's rendezvous store listens: rank 0 writes what it sees to OUT once the process group is up.

``python store_bind.py STRATEGY OUT``. OUT gets JSON: the MASTER_PORT, the local addresses of every listening
TCP socket on that port (from /proc/net/tcp and tcp6), and, for each IPv4 address of this machine other than
loopback, whether a connection to it on that port was accepted.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import sys

import torchfleet as tf

_SIOCGIFADDR = 0x8915


def listening_addresses(port: int) -> list[str]:
    """The local addresses of the sockets in LISTEN state on ``port`` (IPv4 and IPv6)."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: TCP_LISTEN
                    raw = bytes.fromhex(address)
                    # /proc prints each 32-bit word in host (little-endian) order
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                    family = socket.AF_INET if width == 8 else socket.AF_INET6
                    found.append(socket.inet_ntop(family, words))
    return found


def other_ipv4_addresses() -> list[str]:
    addresses = []
    for _, name in socket.if_nameindex():
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            address = socket.inet_ntoa(packed[20:24])
        except OSError:  # no IPv4 address on this interface
            continue
        finally:
            probe.close()
        if not address.startswith("127."):
            addresses.append(address)
    return addresses


def accepted(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def check(fleet: tf.Fleet, out: str) -> None:
    port = int(os.environ["MASTER_PORT"])
    if fleet.global_rank == 0:
        result = {"port": port, "listening": listening_addresses(port),
                  "reached": {a: accepted(a, port) for a in other_ipv4_addresses()}}
        with open(out, "w") as f:
            json.dump(result, f)
    fleet.barrier()  # the store still serves the other rank until here


if __name__ == "__main__":
    tf.Fleet(accelerator="cpu", strategy=sys.argv[1], devices=2).launch(check, sys.argv[2])
