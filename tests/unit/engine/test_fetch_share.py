"""How a Fetch request divides its bytes between partitions."""

from shallowmirror.engine.fetch_share import (
    ACTIVE_WINDOW_S,
    MIN_FAIR_PARTITION_BYTES,
    PRUNE_EVERY_S,
    Sharers,
    fair_partition_bytes,
)

MIB = 1 << 20


def test_each_partition_asks_an_equal_share_of_the_request():
    # Kafka fills a response in request order: 16 MiB at 4 MiB per partition fed only 4 of 8.
    assert fair_partition_bytes(16 * MIB, 8, 4 * MIB) == 2 * MIB
    assert fair_partition_bytes(16 * MIB, 2, 4 * MIB) == 4 * MIB      # capped by the setting


def test_share_never_below_one_mebibyte_nor_above_the_request():
    assert fair_partition_bytes(16 * MIB, 10_000, 4 * MIB) == MIN_FAIR_PARTITION_BYTES
    assert fair_partition_bytes(256 * 1024, 8, 4 * MIB) == 256 * 1024  # a small budget's ask
    assert fair_partition_bytes(16 * MIB, 0, 4 * MIB) == 4 * MIB


def test_bytes_are_shared_between_the_partitions_that_returned_records_lately():
    """Beside 10,000 idle partitions the 8 busy ones get what they get alone (2 MiB each of
    16 MiB), once the idle ones' first records are older than the window."""
    sharers = Sharers()
    assert sharers.of(10_008, now=100.0) == 16_384          # nothing seen yet: all share
    for p in range(10_008):                                 # the first catch-up
        sharers.returned_records(("idle", p), 100.0)
    assert sharers.of(10_008, now=101.0) == 16_384
    for t in (102.0, 104.0, 106.0, 108.0):
        for p in range(8):
            sharers.returned_records(("busy", p), t)
        count = sharers.of(10_008, now=t + 0.1)
    assert count == 8
    assert fair_partition_bytes(16 * MIB, count, 4 * MIB) == 2 * MIB


def test_the_count_changes_seldom_as_traffic_comes_and_goes():
    """Growing: followed at once; shrinking: only at a quarter; nothing returning records (an
    idle spell): unchanged. Each change would make a fetch session resend every partition."""
    sharers = Sharers()
    now = 0.0
    counts = []
    for active in (8, 3, 8, 2, 0, 0, 5, 9, 3, 2):
        now += ACTIVE_WINDOW_S + PRUNE_EVERY_S               # the last round's have aged out
        for p in range(active):
            sharers.returned_records(p, now)
        counts.append(sharers.of(100, now))
    assert counts == [8, 8, 8, 2, 2, 2, 8, 16, 4, 4]


def test_a_revoked_partition_stops_sharing():
    sharers = Sharers()
    for p in range(4):
        sharers.returned_records(p, 0.0)
    sharers.forget(3)
    sharers.forget(99)                                       # never seen: nothing to do
    assert sharers.of(4, now=0.5) == 4
    assert sorted(sharers.seen) == [0, 1, 2]
