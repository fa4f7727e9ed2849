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
