"""Test clusters need several distinct ports at once (a Kafka broker's client, controller and
SASL listeners): two ``free_port()`` calls in a row can return the same port, and a broker
given one port twice refuses to format its storage (seen in CI)."""

from __future__ import annotations

from shallowmirror.testing.embedded import free_ports


def test_ports_chosen_together_are_distinct_and_avoid_the_given_ones():
    for _ in range(100):
        ports = free_ports(3)
        assert len(set(ports)) == 3
        again = free_ports(2, avoid=tuple(ports))
        assert len(set(again)) == 2 and not set(again) & set(ports)


def test_ports_come_from_below_the_ephemeral_range_and_are_free():
    """A port from the kernel's ephemeral range can become an outgoing connection's local port
    in the seconds before a broker binds it (a Kafka test broker then failed with "Unable to
    start acceptor"): where the kernel says where that range starts, the ports are below it."""
    import socket

    from shallowmirror.testing.embedded import _ports_below_ephemeral

    below = _ports_below_ephemeral()
    ports = free_ports(5)
    if below is not None:
        assert all(below[0] <= port < below[1] for port in ports), (below, ports)
    for port in ports:                 # free: a listener can bind each at once
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
            sock.listen()
