"""The engine's instructions per forwarded batch: ``hotpath_micro.py`` counted by valgrind.

    PYTHONPATH=. .venv/bin/python benchmarks/engine/hotpath_instructions.py \
        [--batch-bytes 5800] [--partitions 8] [--baseline DIR] [--offset-syncs] [--metrics]

Timings on the VMs this project runs on swing by +-25% between consecutive runs and differ 2-3x
between hosts, and the VMs expose no performance counters; an instruction count does neither.
This runs ``hotpath_micro.py``'s engine (fake clusters, no sockets) under ``valgrind
--tool=cachegrind`` at two batch counts, and each count's set-up alone, and prints
(instructions of the larger run - its set-up - (the smaller run - its set-up)) / (batches
between them): the engine's own instructions per batch, request work included, the harness's
set-up excluded. ``--baseline DIR`` counts another tree (``PYTHONPATH=DIR``) the same way.
Instructions are not time (memory stalls are not in them), so this shows what a change to the
engine's code does, and the timed benchmarks show what it is worth. Needs valgrind (Debian:
``apt-get install valgrind``); takes about a minute per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

MICRO = Path(__file__).with_name("hotpath_micro.py")
COUNTS = (8000, 32000)


def instructions(path: str, batches: int, batch_bytes: int, partitions: int,
                 setup_only: bool, extra: tuple[str, ...] = ()) -> tuple[int, int]:
    """(instructions, batches forwarded) of one ``hotpath_micro.py --child`` run."""
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
               "--cachegrind-out-file=/dev/null", sys.executable, str(MICRO), "--child",
               "--batch-bytes", str(batch_bytes), "--batches", str(batches),
               "--partitions", str(partitions)]
    command += (["--setup-only"] if setup_only else []) + list(extra)
    # A fixed hash seed: str hashes (dict and set layouts) otherwise move counts by ~1-2%.
    env = {"PYTHONHASHSEED": "0", **os.environ, "PYTHONPATH": path}
    done = subprocess.run(command, env=env, capture_output=True,
                          text=True, check=True)
    refs = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if refs is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    forwarded = json.loads(done.stdout.strip().splitlines()[-1])["batches"]
    return int(refs.group(1).replace(",", "")), forwarded


def per_batch(path: str, batch_bytes: int, partitions: int, extra: tuple[str, ...] = ()) -> float:
    """``extra``: ``hotpath_micro.py`` options (``--offset-syncs``, ``--metrics``)."""
    (small, n_small), (large, n_large) = (
        instructions(path, n, batch_bytes, partitions, False, extra) for n in COUNTS)
    (small_setup, _), (large_setup, _) = (
        instructions(path, n, batch_bytes, partitions, True, extra) for n in COUNTS)
    return ((large - large_setup) - (small - small_setup)) / (n_large - n_small)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-bytes", type=int, default=5800)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--baseline", metavar="DIR")
    parser.add_argument("--offset-syncs", action="store_true",
                        help="with the mirror process's offset-sync writer on the hook "
                             "(hotpath_micro.py --offset-syncs)")
    parser.add_argument("--metrics", action="store_true",
                        help="with the metrics records the mirror process keeps "
                             "(hotpath_micro.py --metrics)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("hotpath_instructions: valgrind is not installed (Debian: apt-get install "
              "valgrind)", file=sys.stderr)
        return 2
    trees = [("new", os.environ.get("PYTHONPATH", ""))]
    if args.baseline:
        trees.append(("base", args.baseline))
    for name, path in trees:
        extra = tuple(option for option, wanted in (("--offset-syncs", args.offset_syncs),
                                                    ("--metrics", args.metrics)) if wanted)
        count = per_batch(path, args.batch_bytes, args.partitions, extra)
        syncs = "".join(f", {option[2:]}" for option in extra)
        print(f"{name:4} {count:9,.0f} instructions per batch ({args.batch_bytes} B batches, "
              f"{args.partitions} partitions: one request per {args.partitions} batches"
              f"{syncs})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
