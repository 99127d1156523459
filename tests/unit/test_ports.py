"""Test servers take ports outside the range outgoing connections draw their source ports from."""

from __future__ import annotations

import socket

from keyturn_devkit.dev.ports import EPHEMERAL_RANGE, free_port_pair, server_port_range


def test_server_ports_are_outside_the_ephemeral_range() -> None:
    first, last = (int(part) for part in EPHEMERAL_RANGE.read_text().split())
    ports = server_port_range()
    assert not set(range(first, last + 1)) & {ports.start, ports.stop - 1, ports.stop}
    port = free_port_pair()
    assert not first <= port <= last and not first <= port + 1 <= last


def test_a_free_pair_can_be_bound() -> None:
    port = free_port_pair()
    with socket.socket() as api, socket.socket() as cluster:
        api.bind(("127.0.0.1", port))
        cluster.bind(("127.0.0.1", port + 1))
