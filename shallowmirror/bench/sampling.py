"""CPU and RSS of a process tree, sampled with psutil.

Method (the harness reports what it can see, and says so):
- CPU of the tree at time t = the user/system time of every process alive in the tree at t, plus,
  for every process seen earlier that has since exited, its times at the last sample before it
  exited. ``children_*`` times are not added: they would count reaped descendants twice. A
  descendant that lives less than one interval is missed; when the root has been reaped with
  ``wait4`` the kernel's rusage (root + reaped descendants) is exact and the larger value wins.
- Resolution: the kernel reports a process's user/system times in clock ticks (10 ms), too
  coarse for a short window (a mirror that moves a few thousand records on a fast broker spends
  less than a tick). Each thread's run time from ``/proc/PID/task/TID/schedstat`` is exact to the
  nanosecond; a process's CPU is the larger of the two sums, split into user and system in the
  ratio of its ticks (all user while it has none). A thread that exits keeps its last reading.
- RSS of the tree = the sum of the resident set sizes of the processes alive at a sample; the peak
  is the largest such sum (shared pages of forked children are counted once per process).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import psutil


@dataclass
class TreeSample:
    time: float            # UNIX epoch seconds
    cpu_user_s: float
    cpu_sys_s: float
    rss_bytes: int
    pids: int              # processes alive in the tree


@dataclass
class _Seen:
    user: float = 0.0
    system: float = 0.0
    run_ns: dict[int, int] = field(default_factory=dict)  # thread id -> schedstat run time

    def cpu(self) -> tuple[float, float]:
        """(user, system) seconds: tick counts, raised to the exact thread run time when larger."""
        ticks = self.user + self.system
        exact = sum(self.run_ns.values()) / 1e9
        if exact <= ticks:
            return self.user, self.system
        if ticks <= 0:
            return exact, 0.0
        return self.user * exact / ticks, self.system * exact / ticks


def _thread_run_ns(pid: int) -> dict[int, int]:
    """Thread id -> nanoseconds on a CPU (first field of its schedstat); {} where unavailable."""
    out: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out


@dataclass
class ProcessTreeSampler:
    """Samples ``root_pid`` and its descendants every ``interval_s`` on a daemon thread.

    ``sample()`` may also be called directly (e.g. at the instant the last record arrives); it is
    thread-safe. Samples are kept in ``samples``; ``peak_rss_bytes`` is the largest tree RSS.
    """

    root_pid: int
    interval_s: float = 0.1
    samples: list[TreeSample] = field(default_factory=list)
    peak_rss_bytes: int = 0
    _seen: dict[tuple[int, float], _Seen] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _procs: dict[int, psutil.Process] = field(default_factory=dict)

    def start(self) -> ProcessTreeSampler:
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def _tree(self) -> list[psutil.Process]:
        # Keep Process objects between samples: psutil caches create_time, which makes a reused
        # pid a different key.
        try:
            root = self._procs.get(self.root_pid) or psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        tree = []
        for proc in procs:
            tree.append(self._procs.setdefault(proc.pid, proc))
        return tree

    def sample(self) -> TreeSample | None:
        """Take one sample now; None when the tree is gone (nothing alive to read)."""
        with self._lock:
            rss = 0
            alive = 0
            for proc in self._tree():
                try:
                    with proc.oneshot():
                        times = proc.cpu_times()
                        mem = proc.memory_info().rss
                        key = (proc.pid, proc.create_time())
                except psutil.Error:
                    continue  # exited between listing and reading: its last sample stands
                seen = self._seen.setdefault(key, _Seen())
                seen.user, seen.system = times.user, times.system
                seen.run_ns.update(_thread_run_ns(proc.pid))
                rss += mem
                alive += 1
            if not alive:
                return None
            user, system = self._total()
            sample = TreeSample(time.time(), user, system, rss, alive)
            self.samples.append(sample)
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            return sample

    def cpu(self) -> tuple[float, float]:
        """(user, system) seconds of the tree as of the latest sample."""
        with self._lock:
            return self._total()

    def _total(self) -> tuple[float, float]:
        times = [seen.cpu() for seen in self._seen.values()]
        return sum(t[0] for t in times), sum(t[1] for t in times)


def wait_rusage(pid: int, timeout_s: float | None = None) -> tuple[int, float, float, int] | None:
    """Reap child ``pid`` with ``wait4``: (exit code, user s, sys s, max single-process RSS bytes).

    Polls with WNOHANG so a timeout is possible; None if it has not exited by then. The rusage
    covers the child and every descendant it reaped itself (the kernel's own accounting).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    delay = 0.005
    while True:
        got, status, usage = os.wait4(pid, os.WNOHANG)
        if got == pid:
            # ru_maxrss is in KiB on Linux.
            return (os.waitstatus_to_exitcode(status), usage.ru_utime, usage.ru_stime,
                    usage.ru_maxrss * 1024)
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
