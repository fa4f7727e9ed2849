"""The native stamp's CRC update (``_crecords.updated_crc``: from the header's change alone)
against a full CRC-32C of the changed message. The twin computes the same number with two
passes of the crc32c package; ``test_records`` holds the two rewrites to the same bytes."""

from __future__ import annotations

import random

import pytest
from crc32c import crc32c

from tests.unit.codec.batches import NATIVE

pytestmark = pytest.mark.skipif(NATIVE is None, reason="native codec not built")


@pytest.fixture(autouse=True, params=["cpu instructions", "portable"])
def crc_path(request):
    """Every test on both paths: the CPU's crc32/PCLMUL instructions where it has them, and the
    crc32c package with the table code (what a CPU without them runs)."""
    previous = NATIVE.use_crc_instructions(request.param == "cpu instructions")
    yield request.param
    NATIVE.use_crc_instructions(previous)


@pytest.mark.parametrize("seed", range(20))
def test_equals_the_crc_of_the_whole_changed_message(seed):
    rng = random.Random(seed)
    for tail_size in (0, 1, 7, 61, 4096, rng.randrange(1, 300_000)):
        head = rng.randbytes(40)
        tail = rng.randbytes(tail_size)
        new = bytearray(head)
        for _ in range(rng.randrange(0, 8)):
            new[rng.randrange(40)] = rng.randrange(256)
        assert NATIVE.updated_crc(crc32c(head + tail), head, bytes(new), tail_size) == crc32c(
            bytes(new) + tail), (seed, tail_size)


@pytest.mark.parametrize("tail_size", [255, 256, 257, 65_535, 65_536, 65_793, 16_777_216,
                                       16_777_216 + 65_536 + 256 + 1, 2 * 16_777_216 + 3])
def test_every_byte_of_the_tail_length_counts(tail_size):
    """The shift is one table entry per non-zero byte of the tail length: lengths with each of
    the four bytes set (up to 32 MiB), at and around the byte boundaries."""
    rng = random.Random(tail_size)
    head, new = rng.randbytes(40), rng.randbytes(40)
    tail = bytes(rng.randrange(256) for _ in range(64)) * (tail_size // 64) + bytes(tail_size % 64)
    assert NATIVE.updated_crc(crc32c(head + tail), head, new, tail_size) == crc32c(new + tail)


def test_unchanged_head_keeps_the_crc():
    assert NATIVE.updated_crc(0xDEADBEEF, b"x" * 40, b"x" * 40, 123_456) == 0xDEADBEEF


def test_refuses_heads_of_different_length_and_negative_tails():
    with pytest.raises(ValueError, match="same length"):
        NATIVE.updated_crc(0, b"ab", b"a", 0)
    with pytest.raises(ValueError, match="tail_bytes"):
        NATIVE.updated_crc(0, b"ab", b"ab", -1)


# ---- the CRC check's own CRC-32C (native/crc32c_hw.h) against the crc32c package ----

CHECK_SIZES = [0, 1, 7, 8, 9, 255, 256, 767, 768, 769, 2303, 2304, 5800, 24_575, 24_576, 24_577,
               3 * 24_576 + 3 * 768 + 13, 1 << 20]


def test_the_instructions_are_used_where_the_cpu_has_them(crc_path):
    """The CRC check uses SSE4.2's crc32, the stamp's update also PCLMUL, where the CPU has
    them (the "portable" run switches them off, as a CPU without them would)."""
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    sse42 = " sse4_2" in flags and crc_path == "cpu instructions"
    assert NATIVE.crc32c_implementation() == (
        "sse4.2" if sse42 else "crc32c package",
        "pclmul" if sse42 and " pclmulqdq" in flags else "tables")


@pytest.mark.parametrize("size", CHECK_SIZES)
def test_the_check_crc_equals_the_packages_at_every_alignment_and_seed(size):
    """Each stream length (3 x 8 KiB rounds, 3 x 256 B rounds, 8-byte words, single bytes) and
    every start alignment (a batch starts anywhere in a fetched frame)."""
    rng = random.Random(size)
    data = memoryview(rng.randbytes(size + 8))
    for offset in range(8):
        piece = data[offset:offset + size]
        for seed in (0, 0xFFFFFFFF, rng.getrandbits(32)):
            assert NATIVE.crc32c(piece, seed) == crc32c(piece, seed), (size, offset, seed)


@pytest.mark.parametrize("seed", range(30))
def test_the_check_crc_equals_the_packages_on_random_buffers(seed):
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(0, 200_000))
    assert NATIVE.crc32c(data) == crc32c(data)
