"""When ``MirrorEngine`` takes source and target for one cluster (the integration tests run the
refusal itself on real brokers, tests/integration/test_mirror_cli.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from shallowmirror.engine import MirrorEngine
from shallowmirror.engine.engine import CopyIntoItselfError, prefix_mapper
from shallowmirror.errors import OperatorActionRequired, needs_operator
from shallowmirror.net.cluster import BrokerMetadata


def _cluster(cluster_id: str | None, *hosts: str) -> SimpleNamespace:
    brokers = {i: BrokerMetadata(i, host, 9092) for i, host in enumerate(hosts, start=1)}
    return SimpleNamespace(cluster_id=cluster_id, brokers=brokers)


def _engine(source, target, **kwargs) -> MirrorEngine:
    engine = MirrorEngine({"bootstrap.servers": "127.0.0.1:9092"},
                          {"bootstrap.servers": "localhost:9092"}, topics=["orders"], **kwargs)
    engine.source, engine.target = source, target
    return engine


def test_one_cluster_reached_twice_is_refused_with_what_to_do() -> None:
    engine = _engine(_cluster("c1", "kafka-1", "kafka-2"), _cluster("c1", "kafka-1", "kafka-2"))
    with pytest.raises(CopyIntoItselfError, match="same cluster .cluster id c1. and topic "
                                                  "orders keeps its name") as raised:
        engine.check_clusters()
    # A flow stops with it rather than restarting into the same refusal.
    assert isinstance(needs_operator(raised.value), OperatorActionRequired)


@pytest.mark.parametrize("source, target", [
    (_cluster("c1", "kafka-1"), _cluster("c2", "kafka-1")),      # two clusters
    # A cluster restored from another's disks keeps its id, on other hosts.
    (_cluster("c1", "kafka-1"), _cluster("c1", "dr-kafka-1")),
    (_cluster(None, "kafka-1"), _cluster(None, "kafka-1")),      # no id given: nothing known
])
def test_clusters_that_are_not_one_pass(source, target) -> None:
    _engine(source, target).check_clusters()


def test_a_renamed_topic_on_one_cluster_passes() -> None:
    one = _cluster("c1", "kafka-1")
    _engine(one, one, topic_mapper=prefix_mapper("A")).check_clusters()
