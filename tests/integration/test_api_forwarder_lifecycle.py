"""The forwarders (``BatchForwarder``, ``SyncBatchForwarder``) against real brokers, at the edges
of their life: a start cancelled or interrupted stops everything it started; ``close()`` from
another thread ends a ``start()`` waiting for a cluster; a cancelled wait for a batch leaves no
task behind and loses no batch; and forwarding misuse (a batch decided twice, a partition given
as a str, no topic) raises at the call while the engine goes on."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from engine_support import create_target, group, load_topic

from shallowmirror.engine import BatchForwarder, FetchedBatch, SyncBatchForwarder
from shallowmirror.testing.embedded import free_port
from shallowmirror.testing.topics import assert_same_records, read_topic

pytestmark = pytest.mark.integration

FAST = {"partition.assignment": "all", "fetch.max.wait.ms": 100}
#: Far less than what start-up waits for an unreachable cluster (reconnect.deadline.ms, 120 s).
PROMPT_S = 10.0


def _nowhere() -> dict[str, str]:
    return {"bootstrap.servers": f"127.0.0.1:{free_port()}"}


def _other_tasks() -> list[str]:
    return sorted(t.get_coro().__qualname__ for t in asyncio.all_tasks()
                  if t is not asyncio.current_task() and not t.done())


def _loaded(source_cluster, target_cluster, topic: str, records: int) -> tuple[str, dict, int]:
    """``topic`` loaded in small batches on one partition, its empty copy made on the target:
    (the copy's name, the source's records, the offset after the last)."""
    copy = f"{topic}-copy"
    load_topic(source_cluster, topic, records, partitions=1, batch_bytes=4_000, linger_ms=5)
    create_target(target_cluster, copy, 1)
    source = read_topic(source_cluster.client_config(), topic)
    return copy, source, source[0][-1].offset + 1


def test_cancelled_async_start_stops_everything_it_started(target_cluster):
    async def scenario() -> list[str]:
        fwd = BatchForwarder(_nowhere(), target_cluster.client_config(), topics=["orders"],
                             settings={**FAST, "group.id": group()})
        starting = asyncio.create_task(fwd.start())
        await asyncio.sleep(1.0)             # start-up is retrying the source by now
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        await asyncio.sleep(0.2)             # what was cancelled last has run its last step
        return _other_tasks()

    assert asyncio.run(scenario()) == []


def test_cancelled_wait_for_a_batch_leaves_no_getter_and_loses_no_batch(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("getter")
    create_target(source_cluster, topic, 1)             # empty: the wait below waits

    async def scenario() -> tuple[list[str], FetchedBatch | None]:
        async with BatchForwarder(source_cluster.client_config(),
                                  target_cluster.client_config(), topics=[topic],
                                  settings={**FAST, "group.id": group()}) as fwd:
            waiting = asyncio.create_task(anext(aiter(fwd)))
            await asyncio.sleep(0.5)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await asyncio.sleep(0)
            getters = [name for name in _other_tasks() if name == "Queue.get"]
            await asyncio.to_thread(load_topic, source_cluster, topic, 200, partitions=1,
                                    create_topic=False)
            batch = await fwd.next_batch(timeout_s=30)
            if batch is not None:
                fwd.drop(batch)
        return getters, batch

    getters, batch = asyncio.run(scenario())
    assert getters == []
    assert batch is not None and batch.source_base == 0     # the first batch, not the second


def test_close_from_another_thread_ends_a_start_waiting_for_a_cluster(target_cluster):
    fwd = SyncBatchForwarder(_nowhere(), target_cluster.client_config(), topics=["orders"],
                             settings={**FAST, "group.id": group()})
    outcome: list[object] = []

    def start() -> None:
        try:
            outcome.append(fwd.start())
        except BaseException as err:  # noqa: BLE001 - what the test looks at
            outcome.append(err)

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    time.sleep(1.0)                           # start() is retrying the source by now
    closed_at = time.monotonic()
    fwd.close()
    starter.join(PROMPT_S)
    assert not starter.is_alive(), "start() did not end once the forwarder was closed"
    assert time.monotonic() - closed_at < PROMPT_S
    assert outcome == [fwd]                   # a stop during start-up: nothing raised
    assert not fwd._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        fwd.next_batch(timeout_s=0.1)
    fwd.close()


def test_interrupted_sync_start_leaves_no_thread_running(target_cluster):
    """Ctrl-C (SIGINT) while ``with SyncBatchForwarder(...)`` waits for an unreachable source:
    the KeyboardInterrupt reaches the program, and the forwarder's thread is gone with it."""
    script = textwrap.dedent("""
        import os, signal, sys, threading, time
        from shallowmirror.engine import SyncBatchForwarder
        # Python's own handler even if this test runs as a background job (SIGINT ignored).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            with SyncBatchForwarder({"bootstrap.servers": sys.argv[1]},
                                    {"bootstrap.servers": sys.argv[2]}, topics=["orders"],
                                    settings={"partition.assignment": "all"}):
                print("started", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        time.sleep(0.2)
        print("threads:", sorted(t.name for t in threading.enumerate()), flush=True)
    """)
    result = subprocess.run(
        [sys.executable, "-c", script, _nowhere()["bootstrap.servers"], target_cluster.bootstrap],
        capture_output=True, text=True, timeout=60)
    assert "interrupted" in result.stdout, result.stdout + result.stderr[-2000:]
    assert "threads: ['MainThread']" in result.stdout, result.stdout


