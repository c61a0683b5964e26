"""Ports and interfaces for the servers a run starts (engines, routers, rendezvous), below every layer that
starts one."""

import os
import random
import socket
from pathlib import Path

_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A port free to listen on now, taken from below the kernel's ephemeral range.

    A port that bind(("", 0)) hands out lies in the ephemeral range, which every outgoing connection on the
    machine draws from too: between this call and the server's bind, a client socket (the router's own health
    checks to its workers, say) can take it, and the server dies with "Address already in use". Below the range
    only a process that names the port can. Ports already handed out by this process are not handed out again.
    """
    low, _ = _ephemeral_range()
    candidates = list(range(max(1024, low - 12000), low))
    random.shuffle(candidates)
    for port in candidates:
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # every port below the range taken: fall back to one the kernel picks
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOOPBACK = ("127.0.0.1", "localhost")  # the hosts local servers are served and reached at


def loopback_sockets_env(host: str) -> dict[str, str]:
    """For processes whose peers all reach them at ``host``: when that is the loopback, NCCL's bootstrap sockets
    on the loopback too (``NCCL_SOCKET_IFNAME=lo``). NCCL otherwise listens on the machine's first outward
    interface even when every rank is on this node; the data itself goes over NVLink or shared memory either
    way. A value the user set wins; another host (several nodes) gets nothing."""
    if host not in LOOPBACK:
        return {}
    return {"NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", "lo")}
