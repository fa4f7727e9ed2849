"""A v2 batch's new CRC-32C after its header changed, without reading its records (pure Python).

Stamping a batch for the target (producer id, epoch, sequence, attributes) changes only bytes
21..61 of the range the CRC covers. CRC-32C is linear over GF(2), so for two messages of the
same length that differ by ``delta`` (zero outside the header)::

    crc(new) = crc(old) ^ L(delta[21:61] followed by n zero bytes)

where ``L`` is the CRC's linear part (no initial or final inversion) and ``n`` the bytes after
the header. ``L(d + zeros(n))`` is ``L(d)`` multiplied by ``x**(8n)`` modulo the polynomial
(zlib's ``crc32_combine`` method, here for Castagnoli). The records are never read again: a
stamp costs the same for a 1 KB and a 1 MB batch, and a source batch whose CRC was already
wrong stays wrong (the target refuses it as corrupt) instead of being given a fresh, valid CRC
over damaged bytes.

``native/_crecords.pyx`` has the same algorithm in C; this is its twin and its reference.
"""

from __future__ import annotations

#: CRC-32C (Castagnoli) polynomial, bit-reflected.
POLY = 0x82F63B78


def _table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ POLY if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_TABLE = _table()


def linear_crc(data: bytes | bytearray | memoryview) -> int:
    """The CRC-32C's linear part of ``data``: register starting at 0, no final inversion."""
    crc = 0
    for byte in bytes(data):
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc


def _multiply(a: int, b: int) -> int:
    """a * b modulo the polynomial (bit-reflected; ``a`` must not be 0)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1


def _powers() -> tuple[int, ...]:
    """x**(2**k) modulo the polynomial, k = 0..31."""
    p, powers = 1 << 30, []            # x**1
    for _ in range(32):
        powers.append(p)
        p = _multiply(p, p)
    return tuple(powers)


_X2N = _powers()


def shift_zeros(crc: int, n: int) -> int:
    """``L(d + zeros(n))`` given ``crc == L(d)``: appending n zero bytes, in O(log n)."""
    if n <= 0 or crc == 0:
        return crc
    power, k = 1 << 31, 3              # x**0; n bytes are 8n bits: start at x**(2**3)
    while n:
        if n & 1:
            power = _multiply(_X2N[k & 31], power)
        n >>= 1
        k += 1
    return _multiply(power, crc)


def updated_crc(old_crc: int, old_covered_head: bytes, new_covered_head: bytes,
                tail_bytes: int) -> int:
    """The CRC-32C of a message whose first covered bytes changed from ``old_covered_head`` to
    ``new_covered_head`` (same length), followed by ``tail_bytes`` unchanged bytes."""
    assert len(old_covered_head) == len(new_covered_head)
    delta = bytes(a ^ b for a, b in zip(old_covered_head, new_covered_head, strict=True))
    return old_crc ^ shift_zeros(linear_crc(delta), tail_bytes)
