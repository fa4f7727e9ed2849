"""Remote topic sync when the target's Metadata trails its own create (seen on Kafka 3.7 in CI):
a refresh that listed the just-created remote topic as missing got TOPIC_ALREADY_EXISTS, took
the listing's 0 as the count and sent CreatePartitions, which the target refused ("Topic already
has 2 partition(s)"): the topic was then not mirrored and the process exited 1. A scripted
admin stands in for the target because the lag is a few milliseconds wide on a real broker; the
same path runs on real Kafka in test_mirror_cli's deleted-remote-topic test."""

from __future__ import annotations

from types import SimpleNamespace

from confluent_kafka import KafkaError, KafkaException

from shallowmirror.mirror.config import resolve_mm2
from shallowmirror.mirror.topic_sync import TopicSync

PROPS = {"clusters": "A, B", "A.bootstrap.servers": "127.0.0.1:1",
         "B.bootstrap.servers": "127.0.0.1:2", "A->B.enabled": "true", "A->B.topics": "orders"}


class _Done:
    """A future that has already ended (raising ``error``, if given)."""

    def __init__(self, error: KafkaError | None = None) -> None:
        self.error = error

    def result(self, timeout: float | None = None) -> None:
        if self.error is not None:
            raise KafkaException(self.error)


def _metadata(topics: dict[str, int]) -> SimpleNamespace:
    return SimpleNamespace(topics={name: SimpleNamespace(error=None, partitions=dict.fromkeys(
        range(count))) for name, count in topics.items()})


class LaggingTarget:
    """Holds ``A.orders`` with ``partitions``; its listings say first what ``stale`` says, one
    per call (None: missing), as a broker's metadata does for a moment after a create or a
    grow. Creates and grows are refused as Kafka refuses them for a topic that already is there
    (with ``partitions``)."""

    def __init__(self, partitions: int, stale: list[int | None],
                 grow_refusal: int = KafkaError.INVALID_PARTITIONS) -> None:
        self.partitions = partitions
        self.stale = list(stale)
        self.grow_refusal = grow_refusal
        self.calls: list[str] = []

    def list_topics(self, timeout: float) -> SimpleNamespace:
        self.calls.append("list")
        count = self.stale.pop(0) if self.stale else self.partitions
        return _metadata({} if count is None else {"A.orders": count})

    def create_topics(self, topics: list, request_timeout: float) -> dict:
        self.calls.append("create")
        return {t.topic: _Done(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS,
                                          "Topic 'A.orders' already exists.")) for t in topics}

    def create_partitions(self, parts: list, request_timeout: float) -> dict:
        self.calls.append("grow")
        return {p.topic: _Done(KafkaError(self.grow_refusal,
                                          f"Topic already has {self.partitions} partition(s)."))
                for p in parts}


class Source:
    def list_topics(self, timeout: float) -> SimpleNamespace:
        return _metadata({"orders": 2})


def _sync(target: LaggingTarget) -> TopicSync:
    sync = TopicSync(resolve_mm2(dict(PROPS)).flows[0], Source(), target, timeout_s=1.0)
    sync._desired_configs = lambda topic: {}           # no DescribeConfigs in this script
    return sync


def test_a_topic_the_target_says_exists_is_waited_for_not_grown():
    """The refresh's listing and the next two miss the topic; the create says it exists."""
    target = LaggingTarget(partitions=2, stale=[None, None, None])
    sync = _sync(target)
    assert sync.refresh() == ["orders"]
    assert sync.errors() == {}
    assert target.calls == ["list", "create", "list", "list", "list"], target.calls


def test_a_refused_grow_of_a_topic_that_has_the_partitions_is_not_an_error():
    """The listing says 1 of 2 partitions; the grow is refused, for it has 2 already."""
    target = LaggingTarget(partitions=2, stale=[1])
    sync = _sync(target)
    assert sync.refresh() == ["orders"]
    assert sync.errors() == {}
    assert target.calls == ["list", "grow", "list"], target.calls


def test_a_topic_short_of_partitions_after_the_wait_is_still_an_error():
    """A target that really has 1 partition and refuses to add one: reported, left out."""
    target = LaggingTarget(partitions=1, stale=[])
    sync = _sync(target)
    assert sync.refresh() == []
    (message,) = sync.errors().values()
    assert "has 2 partitions but remote topic A.orders on B has 1" in message, message


def test_a_grow_refused_for_another_reason_fails_at_once_without_listing_again():
    """A broker without CreatePartitions (tansu) refuses otherwise: waiting for the listing
    there would stall each such topic of every refresh by the settle time."""
    target = LaggingTarget(partitions=1, stale=[], grow_refusal=KafkaError.INVALID_REQUEST)
    sync = _sync(target)
    assert sync.refresh() == []
    assert target.calls == ["list", "grow"], target.calls
    (message,) = sync.errors().values()
    assert "has 2 partitions but remote topic A.orders on B has 1" in message, message


class DeletedTarget(LaggingTarget):
    """The remote topic really was deleted: the create makes it."""

    def create_topics(self, topics: list, request_timeout: float) -> dict:
        self.calls.append("create")
        return {t.topic: _Done() for t in topics}


def test_a_remote_topic_listed_missing_is_called_gone_only_when_it_was(caplog):
    """The warning came twice for one deletion: after the sync re-created the topic, the next
    refresh's trailing listing also said "missing", and its create was refused as existing."""
    for target, warned in ((LaggingTarget(partitions=2, stale=[]), False),
                           (DeletedTarget(partitions=2, stale=[]), True)):
        sync = _sync(target)
        assert sync.refresh() == ["orders"]          # mirrored, 2 partitions on the target
        target.stale = [None, None]                 # then listed as missing
        caplog.clear()
        with caplog.at_level("WARNING", logger="shallowmirror.mirror.topic_sync"):
            assert sync.refresh() == ["orders"]
        gone = [r for r in caplog.records if "is gone from B" in r.getMessage()]
        assert len(gone) == int(warned), caplog.text
        assert sync.errors() == {}
