"""A revocation whose replaced-topic lookup overlaps the restart of a re-created topic.

``EngineCore._on_revoked`` asks the source cluster whether each revoked partition's topic was
replaced, and awaits the answer. The restart of a topic found deleted and created again
(``Sources._restart_at_new_start``) may run during that await: it moves the partition to the
new topic's start and id. A position read before the lookup (the old topic's) then passed the
check against the new id and was committed into the new topic, whose records below it the next
owner skipped (seen once on Kafka 3.7: the new topic's first 100 of 300 records missing). No
broker orders those two steps on demand, so the lookup is scripted here: it lets the restart
happen while it is awaited, exactly where the broker's answer would be awaited."""

from __future__ import annotations

import asyncio

import pytest

from shallowmirror.engine import MirrorEngine, core
from shallowmirror.engine.batch import SourcePartition

TP = ("orders", 0)


def _engine_owning_old_topic_at(position: int) -> tuple[MirrorEngine, SourcePartition]:
    engine = MirrorEngine({"bootstrap.servers": "127.0.0.1:9"},
                          {"bootstrap.servers": "127.0.0.1:9"}, topics=[TP[0]],
                          settings={"group.id": "g"})
    engine.source = object()        # not None: the lookup itself is scripted below
    sp = SourcePartition(TP[0], TP[1], position, engine.offset_map(*TP))
    sp.topic_id = "old-topic-id"
    engine.partitions[TP] = sp
    return engine, sp


@pytest.mark.parametrize("caller", ["_on_revoked", "_positions_to_commit"])
def test_the_position_committed_is_read_after_the_replaced_topic_lookup(monkeypatch, caller):
    """``_positions_to_commit`` is what revocation and shutdown commit; ``_on_revoked`` is the
    path of the failure seen."""
    engine, sp = _engine_owning_old_topic_at(100)
    lookups = []

    async def lookup_while_the_topic_restarts(cluster, owned, *, timeout_s):
        lookups.append([p.tp for p in owned])
        await asyncio.sleep(0)
        sp.offsets.restart(0)           # what _restart_at_new_start does, meanwhile
        sp.topic_id = "new-topic-id"
        return set()                    # asked now: the partition's id is the topic's id

    monkeypatch.setattr(core, "replaced_partitions", lookup_while_the_topic_restarts)

    async def commit_of_one_partition():
        if caller == "_on_revoked":
            return await engine._on_revoked([TP], commit=True)
        return await engine._positions_to_commit([sp], check_replaced=True, timeout_s=1.0)

    positions = asyncio.run(commit_of_one_partition())
    assert lookups == [[TP]]
    assert dict(positions) == {TP: 0}, "the old topic's position went into the new topic"


def test_a_partition_whose_topic_was_replaced_is_not_committed(monkeypatch):
    engine, sp = _engine_owning_old_topic_at(100)

    async def replaced(cluster, owned, *, timeout_s):
        return {p.tp for p in owned}

    monkeypatch.setattr(core, "replaced_partitions", replaced)
    positions = asyncio.run(engine._on_revoked([TP], commit=True))
    assert dict(positions) == {}
    assert TP not in engine.partitions