def test_forwarding_misuse_raises_at_the_call_and_the_engine_goes_on(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("misuse")
    copy, source, end = _loaded(source_cluster, target_cluster, topic, 600)
    futures: list[concurrent.futures.Future] = []
    dropped: list[tuple[int, int]] = []

    with SyncBatchForwarder(source_cluster.client_config(), target_cluster.client_config(),
                            topics=[topic], settings={**FAST, "group.id": group()}) as fwd:
        first = fwd.next_batch(timeout_s=30)
        assert first is not None
        futures.append(fwd.forward(first, copy, 0))
        with pytest.raises(ValueError, match="already forwarded"):
            fwd.forward(first, copy, 0)           # before the first forward reached the engine
        with pytest.raises(ValueError, match="already forwarded"):
            fwd.drop(first)
        futures[0].result(timeout=30)
        with pytest.raises(ValueError, match="already forwarded"):
            fwd.forward(first, copy, 0)           # and once acknowledged

        second = fwd.next_batch(timeout_s=30)
        assert second is not None
        fwd.drop(second)
        dropped.append((second.source_base, second.next_offset))
        with pytest.raises(ValueError, match="already dropped"):
            fwd.forward(second, copy, 0)
        with pytest.raises(ValueError, match="already dropped"):
            fwd.drop(second)

        third = fwd.next_batch(timeout_s=30)
        assert third is not None
        for bad, kind, says in [((third, copy, "0"), TypeError, "partition must be an int"),
                                ((third, None, 0), TypeError, "topic must be a str"),
                                ((third, "no such/topic", 0), ValueError, "not a legal"),
                                ((third, copy, -1), ValueError, "must be >= 0"),
                                (("hello", copy, 0), TypeError, "expected a FetchedBatch")]:
            with pytest.raises(kind, match=says):
                fwd.forward(*bad)
        futures.append(fwd.forward(third, copy, 0))   # still undecided: forwarded now
        position = third.next_offset
        while position < end:
            batch = fwd.next_batch(timeout_s=30)
            assert batch is not None, f"no batch for 30 s at {position}"
            futures.append(fwd.forward(batch, copy, 0))
            position = batch.next_offset
        for future in futures:
            future.result(timeout=30)
        assert fwd.wait_caught_up(30)
    # close() raised nothing: the engine stayed healthy; the target holds what was forwarded.
    expected = {0: [r for r in source[0] if not dropped[0][0] <= r.offset < dropped[0][1]]}
    assert_same_records(expected, read_topic(target_cluster.client_config(), copy), topic=copy)


def test_async_forwarding_misuse_raises_at_the_call(source_cluster, target_cluster,
                                                    unique_topic):
    topic = unique_topic("amisuse")
    copy = f"{topic}-copy"
    load_topic(source_cluster, topic, 400, partitions=1, batch_bytes=4_000, linger_ms=5)
    create_target(target_cluster, copy, 1)

    async def scenario() -> None:
        async with BatchForwarder(source_cluster.client_config(),
                                  target_cluster.client_config(), topics=[topic],
                                  settings={**FAST, "group.id": group()}) as fwd:
            first = await fwd.next_batch(timeout_s=30)
            assert first is not None
            acked = fwd.forward(first, copy, 0)
            with pytest.raises(ValueError, match="already forwarded"):
                fwd.forward(first, copy, 0)
            second = await fwd.next_batch(timeout_s=30)
            assert second is not None
            fwd.drop(second)
            with pytest.raises(ValueError, match="already dropped"):
                fwd.forward(second, copy, 0)
            with pytest.raises(TypeError, match="partition must be an int"):
                fwd.forward(await fwd.next_batch(timeout_s=30), copy, "0")
            assert await asyncio.wait_for(acked, 30) == 0

    asyncio.run(scenario())           # stop() at the end raised nothing



def test_a_batch_of_another_forwarder_is_refused_at_the_call(source_cluster, target_cluster,
                                                            unique_topic):
    """Two forwarders of one source topic (two groups): the batch one handed out, forwarded or
    dropped through the other, was taken; its acknowledgement reached the other's offsets (an
    engine failure there) or none (the first one's commits stopped at it for good). Refused
    at the call now, async and sync alike; each forwarder still forwards its own."""
    topic = unique_topic("foreign")
    copy = f"{topic}-copy"
    load_topic(source_cluster, topic, 400, partitions=1, batch_bytes=4_000, linger_ms=5)
    create_target(target_cluster, copy, 1)
    target = target_cluster.client_config()

    async def scenario() -> None:
        async with BatchForwarder(source_cluster.client_config(), target, topics=[topic],
                                  settings={**FAST, "group.id": group()}) as one, \
                BatchForwarder(source_cluster.client_config(), target, topics=[topic],
                               settings={**FAST, "group.id": group()}) as other:
            mine, theirs = await one.next_batch(30), await other.next_batch(30)
            assert mine is not None and theirs is not None
            with pytest.raises(ValueError, match="not handed out by this forwarder"):
                one.forward(theirs, copy, 0)
            with pytest.raises(ValueError, match="not handed out by this forwarder"):
                one.drop(theirs)
            assert await asyncio.wait_for(one.forward(mine, copy, 0), 30) == 0
            other.drop(theirs)

    asyncio.run(scenario())
    with SyncBatchForwarder(source_cluster.client_config(), target, topics=[topic],
                            settings={**FAST, "group.id": group()}) as one, \
            SyncBatchForwarder(source_cluster.client_config(), target, topics=[topic],
                               settings={**FAST, "group.id": group()}) as other:
        mine, theirs = one.next_batch(timeout_s=30), other.next_batch(timeout_s=30)
        assert mine is not None and theirs is not None
        with pytest.raises(ValueError, match="not handed out by this forwarder"):
            one.forward(theirs, copy, 0)
        with pytest.raises(ValueError, match="not handed out by this forwarder"):
            one.drop(theirs)
        one.drop(mine)
        other.forward(theirs, copy, 0).result(timeout=30)

def test_a_callback_that_raises_is_logged_and_the_async_forwarder_goes_on(
        source_cluster, target_cluster, unique_topic, caplog):
    """A program's ``forward(..., callback=)`` raising used to stop the engine's produce loop
    (the error then named a produce request); it is logged, as ``on_ack`` of the sync
    forwarder is, and every batch is still acknowledged and copied."""
    topic = unique_topic("cbraise")
    copy, source, end = _loaded(source_cluster, target_cluster, topic, 400)
    called: list[int] = []

    def bad(batch: FetchedBatch, target_base: int | None, error: BaseException | None) -> None:
        called.append(batch.source_base)
        raise ZeroDivisionError("boom in callback")

    async def scenario() -> None:
        async with BatchForwarder(source_cluster.client_config(),
                                  target_cluster.client_config(), topics=[topic],
                                  settings={**FAST, "group.id": group()}) as fwd:
            acks, position = [], 0
            while position < end:
                batch = await fwd.next_batch(timeout_s=30)
                assert batch is not None, f"no batch for 30 s at {position}"
                acks.append(fwd.forward(batch, copy, 0, callback=bad))
                position = batch.next_offset
            await asyncio.wait_for(asyncio.gather(*acks), 30)
            assert await fwd.wait_caught_up(30)

    asyncio.run(scenario())           # stop() at the end raised nothing
    assert len(called) > 1
    assert "callback failed for FetchedBatch" in caplog.text and "boom in callback" in caplog.text
    assert_same_records(source, read_topic(target_cluster.client_config(), copy), topic=copy)


def test_forwarding_to_a_missing_target_topic_says_so_within_seconds(
        source_cluster, target_cluster, unique_topic, caplog):
    """The lookups for a target topic never forwarded to go on for about a minute before its
    batches fail; the first second of them used to pass, and the rest too, without a word."""
    topic = unique_topic("nowhere")
    load_topic(source_cluster, topic, 50, partitions=1)
    missing = f"{topic}-no-such-copy"
    with SyncBatchForwarder(source_cluster.client_config(), target_cluster.client_config(),
                            topics=[topic], settings={**FAST, "group.id": group()}) as fwd:
        batch = fwd.next_batch(timeout_s=30)
        assert batch is not None
        began = time.monotonic()
        acked = fwd.forward(batch, missing, 0)
        while time.monotonic() - began < PROMPT_S and f"has no topic {missing}" not in caplog.text:
            time.sleep(0.1)
        assert not acked.done()
    assert f"target target has no topic {missing}" in caplog.text, caplog.text[-2000:]
    assert f"for source {topic}-0 offset 0" in caplog.text


def test_a_missing_target_topic_is_told_once_for_all_its_partitions(
        source_cluster, target_cluster, unique_topic, caplog):
    """Every partition waiting for the same missing topic used to give its own warning: a mirror
    of a topic of 8 partitions printed the same 5-line text 8 times."""
    topic = unique_topic("nowhere3")
    load_topic(source_cluster, topic, 60, partitions=3)
    missing = f"{topic}-no-such-copy"
    with SyncBatchForwarder(source_cluster.client_config(), target_cluster.client_config(),
                            topics=[topic], settings={**FAST, "group.id": group()}) as fwd:
        seen: set[int] = set()
        began = time.monotonic()
        while len(seen) < 3 and time.monotonic() - began < 30:
            batch = fwd.next_batch(timeout_s=5)
            if batch is not None and batch.partition not in seen:
                seen.add(batch.partition)
                fwd.forward(batch, missing, batch.partition)
        assert len(seen) == 3
        while time.monotonic() - began < PROMPT_S + 5 and f"has no topic {missing}" not in caplog.text:
            time.sleep(0.1)
        time.sleep(2)          # the other partitions' lookups reach the same count meanwhile
    assert caplog.text.count(f"has no topic {missing}") == 1, caplog.text[-3000:]
    assert "more partition" in caplog.text


def test_a_stopped_forwarder_refuses_what_it_can_no_longer_do(source_cluster, target_cluster,
                                                               unique_topic):
    """After ``stop()``, ``forward`` returned a future that never resolved (and logged "cluster
    is closed"), and ``start()`` again returned normally with nothing running; the sync
    forwarder's ``stats()`` after ``close()`` raised "the forwarder is closed"."""
    topic = unique_topic("stopped")
    load_topic(source_cluster, topic, 50, partitions=1)

    async def scenario() -> None:
        fwd = BatchForwarder(source_cluster.client_config(), target_cluster.client_config(),
                             topics=[topic], settings={**FAST, "group.id": group()})
        await fwd.start()
        batch = await fwd.next_batch(30)
        assert batch is not None
        await fwd.stop()
        with pytest.raises(RuntimeError, match="the forwarder is stopped: cannot forward a "
                                               "batch after stop()"):
            fwd.forward(batch, f"{topic}-copy", 0)
        with pytest.raises(RuntimeError, match="cannot drop a batch after stop()"):
            fwd.drop(batch)
        with pytest.raises(RuntimeError, match="a stopped BatchForwarder does not start again"):
            await fwd.start()
        assert fwd.stats().partitions           # still readable

    asyncio.run(scenario())
    with SyncBatchForwarder(source_cluster.client_config(), target_cluster.client_config(),
                            topics=[topic], settings={**FAST, "group.id": group()}) as sync:
        assert sync.next_batch(timeout_s=30) is not None
    assert (topic, 0) in sync.stats().partitions
