"""Ctrl-C during a bench: seen at once, never recorded as a run, nothing left running.

No broker: the stop signals are sent to this process, the mode processes are small Python
children that ignore SIGTERM (as a mode whose brokers died of the same Ctrl-C hangs in its final
flush), and the producer points at an address nothing listens on. The whole bench interrupted on
real brokers is ``tests/integration/test_bench.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from shallowmirror.bench import runner
from shallowmirror.bench.interrupts import StopSignalLog
from shallowmirror.bench.load import LoadedSource
from shallowmirror.bench.matrix import Workload
from shallowmirror.cli.stop_signals import Terminated

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="process groups and signals as on Linux")


@contextlib.contextmanager
def python_handlers() -> Iterator[None]:
    """Python's own Ctrl-C handler and a SIGTERM handler raising ``Terminated``, as the
    ``shallowmirror`` command installs them; the test runner's come back after."""
    def terminated(_signum, _frame):
        raise Terminated()

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
                signal.SIGTERM: signal.signal(signal.SIGTERM, terminated)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _signal_self_after(delay_s: float, signum: int = signal.SIGINT) -> threading.Timer:
    timer = threading.Timer(delay_s, os.kill, (os.getpid(), signum))
    timer.start()
    return timer


def test_a_stop_signal_is_noted_and_passed_on():
    with python_handlers():
        handler = signal.getsignal(signal.SIGINT)
        with StopSignalLog() as stops:
            assert stops.interrupt() is None
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)           # the handler raises long before
            assert stops.received == signal.SIGINT
        assert signal.getsignal(signal.SIGINT) is handler   # put back


def test_a_swallowed_interrupt_is_raised_again():
    """Raised inside a confluent-kafka callback, Ctrl-C comes out as another error (or none):
    the bench carried on and recorded failed runs."""
    with python_handlers(), StopSignalLog() as stops:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            pass                        # what a library might do with it
        with pytest.raises(Terminated):
            stops.check()


