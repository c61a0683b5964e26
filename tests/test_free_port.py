"""free_port hands out ports that outgoing connections cannot take before the server binds them."""

import socket

from vime_ext.net import _ephemeral_range, free_port


def test_ports_lie_below_the_ephemeral_range_and_are_not_repeated():
    low, high = _ephemeral_range()
    assert 1024 <= low < high
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low for p in ports), [p for p in ports if not 1024 <= p < low]


def test_handed_out_ports_are_free_to_listen_on():
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", free_port()))  # raises if the port was taken
            s.listen()
