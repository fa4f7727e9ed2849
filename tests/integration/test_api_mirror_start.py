"""``mirror``/``mirror_async`` from the first moment of a run: while the target topics are checked
and created, the README's stop event, ``timeout_s`` and cancellation end the run at once with
nothing mirrored and nothing raised; librdkafka's lines go through Python logging (no raw
``%3|...|FAIL|`` on stderr); a cluster that never answers raises ``ConnectionFailedError`` naming
it. A run that could never catch up (no source topic matches) raises instead of waiting for
ever, and a pattern run on one cluster never copies a topic into itself."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
from engine_support import group, load_topic

from shallowmirror.engine import mirror, mirror_async, prefix_mapper
from shallowmirror.errors import (
    ConfigError,
    ConnectionFailedError,
    PartitionsStoppedError,
    ReconnectDeadlineError,
)
from shallowmirror.testing.embedded import free_port
from shallowmirror.testing.listeners import HTTP_BAD_REQUEST, not_kafka_listener
from shallowmirror.testing.topics import TopicReadError, read_topic

pytestmark = pytest.mark.integration

#: Far less than the 30 s the topic check used to wait for an unreachable cluster, and than a
#: cluster's reconnect.deadline.ms (120 s): a run ending within it did not wait either out.
PROMPT_S = 10.0
FAST = {"partition.assignment": "all", "fetch.max.wait.ms": 100}


def _configs(down: str, source_cluster, target_cluster, address: str,
             **extra: object) -> tuple[dict, dict]:
    dead = {"bootstrap.servers": address, **extra}
    if down == "source":
        return dead, {**target_cluster.client_config(), **extra}
    return {**source_cluster.client_config(), **extra}, dead


@pytest.mark.parametrize("ending", ["stop", "timeout_s"])
@pytest.mark.parametrize("down", ["source", "target"])
def test_stop_or_timeout_while_a_cluster_is_unreachable_ends_the_run_at_once(
        down, ending, source_cluster, target_cluster, unique_topic, capfd):
    topic = unique_topic("down")
    load_topic(source_cluster, topic, 100, partitions=1)
    source, target = _configs(down, source_cluster, target_cluster, f"127.0.0.1:{free_port()}")
    stop = threading.Event()
    if ending == "stop":
        timer = threading.Timer(1.0, stop.set)
        timer.start()
    began = time.monotonic()
    stats = mirror(source, target, [topic], topic_mapper=prefix_mapper("src"), stop=stop,
                   timeout_s=100 if ending == "stop" else 1.0)
    took_s = time.monotonic() - began
    assert took_s < PROMPT_S, f"the run took {took_s:.1f} s to end"
    assert stats.records == 0
    err = capfd.readouterr().err
    assert "%3|" not in err and "|FAIL|" not in err, err[-2000:]   # librdkafka's raw lines


@pytest.mark.parametrize("listener", ["nothing listens", "not Kafka"])
@pytest.mark.parametrize("down", ["source", "target"])
def test_a_cluster_that_never_answers_raises_connection_failed_naming_it(
        down, listener, source_cluster, target_cluster, unique_topic):
    topic = unique_topic("never")
    load_topic(source_cluster, topic, 100, partitions=1)
    with contextlib.ExitStack() as stack:
        address = (f"127.0.0.1:{free_port()}" if listener == "nothing listens"
                   else stack.enter_context(not_kafka_listener(HTTP_BAD_REQUEST)))
        source, target = _configs(down, source_cluster, target_cluster, address,
                                  **{"reconnect.deadline.ms": 2000})
        began = time.monotonic()
        with pytest.raises(ConnectionFailedError) as caught:
            mirror(source, target, [topic], topic_mapper=prefix_mapper("src"),
                   until_caught_up=True)
    assert time.monotonic() - began < PROMPT_S + 2
    assert caught.value.where.cluster == down
    assert address in str(caught.value) and f"cluster {down}" in str(caught.value)


def test_cancelling_mirror_async_during_the_topic_check_leaves_nothing_running(
        target_cluster):
    nowhere = {"bootstrap.servers": f"127.0.0.1:{free_port()}"}
    cancelled_at: list[float] = []

    async def main() -> None:
        task = asyncio.create_task(mirror_async(nowhere, target_cluster.client_config(),
                                                ["orders"], topic_mapper=prefix_mapper("c")))
        await asyncio.sleep(1.0)
        cancelled_at.append(time.monotonic())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    threads_before = set(threading.enumerate())
    asyncio.run(main())             # waits for its executor threads: the topic check's too
    assert time.monotonic() - cancelled_at[0] < PROMPT_S
    assert not set(threading.enumerate()) - threads_before


@pytest.mark.parametrize("topics", ["a list", "a regex"])
def test_until_caught_up_with_no_matching_topic_raises_instead_of_waiting(
        topics, source_cluster, target_cluster, unique_topic):
    missing = unique_topic("missing")
    spec = [missing] if topics == "a list" else f"{missing}-.*"
    began = time.monotonic()
    with pytest.raises(ConfigError, match="nothing to mirror") as caught:
        mirror(source_cluster.client_config(), target_cluster.client_config(), spec,
               topic_mapper=prefix_mapper("src"), until_caught_up=True, timeout_s=30,
               **{**FAST, "group.id": group()})
    assert time.monotonic() - began < 30
    assert missing in str(caught.value) and source_cluster.bootstrap in str(caught.value)


def test_a_pattern_on_one_cluster_never_copies_a_topic_into_itself(source_cluster,
                                                                   unique_topic):
    """Source and target are one cluster; the mapper names a copy ``<topic>.copy`` and leaves a
    copy's name as it is. The copy exists already (with records of its own) and matches the
    pattern too: mirrored, it would be copied into itself for ever."""
    topic = unique_topic("loop")
    load_topic(source_cluster, topic, 500, partitions=1)
    load_topic(source_cluster, f"{topic}.copy", 100, partitions=1)

    def copy_of(name: str) -> str:
        return name if name.endswith(".copy") else f"{name}.copy"

    cfg = source_cluster.client_config()
    stats = mirror(cfg, cfg, f"{topic}.*", topic_mapper=copy_of, until_caught_up=True,
                   timeout_s=60, **{**FAST, "group.id": group()})
    assert stats.records == 500
    original = read_topic(cfg, topic)[0]
    copied = read_topic(cfg, f"{topic}.copy")[0]
    assert len(original) == 500
    assert [r.value for r in copied[100:]] == [r.value for r in original]   # nothing else


def test_until_caught_up_raises_when_partitions_stopped(source_cluster, target_cluster,
                                                        unique_topic):
    """Every batch larger than ``max.request.size`` stops its partition; a run asked to mirror
    until caught up used to return normally with nothing mirrored."""
    topic = unique_topic("stopped")
    load_topic(source_cluster, topic, 600, partitions=2, batch_bytes=16_000, linger_ms=5)
    with pytest.raises(PartitionsStoppedError) as caught:
        mirror(source_cluster.client_config(), target_cluster.client_config(), [topic],
               topic_mapper=prefix_mapper("st"), until_caught_up=True, timeout_s=60,
               **{**FAST, "group.id": group(), "max.request.size": 4096})
    message = str(caught.value)
    assert "2 of 2 partitions of cluster source stopped" in message, message
    assert f"{topic}-0: " in message and "max.request.size=4096" in message
    stats = caught.value.stats
    assert set(stats.stopped) == {(topic, 0), (topic, 1)}
    # Nothing from the first batch too large on: a partition's first record may go alone in a
    # batch that fits (Kafka's producer did that here), and only what precedes the stop is there.
    assert stats.records == sum(p.position for p in stats.partitions.values()) < 600


def test_a_target_gone_for_reconnect_deadline_ms_mid_run_fails_the_run(
        start_broker, source_cluster, unique_topic):
    """Mid-run, a target unreachable past ``reconnect.deadline.ms`` was retried for ever, while
    the log said it gave up (and ``abort.on.send.failure`` never applied): the run now fails
    with ``ReconnectDeadlineError``, as it does at start-up."""
    from confluent_kafka import Producer

    target = start_broker("gone")
    topic = unique_topic("gone")
    load_topic(source_cluster, topic, 100, partitions=1)
    copy = f"gone.{topic}"

    async def scenario() -> tuple[float, BaseException]:
        run = asyncio.create_task(mirror_async(
            source_cluster.client_config(), {**target.client_config(),
                                             "reconnect.deadline.ms": 3000},
            [topic], topic_mapper=prefix_mapper("gone"), timeout_s=120,
            **{**FAST, "group.id": group()}))
        def copies() -> int:
            try:
                return sum(map(len, read_topic(target.client_config(), copy).values()))
            except TopicReadError:
                return 0                        # not created yet

        began = time.monotonic()
        while await asyncio.to_thread(copies) < 100:
            assert not run.done() and time.monotonic() - began < 60, "no copies within 60 s"
            await asyncio.sleep(0.5)
        await asyncio.to_thread(target.stop)
        producer = Producer(source_cluster.client_config())
        for i in range(10):                     # something to send to the target now gone
            producer.produce(topic, value=b"after-%d" % i, partition=0)
        producer.flush(30)
        gone = time.monotonic()
        with pytest.raises(ReconnectDeadlineError) as caught:
            await asyncio.wait_for(run, 90)
        return time.monotonic() - gone, caught.value

    took_s, error = asyncio.run(scenario())
    assert took_s < 60, f"the run took {took_s:.0f} s to give up"
    assert "reconnect.deadline.ms=3000" in str(error) and "cluster target" in str(error)


def test_a_new_mapping_on_the_same_group_warns_that_it_starts_at_the_old_offsets(
        source_cluster, target_cluster, unique_topic, on_tansu, caplog):
    """A second ``mirror()`` into other target topics, on the default (shared) group, copied
    nothing and said so only at INFO. Needs commit metadata (tansu keeps none)."""
    if on_tansu:
        pytest.skip("tansu keeps no commit metadata: the old target topic is not known")
    topic = unique_topic("remap")
    load_topic(source_cluster, topic, 300, partitions=2)
    shared = {**FAST, "group.id": group()}
    first = mirror(source_cluster.client_config(), target_cluster.client_config(), [topic],
                   topic_mapper=prefix_mapper("p1"), until_caught_up=True, timeout_s=60,
                   **shared)
    assert first.records == 300
    caplog.clear()
    second = mirror(source_cluster.client_config(), target_cluster.client_config(), [topic],
                    topic_mapper=prefix_mapper("p2"), until_caught_up=True, timeout_s=60,
                    **shared)
    assert second.records == 0
    assert (f"its committed offsets were made mirroring into other target topics: p1.{topic} "
            f"(now p2.{topic})") in caplog.text, caplog.text[-3000:]


def test_a_cancel_during_the_final_commit_does_not_lose_it(source_cluster, target_cluster,
                                                             unique_topic, monkeypatch):
    """Ctrl-C under ``asyncio.run`` cancels the main task. Come while ``mirror_async`` waited for
    the engine's shutdown, the cancel went into the engine's task and cut its final commit: the
    whole run was mirrored again by the next start (tansu: every record twice)."""
    from confluent_kafka import Consumer, TopicPartition

    from shallowmirror.engine.core import EngineCore

    topic = unique_topic("cancel-commit")
    load_topic(source_cluster, topic, 3000, partitions=3)
    g = group()
    original = EngineCore._positions_to_commit
    cancelled = []

    async def cancel_then_commit(self, *args, **kwargs):
        main = cancelled[0] if cancelled else None
        if main is not None and not main.done():
            main.cancel()                    # as asyncio.run's SIGINT handler does
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(EngineCore, "_positions_to_commit", cancel_then_commit)

    async def scenario() -> None:
        cancelled.append(asyncio.current_task())
        await mirror_async(source_cluster.client_config(), target_cluster.client_config(),
                           [topic], topic_mapper=prefix_mapper("cc"), until_caught_up=True,
                           **{"group.id": g, "partition.assignment": "all"})

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario())
    consumer = Consumer({**source_cluster.client_config(), "group.id": g})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    finally:
        consumer.close()
    target = read_topic(target_cluster.client_config(), f"cc.{topic}")
    assert {tp.partition: tp.offset for tp in committed} == {
        p: len(records) for p, records in target.items()}
    assert sum(map(len, target.values())) == 3000


def test_the_stats_say_why_the_run_ended(source_cluster, target_cluster, unique_topic):
    """``mirror(until_caught_up=True, timeout_s=N)`` returned the same stats whether it had
    caught up or run out of time: a caller could not tell a finished copy from a cut one."""
    topic = unique_topic("ended")
    load_topic(source_cluster, topic, 200, partitions=1)
    source, target = source_cluster.client_config(), target_cluster.client_config()
    caught = mirror(source, target, [topic], topic_mapper=prefix_mapper("e1"),
                    until_caught_up=True, timeout_s=60, **{**FAST, "group.id": group()})
    assert (caught.ended_by, caught.records) == ("caught_up", 200)
    timed = mirror(source, target, [topic], topic_mapper=prefix_mapper("e2"), timeout_s=3,
                   **{**FAST, "group.id": group()})
    assert timed.ended_by == "timeout"
    stop = threading.Event()
    timer = threading.Timer(3.0, stop.set)
    timer.start()
    stopped = mirror(source, target, [topic], topic_mapper=prefix_mapper("e3"), stop=stop,
                     timeout_s=120, **{**FAST, "group.id": group()})
    assert stopped.ended_by == "stop"


@pytest.mark.parametrize("create_topics", [True, False])
def test_a_topic_mapper_that_returns_no_topic_name_fails_the_run_naming_it(
        source_cluster, target_cluster, unique_topic, create_topics):
    """A mapper returning an int failed inside confluent-kafka's NewTopic with its own
    TypeError; one returning 'bad name' created that topic on tansu. Either way the error did
    not say which mapper or source topic."""
    from shallowmirror.engine import TopicMapperError

    topic = unique_topic("mapped")
    load_topic(source_cluster, topic, 50, partitions=1)

    def broken(name: str) -> str:
        return f"copy of {name}"

    began = time.monotonic()
    with pytest.raises(TopicMapperError) as caught:
        mirror(source_cluster.client_config(), target_cluster.client_config(), [topic],
               topic_mapper=broken, until_caught_up=True, timeout_s=60,
               create_topics=create_topics, **{**FAST, "group.id": group()})
    assert time.monotonic() - began < 30
    assert f"'{broken.__qualname__}' returned 'copy of {topic}' for source topic {topic}" in \
        str(caught.value)
    with pytest.raises(TopicReadError):          # nothing was created under that name
        read_topic(target_cluster, f"copy of {topic}")


def test_a_topic_mapper_that_raises_mid_run_stops_it_and_keeps_the_final_commit(
        source_cluster, target_cluster, unique_topic):
    """A mapper raising for a topic created mid-run killed the membership thread: the final
    commit was lost, and on tansu the next run mirrored all 3,000 records again."""
    from shallowmirror.engine import TopicMapperError
    from shallowmirror.replication.groups import Groups

    first, later = unique_topic("routed"), unique_topic("unrouted")
    load_topic(source_cluster, first, 3000, partitions=2)
    gid = group()

    def routes(topic: str) -> str:
        if topic == later:
            raise KeyError(f"no route for {topic}")
        return f"r.{topic}"

    stop = threading.Event()
    threading.Timer(4.0, lambda: load_topic(source_cluster, later, 10, partitions=1)).start()
    with pytest.raises(TopicMapperError) as caught:
        mirror(source_cluster.client_config(), target_cluster.client_config(),
               f"^({first}|{later})$", topic_mapper=routes, stop=stop, timeout_s=90,
               **{**FAST, "group.id": gid, "metadata.max.age.ms": 500})
    assert f"raised KeyError: 'no route for {later}' for source topic {later}" in \
        str(caught.value)
    committed = {(c.topic, c.partition): c.offset
                 for c in Groups(source_cluster.client_config(), alias="A").committed(gid)}
    assert sum(v for (t, _p), v in committed.items() if t == first) == 3000, committed


def test_several_source_topics_mapped_to_one_target_topic_create_it_once(
        source_cluster, target_cluster, unique_topic):
    """The target topic was asked for once per source topic in one CreateTopics request, which
    Kafka refused ("Duplicate topic name") and tansu could not parse."""
    a, b = unique_topic("merge-a"), unique_topic("merge-b")
    merged = unique_topic("merged")
    load_topic(source_cluster, a, 300, partitions=2)
    load_topic(source_cluster, b, 200, partitions=3)
    stats = mirror(source_cluster.client_config(), target_cluster.client_config(), [a, b],
                   topic_mapper=lambda _t: merged, until_caught_up=True, timeout_s=90,
                   **{**FAST, "group.id": group()})
    assert stats.records == 500
    copies = read_topic(target_cluster, merged)
    assert len(copies) == 3 and sum(len(r) for r in copies.values()) == 500


def test_a_listed_topic_the_source_lacks_is_warned_with_the_closest_name(
        source_cluster, target_cluster, unique_topic, caplog):
    """['orders', 'ordres'] mirrored orders and said 'caught up' without a word of 'ordres'."""
    topic = unique_topic("present")
    load_topic(source_cluster, topic, 100, partitions=1)
    # Two letters turned round, where they differ: the name's last three characters turned
    # round (the test's first typo) were the name itself when they read the same both ways
    # ("...beb"), one run in 16, and the test failed for want of a warning.
    typo = topic.replace("present", "presnet", 1)
    with caplog.at_level("WARNING"):
        stats = mirror(source_cluster.client_config(), target_cluster.client_config(),
                       [topic, typo], topic_mapper=prefix_mapper("w"), until_caught_up=True,
                       timeout_s=60, **{**FAST, "group.id": group()})
    assert stats.ended_by == "caught_up" and stats.records == 100
    assert (f"topic {typo} is not on cluster source (it is mirrored once it is created); did "
            f"you mean '{topic}'?") in caplog.text, caplog.text[-2000:]
