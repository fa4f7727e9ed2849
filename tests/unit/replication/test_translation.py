"""Exact translation rules (module drawing of replication/translation.py), checked against a
brute-force model: for every source position, the target offset of the next mirrored record."""

from __future__ import annotations

import random

import pytest

from shallowmirror.replication.translation import PartitionSyncs, Sync, SyncTable


def drawing() -> PartitionSyncs:
    syncs = PartitionSyncs()
    assert syncs.add_batch(100, 130, 1000) == [Sync(100, 1000)]
    assert syncs.add_batch(130, 150, 1030) == []          # contiguous: no new anchor
    assert syncs.add_batch(152, 180, 1050) == [Sync(152, 1050)]
    return syncs


def test_the_drawing() -> None:
    syncs = drawing()
    assert syncs.anchors == [Sync(100, 1000), Sync(152, 1050)]
    assert syncs.end == Sync(180, 1078)
    assert [syncs.translate(p) for p in (0, 100, 120, 149, 150, 151, 152, 179, 180, 185)] == [
        1000, 1000, 1020, 1049, 1050, 1050, 1050, 1077, 1078, 1078]


def test_nothing_known_translates_to_none() -> None:
    assert PartitionSyncs().translate(5) is None
    assert SyncTable().translate("t", 0, 5) is None


def test_repacked_batch_translates_per_record() -> None:
    syncs = PartitionSyncs()
    syncs.add_batch(0, 10, 500)
    # records at 10, 13, 14, 19 survive compaction in a batch spanning 10..20
    added = syncs.add_batch(10, 21, 510, record_offsets=[10, 13, 14, 19])
    assert added == [Sync(13, 511), Sync(19, 513)]
    expected = {10: 510, 11: 511, 12: 511, 13: 511, 14: 512, 15: 513, 18: 513, 19: 513,
                20: 514, 21: 514}
    assert {p: syncs.translate(p) for p in expected} == expected


def test_a_second_copy_wins() -> None:
    syncs = drawing()
    # a crash after the target stored 152..179 but before the source commit: mirrored again
    assert syncs.add_batch(152, 180, 1078) == [Sync(152, 1078)]
    assert syncs.translate(160) == 1086
    assert syncs.translate(120) == 1020


def test_target_jumps_are_anchors_too() -> None:
    syncs = PartitionSyncs()
    syncs.add_batch(0, 10, 0)
    syncs.add_batch(10, 20, 11)        # a transaction marker of the mirror at target 10
    assert syncs.anchors == [Sync(0, 0), Sync(10, 11)]
    assert syncs.translate(10) == 11


def test_replayed_syncs_rebuild_the_same_map() -> None:
    live = drawing()
    replayed = PartitionSyncs()
    for anchor in live.anchors:
        replayed.add_anchor(anchor)
    assert replayed.translate(185) == 1083           # no end: an open run
    assert replayed.translate(185, target_end=1078) == 1078
    replayed.set_end(live.end)
    assert [replayed.translate(p) for p in range(90, 200)] == \
        [live.translate(p) for p in range(90, 200)]


def test_stale_end_is_ignored() -> None:
    syncs = drawing()
    syncs.set_end(Sync(120, 1020))
    assert syncs.end == Sync(180, 1078)


def brute_force(mirrored: dict[int, int], position: int, end: int) -> int:
    later = [mirrored[s] for s in mirrored if s >= position]
    return min(later) if later else end


@pytest.mark.parametrize("seed", range(100))
def test_random_partitions_match_the_brute_force_model(seed: int) -> None:
    rng = random.Random(seed)
    syncs = PartitionSyncs()
    mirrored: dict[int, int] = {}
    source, target = rng.randrange(0, 50), rng.randrange(0, 1000)
    for _ in range(rng.randrange(1, 40)):
        source += rng.choice([0, 0, 0, 1, 2, 7])            # gaps on the source
        target += rng.choice([0, 0, 0, 0, 1])               # markers on the target
        size = rng.randrange(1, 12)
        if rng.random() < 0.3 and size > 1:                 # compacted, re-packed
            offsets = sorted(rng.sample(range(source, source + size), rng.randrange(1, size)))
            syncs.add_batch(source, source + size, target, record_offsets=offsets)
            for index, offset in enumerate(offsets):
                mirrored[offset] = target + index
            target += len(offsets)
        else:
            syncs.add_batch(source, source + size, target)
            for index in range(size):
                mirrored[source + index] = target + index
            target += size
        source += size
    end = syncs.end.downstream
    for position in range(0, source + 5):
        assert syncs.translate(position) == brute_force(mirrored, position, end), position


def brute_force_back(mirrored: dict[int, int], position: int, end_upstream: int) -> int:
    later = [s for s, t in mirrored.items() if t >= position]
    return min(later) if later else end_upstream


@pytest.mark.parametrize("seed", range(100))
def test_translating_back_matches_the_brute_force_model(seed: int) -> None:
    """Failback: a target position goes back to the source offset of the first mirrored record
    at or after it; and a round trip from any source position to the target and back lands on
    a position that reads the same records next."""
    rng = random.Random(seed)
    syncs = PartitionSyncs()
    mirrored: dict[int, int] = {}
    source, target = rng.randrange(0, 50), rng.randrange(0, 1000)
    for _ in range(rng.randrange(1, 30)):
        source += rng.choice([0, 0, 1, 3])
        target += rng.choice([0, 0, 0, 1])
        size = rng.randrange(1, 9)
        if rng.random() < 0.3 and size > 1:
            offsets = sorted(rng.sample(range(source, source + size), rng.randrange(1, size)))
            syncs.add_batch(source, source + size, target, record_offsets=offsets)
            mirrored.update({o: target + i for i, o in enumerate(offsets)})
            target += len(offsets)
        else:
            syncs.add_batch(source, source + size, target)
            mirrored.update({source + i: target + i for i in range(size)})
            target += size
        source += size
    end = syncs.end

    def next_record(source_position: int) -> int | None:
        later = [s for s in mirrored if s >= source_position]
        return min(later) if later else None

    for position in range(0, target + 5):
        # The same record is read next (a source gap before it may be included or not).
        back = syncs.translate_back(position)
        assert next_record(back) == next_record(
            brute_force_back(mirrored, position, end.upstream)), position
        assert back <= brute_force_back(mirrored, position, end.upstream)
    for position in range(0, source + 3):
        back = syncs.translate_back(syncs.translate(position))
        assert brute_force(mirrored, back, end.downstream) == \
            brute_force(mirrored, position, end.downstream)
