"""How a Fetch request divides its bytes between partitions."""

from shallowmirror.engine.source import MIN_FAIR_PARTITION_BYTES, fair_partition_bytes

MIB = 1 << 20


def test_each_partition_asks_an_equal_share_of_the_request():
    # Kafka fills a response in request order: 16 MiB at 4 MiB per partition fed only 4 of 8.
    assert fair_partition_bytes(16 * MIB, 8, 4 * MIB) == 2 * MIB
    assert fair_partition_bytes(16 * MIB, 2, 4 * MIB) == 4 * MIB      # capped by the setting


def test_share_never_below_one_mebibyte_nor_above_the_request():
    assert fair_partition_bytes(16 * MIB, 10_000, 4 * MIB) == MIN_FAIR_PARTITION_BYTES
    assert fair_partition_bytes(256 * 1024, 8, 4 * MIB) == 256 * 1024  # a small budget's ask
    assert fair_partition_bytes(16 * MIB, 0, 4 * MIB) == 4 * MIB