def test_ignored_signals_stay_ignored():
    """A background job's SIGINT is ignored: the bench must not start taking it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignalLog():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_args() -> tuple:
    workload = Workload("lz4", 10, 1024, 1, 10)
    config = runner.BenchConfig(workloads=[workload], modes=["deep-confluent"])
    clusters = runner.Clusters("127.0.0.1:1", "127.0.0.1:2", False)
    source = LoadedSource("t", "t-latency", 10, 100, 300, 1, 0.1)
    return config, clusters, workload, source


def test_a_run_failing_after_a_stop_signal_is_the_stop_not_a_failed_run(monkeypatch):
    """The brokers die of the same Ctrl-C: the run in flight fails for want of them. That
    failure was recorded (a FAILED line, exit 1) instead of ending the bench as interrupted."""
    config, clusters, workload, source = _run_args()
    stops = StopSignalLog()
    ctrl_c = [signal.SIGINT]

    def brokers_gone(*_args) -> None:
        if ctrl_c:
            stops.received = ctrl_c.pop()
        raise ConnectionError("connection closed by broker")

    monkeypatch.setattr(runner, "_run", brokers_gone)
    with pytest.raises(KeyboardInterrupt) as stopped:
        runner.run_once(config, clusters, workload, source, "deep-confluent", 0, stops=stops)
    assert not isinstance(stopped.value, Terminated)
    # Without a stop signal the same failure is a result, recorded with its cause.
    stops.received = None
    record = runner.run_once(config, clusters, workload, source, "deep-confluent", 0,
                             stops=stops)
    assert record["ok"] is False and "connection closed by broker" in record["error"]


#: A mode stuck in its clean shutdown: SIGTERM ignored, with a child of its own.
_STUCK = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
          "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
          "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); "
          "print('up', flush=True); time.sleep(60)")


@contextlib.contextmanager
def stuck_mode() -> Iterator[tuple[subprocess.Popen, list[int]]]:
    proc = subprocess.Popen([sys.executable, "-c", _STUCK], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout.readline() == b"up\n"
        deadline = time.monotonic() + 10
        while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
            time.sleep(0.01)
        pids = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children())]
        assert len(pids) == 2
        yield proc, pids
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
    return True


def test_an_interrupted_run_kills_its_mode_at_once():
    """The harness waited ~30 s (stop_timeout_s) for a mode whose brokers were gone."""
    with stuck_mode() as (proc, pids):
        started = time.monotonic()
        code, _usage = runner._stop(proc, 30.0, at_once=True)
        assert time.monotonic() - started < 10    # not the 30 s a SIGTERM would be given
        assert code == -signal.SIGKILL
        deadline = time.monotonic() + 5
        while not _gone(pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(pids)


def test_ctrl_c_while_waiting_for_a_mode_to_stop_kills_it():
    with python_handlers(), stuck_mode() as (proc, pids):
        timer = _signal_self_after(0.3)
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            runner._stop(proc, 30.0)          # SIGTERM, ignored: waits, then Ctrl-C
        timer.join()
        assert time.monotonic() - started < 10
        deadline = time.monotonic() + 5
        while not _gone(pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(pids)


def _unreachable_producer(**config):
    from confluent_kafka import Producer

    from shallowmirror.rdkafka_logs import with_log_config

    return Producer(with_log_config({"bootstrap.servers": "127.0.0.1:1", **config}))


def test_ctrl_c_during_a_producer_flush_is_seen_at_once():
    """``producer.flush(120)`` kept the thread in librdkafka: with the brokers gone (the same
    Ctrl-C stops them) bench took two minutes to end. The loader's producer has a stats_cb, in
    which the interrupt is raised, and which librdkafka turns into a SystemError at the end of
    the flush; whichever comes out, it comes out at once."""
    from shallowmirror.mirror.clients import flush_sliced

    producer = _unreachable_producer(**{"statistics.interval.ms": 100,
                                        "stats_cb": lambda _stats: None})
    producer.produce("t", b"value")
    with python_handlers(), StopSignalLog() as stops:
        timer = _signal_self_after(0.3)
        started = time.monotonic()
        with pytest.raises((KeyboardInterrupt, SystemError)):
            flush_sliced(producer, 60)
        timer.join()
    assert time.monotonic() - started < 10
    assert stops.received == signal.SIGINT
    producer.purge()
    assert flush_sliced(producer, 0.2) == 0


def test_ctrl_c_during_a_load_ends_it_at_once_and_drops_the_queue():
    from shallowmirror.testing import workload

    load = workload.Workload(topic="t", records=2000, partitions=1, create_topic=False)
    with python_handlers(), StopSignalLog() as stops:
        timer = _signal_self_after(1.0)
        started = time.monotonic()
        with pytest.raises((KeyboardInterrupt, SystemError)):
            workload.load("127.0.0.1:1", load)     # 120 s to deliver, to no broker
        timer.join()
    assert time.monotonic() - started < 15
    assert stops.received == signal.SIGINT


def test_a_sliced_flush_gives_up_at_its_deadline():
    from shallowmirror.mirror.clients import flush_sliced

    producer = _unreachable_producer()
    producer.produce("t", b"value")
    assert flush_sliced(producer, 0.3, slice_s=0.1) == 1
    producer.purge()


_SCRIPT = """
import sys, time
from shallowmirror.bench.interrupts import run_script
from shallowmirror.testing.clusters import started_clusters

def main():
    with started_clusters("tansu", "source") as (source,):
        print(source.pid, flush=True)
        time.sleep(60)
    return 0

raise SystemExit(run_script(main))
"""


@pytest.mark.parametrize("signum, status, word", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                  (signal.SIGINT, 130, "interrupted")])
def test_a_benchmark_script_stopped_by_a_signal_stops_the_broker_it_started(signum, status, word):
    """``kill`` of a benchmark script (``run_script``) unwinds it as Ctrl-C does: the broker it
    started is stopped, the script says how it ended in one line and exits 130/143. Before,
    SIGTERM ended it at once and its brokers (Kafka JVMs) kept running."""
    # SIGINT at its default in the script, as in a terminal: a background job (CI's) inherits
    # it ignored, and an ignored Ctrl-C is left ignored on purpose (StopSignals.install).
    script = subprocess.Popen([sys.executable, "-c", _SCRIPT], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        broker = int(script.stdout.readline())
        assert psutil.pid_exists(broker)
        script.send_signal(signum)
        _out, err = script.communicate(timeout=30)
    finally:
        if script.poll() is None:
            script.kill()
    assert script.returncode == status
    assert err.strip().splitlines()[-1] == word and "Traceback" not in err
    deadline = time.monotonic() + 10
    while psutil.pid_exists(broker) and psutil.Process(broker).status() != "zombie":
        assert time.monotonic() < deadline, "the broker outlived the script"
        time.sleep(0.1)
