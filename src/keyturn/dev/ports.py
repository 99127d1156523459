"""Free loopback ports."""

from __future__ import annotations

import socket


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port_pair(host: str = "127.0.0.1", attempts: int = 50) -> int:
    """A port P with P+1 also free (OpenBao's dev server binds both)."""
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port < 65535 and port_is_free(port + 1, host):
            return port
    raise RuntimeError("no two adjacent free ports on loopback")
