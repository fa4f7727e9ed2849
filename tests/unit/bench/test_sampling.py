"""Process-tree sampling: CPU of children and grandchildren, exited processes, RSS, wait4."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from shallowmirror.bench.sampling import ProcessTreeSampler, wait_rusage

# A parent that burns CPU itself and starts a child that burns CPU and holds ~60 MB.
_TREE = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import time\\nblob = bytearray(60 << 20)\\nfor i in range(0, len(blob), 4096): blob[i] = 1\\n"
        "t = time.process_time()\\nwhile time.process_time() - t < 0.4: pass\\n"
        "time.sleep(0.3)"])
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    child.wait()
    sys.stdin.read()  # stay alive until the test lets go
""")


def _burn_tree():
    return subprocess.Popen([sys.executable, "-c", _TREE], stdin=subprocess.PIPE)


def test_tree_cpu_counts_descendants_even_after_they_exit():
    proc = _burn_tree()
    sampler = ProcessTreeSampler(proc.pid, interval_s=0.02).start()
    try:
        # Wait (by samples, not by a sleep guess) until the child has come and gone.
        for _ in range(1500):  # bounded: a broken sampler fails instead of hanging
            if any(s.pids >= 2 for s in sampler.samples) and sampler.samples[-1].pids == 1:
                break
            sampler._stop.wait(0.02)
        sampler.sample()
        user, system = sampler.cpu()
    finally:
        sampler.stop()
        proc.stdin.close()
        proc.wait()
    # parent 0.3 s + child 0.4 s of busy loop; sampling at 20 ms may miss a little of the child.
    assert user + system >= 0.6
    assert sampler.peak_rss_bytes >= 60 << 20
    assert max(s.pids for s in sampler.samples) >= 2


def test_sampler_returns_none_once_the_tree_is_gone_and_keeps_the_last_values():
    proc = subprocess.Popen([sys.executable, "-c",
                             "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 0.2: pass\n"])
    sampler = ProcessTreeSampler(proc.pid)
    first = sampler.sample()
    assert first is not None and first.pids == 1
    code, user, system, _ = wait_rusage(proc.pid)
    assert code == 0
    assert sampler.sample() is None
    # The kernel's rusage of the reaped child is at least what was sampled before it exited.
    assert user + system >= sum(sampler.cpu()) - 0.01
    assert user + system >= 0.19


def test_wait_rusage_times_out_without_reaping():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    try:
        assert wait_rusage(proc.pid, timeout_s=0.05) is None
    finally:
        proc.stdin.close()
    code, *_ = wait_rusage(proc.pid, timeout_s=30)
    assert code == 0


def test_cpu_below_one_clock_tick_is_measured():
    # A window in which the process burns ~3 ms: ticks (10 ms) would mostly read 0.
    burn = ("import sys, time\nprint('up', flush=True)\nsys.stdin.readline()\n"
            "t = time.process_time()\n"
            "while time.process_time() - t < 0.003: pass\nprint('done', flush=True)\n"
            "sys.stdin.readline()\n")
    proc = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"  # start-up done: only the burn is in the window
        sampler = ProcessTreeSampler(proc.pid)
        sampler.sample()
        before = sum(sampler.cpu())
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
        sampler.sample()
        spent = sum(sampler.cpu()) - before
    finally:
        proc.stdin.close()
        proc.wait()
    assert 0.002 <= spent < 0.05
