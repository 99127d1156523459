"""Free loopback ports for the servers tests and the demo start.

They are drawn below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), which is
where every outgoing connection takes its source port: a server port drawn from that range
(`bind(0)`) can be taken by some client's connection in the moment between choosing it and
the server binding it, or while a stopped server (a Raft node) is down before it starts again
on the same port. With the suite on two workers, thousands of connections made that happen.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000  # above the well-known and most registered service ports


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def server_port_range() -> range:
    """Ports a test server may take: from LOWEST to just below the ephemeral range (the
    ephemeral range itself on a system whose range starts too low to leave room)."""
    try:
        first, last = (int(part) for part in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        first, last = 32768, 60999  # Linux's default
    if first - LOWEST >= 2000:
        return range(LOWEST, first - 1)
    return range(max(last + 1, LOWEST), 65534)


def free_port_pair(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A port P with P+1 also free (OpenBao binds its API on P and its cluster port on P+1)."""
    candidates = server_port_range()
    for _ in range(attempts):
        port = random.choice(candidates)  # spreading ports, not a secret
        if port_is_free(port, host) and port_is_free(port + 1, host):
            return port
    raise RuntimeError("no two adjacent free ports on loopback")
