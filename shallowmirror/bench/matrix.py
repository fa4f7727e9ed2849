"""Workloads and the workload matrix.

A workload is what is loaded into the source topic: ``records`` records of about ``value_bytes``
JSON-like bytes each, produced with ``codec`` and ``batch_bytes`` producer batches into
``partitions`` partitions. The matrix is the cartesian product of lists of each dimension.
The default workload is the one the project's goals are stated on (issue 6).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from shallowmirror.metrics_schema import CODECS


@dataclass(frozen=True)
class Workload:
    codec: str
    value_bytes: int
    batch_bytes: int
    partitions: int
    records: int

    def __post_init__(self) -> None:
        problems = []
        if self.codec not in CODECS:
            problems.append(f"codec {self.codec!r} is not one of {', '.join(CODECS)}")
        for name in ("value_bytes", "batch_bytes", "partitions", "records"):
            if getattr(self, name) <= 0:
                problems.append(f"--{name.replace('_', '-')} must be > 0 (got "
                                f"{getattr(self, name)})")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def workload_id(self) -> str:
        """Stable, human-readable id: the same workload always gets the same id."""
        return (f"{self.codec}-v{self.value_bytes}-b{self.batch_bytes}"
                f"-p{self.partitions}-n{self.records}")

    def as_record(self) -> dict:
        """The ``workload`` object of a ``bench_run`` record."""
        return asdict(self)


#: Issue 6's default: 1M records of ~300-byte JSON-like values, 8 partitions, 256 KiB batches.
DEFAULT_RECORDS = 1_000_000
DEFAULT_VALUE_BYTES = 300
DEFAULT_BATCH_BYTES = 256 * 1024
#: The default matrix also runs 16 KiB batches: the Java producer's default ``batch.size``, where
#: the cost per batch (not per byte) decides (issue 15).
DEFAULT_BATCH_SIZES = (16 * 1024, DEFAULT_BATCH_BYTES)
DEFAULT_PARTITIONS = 8
DEFAULT_CODECS = ("lz4", "zstd", "gzip")


def default_workload(codec: str = "lz4") -> Workload:
    return Workload(codec, DEFAULT_VALUE_BYTES, DEFAULT_BATCH_BYTES, DEFAULT_PARTITIONS,
                    DEFAULT_RECORDS)


def expand(
    codecs: Iterable[str],
    value_bytes: Iterable[int] = (DEFAULT_VALUE_BYTES,),
    batch_bytes: Iterable[int] = DEFAULT_BATCH_SIZES,
    partitions: Iterable[int] = (DEFAULT_PARTITIONS,),
    records: Iterable[int] = (DEFAULT_RECORDS,),
) -> list[Workload]:
    """Every combination, codec varying slowest; duplicates (e.g. repeated list items) dropped."""
    seen: dict[Workload, None] = {}
    for combo in itertools.product(codecs, value_bytes, batch_bytes, partitions, records):
        seen.setdefault(Workload(*combo))
    return list(seen)


def parse_list(text: str, kind: type = str) -> list:
    """``"lz4,zstd"`` -> ``["lz4", "zstd"]``; ints accept ``k``/``m`` suffixes (``256k``, ``1m``)
    and ``KiB``/``MiB`` (``256KiB``)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError(f"empty list: {text!r}")
    if kind is str:
        return items
    return [_parse_int(item) for item in items]


_SUFFIXES: Sequence[tuple[str, int]] = (
    ("kib", 1024), ("mib", 1024 ** 2), ("gib", 1024 ** 3), ("k", 1000), ("m", 1000 ** 2),
    ("g", 1000 ** 3),
)


def _parse_int(item: str) -> int:
    low = item.lower().replace("_", "")
    try:
        for suffix, factor in _SUFFIXES:
            if low.endswith(suffix):
                return int(float(low[: -len(suffix)]) * factor)
        return int(low)
    except ValueError:
        pass
    hint = ""
    factors = dict(_SUFFIXES)
    for unit, binary in (("kb", "KiB"), ("mb", "MiB"), ("gb", "GiB")):
        number = low[: -len(unit)]
        if low.endswith(unit) and number.replace(".", "", 1).isdigit():
            size = float(number)
            hint = (f" ({unit} could mean either: {number}{binary} for "
                    f"{int(size * factors[binary.lower()]):,} or {number}{unit[0]} for "
                    f"{int(size * factors[unit[0]]):,})")
    raise ValueError(f"expected a count such as 20000, 20k, 1m or 256KiB, got {item!r}{hint}")
