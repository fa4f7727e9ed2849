"""What an engine's offset map should hold, given the batches it forwarded (for the tests).

``OffsetMap`` keeps one row per run of batches that follow each other on both sides
(``tests/unit/engine/test_offsets.py`` checks that rule on its own); the tests that mirror real
batches state the batches, and these helpers check the map against them.
"""

from __future__ import annotations

from collections.abc import Iterable

from shallowmirror.engine.offsets import OffsetMap

Row = tuple[int, int, "int | None"]


def runs(batches: Iterable[Row]) -> list[Row]:
    """The rows a map keeps for these per-batch ``(source_base, count, target_base)`` rows."""
    omap = OffsetMap()
    for source_base, count, target_base in batches:
        omap.add_row(source_base, count, target_base)
    return [tuple(row) for row in omap.rows()]


def assert_map_holds(omap: OffsetMap, batches: Iterable[Row]) -> None:
    """``omap`` has the rows of ``batches`` and translates the first and last offset of each."""
    batches = list(batches)
    assert [tuple(row) for row in omap.rows()] == runs(batches)
    for source_base, count, target_base in batches:
        last = source_base + count - 1
        expected = (None, None) if target_base is None else (target_base,
                                                             target_base + count - 1)
        assert (omap.translate(source_base), omap.translate(last)) == expected, source_base
