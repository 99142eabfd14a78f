"""Where a hivemind peer listens and whom it joins: the multiaddrs checked, and what the peer says about them.

A peer is reachable by anyone who can reach its port: hivemind peers are not authenticated. So where it listens is
the user's choice (``host_maddrs``), by default loopback only, and the peer says where it listens when it starts.
Measured with hivemind 1.1.12 (the p2p daemon, ``p2pd``, holds every socket of a peer; its averagers use that
daemon): ``host_maddrs`` governs the daemon's listening sockets, and its NAT port mapping (UPnP / NAT-PMP, on by
default in hivemind) adds a UDP socket on 0.0.0.0 whatever ``host_maddrs`` says, so it is turned on only where the
user listens on every interface.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from torchfleet.errors import ConfigurationError

#: where a peer listens unless told otherwise: this machine only (TCP, a free port)
DEFAULT_HOST_MADDRS = ("/ip4/127.0.0.1/tcp/0",)
#: what lightning-hivemind (and hivemind's examples) listen on: every interface
EVERY_INTERFACE_MADDRS = ("/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic")

_PEER_FORM = ("a multiaddr /ip4/ADDRESS/tcp/PORT/p2p/PEER_ID (or /ip6/..., /dns4/HOST/...), e.g. "
              "/ip4/127.0.0.1/tcp/31337/p2p/12D3KooWJ...; several as a list or one comma-separated string. The first "
              "peer logs the line to copy")
_HOST_FORM = ("a multiaddr /ip4/ADDRESS/tcp/PORT to listen on, e.g. /ip4/127.0.0.1/tcp/0 (this machine only, a free "
              "port), /ip4/10.0.0.5/tcp/31337 (one network) or /ip4/0.0.0.0/tcp/31337 (every interface); a list of them")


def _items(value: Any) -> list[Any] | None:
    """A comma-separated string or a list/tuple as its items; None for anything else."""
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    return None


def _parse(item: Any) -> Any:
    """``item`` as hivemind's Multiaddr, or the reason it is not one."""
    from hivemind.utils.multiaddr import Multiaddr

    if not isinstance(item, str):
        return f"{item!r} is a {type(item).__name__}, not a str"
    try:
        return Multiaddr(item)
    except Exception as exc:  # hivemind's parser raises its own StringParseError, ValueError, KeyError, ...
        return f"{item!r} is not a multiaddr ({' '.join(str(exc).split()) or type(exc).__name__})"


def check_initial_peers(value: Any, source: str) -> list[str] | None:
    """``initial_peers`` (given as ``source``: the argument or the environment variable) as a list of multiaddrs of
    running peers, None when empty; else one paragraph naming ``source`` and what is accepted."""
    if value is None:
        return None
    items = _items(value)
    problems = [] if items is not None else [f"{value!r} is neither a str nor a list"]
    for item in items or []:
        parsed = _parse(item)
        if isinstance(parsed, str):
            problems.append(parsed)
        elif "p2p" not in parsed:
            problems.append(f"{item!r} has no /p2p/PEER_ID part (which peer to join)")
        elif "tcp" not in parsed and "udp" not in parsed:
            problems.append(f"{item!r} has no /tcp/PORT (or /udp/PORT/quic) part")
    if problems:
        raise ConfigurationError(f"{source} is not valid: {'; '.join(problems)}. Give the addresses of running peers "
                                 f"of the collaboration, each {_PEER_FORM}.")
    return [str(i) for i in items] or None


def check_host_maddrs(value: Any) -> list[str]:
    """``host_maddrs`` as a list of multiaddrs to listen on (the default where None); else one paragraph."""
    if value is None:
        return list(DEFAULT_HOST_MADDRS)
    items = _items(value)
    problems = [] if items else [f"{value!r} names no address"]
    for item in items or []:
        parsed = _parse(item)
        if isinstance(parsed, str):
            problems.append(parsed)
        elif "p2p" in parsed:
            problems.append(f"{item!r} names a peer (/p2p/...): that belongs in initial_peers")
        elif not any(p in parsed for p in ("ip4", "ip6")) or not any(p in parsed for p in ("tcp", "udp")):
            problems.append(f"{item!r} is not an /ip4 or /ip6 address with a /tcp/PORT (or /udp/PORT/quic)")
    if problems:
        raise ConfigurationError(f"HivemindStrategy(host_maddrs={value!r}) is not valid: {'; '.join(problems)}. "
                                 f"Give {_HOST_FORM}.")
    return [str(i) for i in items]


def _address(maddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    parts = str(maddr).split("/")
    try:
        return ipaddress.ip_address(parts[2]) if len(parts) > 2 and parts[1] in ("ip4", "ip6") else None
    except ValueError:
        return None


def is_loopback(maddr: str) -> bool:
    """Whether the multiaddr names a loopback address (127.0.0.0/8, ::1)."""
    address = _address(maddr)
    return address is not None and address.is_loopback


def every_interface(maddrs: list[str]) -> bool:
    """Whether one of ``maddrs`` listens on every interface (0.0.0.0 or ::)."""
    return any((a := _address(m)) is not None and a.is_unspecified for m in maddrs)


def dht_options(host_maddrs: list[str]) -> dict[str, Any]:
    """What the DHT (its p2p daemon) is started with: the listening addresses, and NAT port mapping (asking the router
    to forward a port from outside) only where the peer listens on every interface."""
    return {"host_maddrs": list(host_maddrs), "nat_port_map": every_interface(host_maddrs)}


def where_it_listens(host_maddrs: list[str], visible: list[str]) -> tuple[str, bool]:
    """The paragraph a peer logs when it starts, and whether it is a warning (the peer is open beyond loopback)."""
    shown = ", ".join(visible) or "(no address yet)"
    if all(is_loopback(m) for m in host_maddrs):
        return (f"Hivemind: this peer listens on loopback only ({', '.join(host_maddrs)}; it answers at {shown}): "
                "processes on this machine can join, other machines cannot. To train with other machines, give every "
                "peer HivemindStrategy(host_maddrs=[...]) with an address the others reach, e.g. "
                "['/ip4/10.0.0.5/tcp/31337'] on a private network, or ['/ip4/0.0.0.0/tcp/31337'] for every interface; "
                "peers are not authenticated, so anyone who can reach that port can join.", False)
    opened = every_interface(host_maddrs)
    return (f"Hivemind: this peer listens on {', '.join(host_maddrs)}"
            + (", that is on every interface, asks the router to forward its port from outside (NAT port mapping),"
               if opened else "")
            + f" and announces {shown}. Peers are not authenticated: anyone who can reach these addresses can join "
            "the collaboration and send it gradients and parameters. To keep it to this machine, give "
            "host_maddrs=['/ip4/127.0.0.1/tcp/0'] (the default); to one private network, that network's address, "
            "e.g. ['/ip4/10.0.0.5/tcp/31337'], behind a firewall that closes the port to others.", True)
