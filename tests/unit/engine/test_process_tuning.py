"""The mirror process's own settings (engine/process_tuning.py), each in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Three 8 MiB frames at a time, as a mirror receives Fetch responses, twenty times over; prints
# the minor page faults taken meanwhile and the GC's first-generation threshold.
_FRAMES = """
import gc, resource, sys
from shallowmirror.engine.process_tuning import tune_for_mirroring
if sys.argv[1] == "tuned":
    tune_for_mirroring()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
warm = [bytearray(8 << 20) for _ in range(3)]
del warm
before = faults()
for _ in range(20):
    frames = [bytearray(8 << 20) for _ in range(3)]
    del frames
print(faults() - before, gc.get_threshold()[0])
"""


def _run(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", _FRAMES, mode], capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_freed_frames_are_reused_without_page_faults():
    plain_faults, plain_gen0 = _run("plain")
    tuned_faults, tuned_gen0 = _run("tuned")
    # Untuned, glibc hands every 8 MiB frame back to the kernel: ~2,048 faults per frame.
    assert plain_faults > 20 * 2048
    assert tuned_faults < 2048, "a freed frame's memory was not reused"
    assert plain_gen0 < 10_000 <= tuned_gen0
