"""Ctrl-C while Spark's gateway JVM starts leaves no JVM behind.

PySpark starts the JVM with SIGINT ignored and only watches its stdin once it has connected, so a
Ctrl-C during the launch used to leave an orphaned ``SparkSubmit`` running after ``shallowmirror
report`` had exited (seen by hand: still running minutes later).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import psutil

CHILD = r"""
import json

import psutil
import pyspark.java_gateway as gateway

from shallowmirror.reports.spark import spark_session

launched = []
real_popen = gateway.Popen


def popen_then_ctrl_c(*args, **kwargs):
    launched.append(real_popen(*args, **kwargs))   # the JVM is starting...
    raise KeyboardInterrupt                        # ...when the operator presses Ctrl-C


gateway.Popen = popen_then_ctrl_c
try:
    spark_session(master="local[1]")
except KeyboardInterrupt:
    pass
left = [c.pid for c in psutil.Process().children() if c.status() != psutil.STATUS_ZOMBIE]
print(json.dumps({"launched": [p.pid for p in launched], "left": sorted(left)}))
"""


def test_ctrl_c_during_the_gateway_launch_kills_the_jvm(java, tmp_path):
    # Output to a file, not a pipe: a JVM left behind would hold a pipe open, and the test
    # would wait for it instead of failing.
    out = tmp_path / "child.out"
    with out.open("w") as sink:
        proc = subprocess.run([sys.executable, "-c", CHILD], stdout=sink,
                              stderr=subprocess.STDOUT, timeout=120)
    text = out.read_text()
    result = json.loads(text.strip().splitlines()[-1]) if text.strip() else {}
    launched, left = result.get("launched", []), result.get("left", [])
    try:
        assert proc.returncode == 0, text[-2000:]
        assert len(launched) == 1, text[-2000:]      # the premise: a JVM was launched
        assert left == [], f"JVM {left} outlived the interrupted launch"
    finally:
        for pid in set(launched) | set(left):       # never leave one behind, even failing
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


KEEPS_HANDLER = r"""
import signal

from shallowmirror.reports.spark import spark_session, stop_session


def ours(signum, frame):
    raise KeyboardInterrupt


signal.signal(signal.SIGINT, ours)
session = spark_session(master="local[1]")
try:
    print("kept" if signal.getsignal(signal.SIGINT) is ours else "replaced")
finally:
    stop_session(session)
"""


def test_the_callers_ctrl_c_handler_survives_the_session_start(java):
    """PySpark's own handler calls the gateway from inside the signal handler: a Ctrl-C while
    the main thread waits on the gateway then logs py4j errors over the operator's Ctrl-C."""
    proc = subprocess.run([sys.executable, "-c", KEEPS_HANDLER], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["kept"], proc.stdout


def test_the_local_driver_jvm_compiles_with_the_quick_compiler_only(spark):
    """A report's JVM lives under a minute: the optimising compiler cost more than it saved
    (``LOCAL_JIT_OPTION``). The option must reach the JVM spark-submit launched."""
    from shallowmirror.reports.spark import LOCAL_JIT_OPTION

    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
                     .getInputArguments())
    assert LOCAL_JIT_OPTION in arguments, arguments


def test_a_master_that_cannot_work_is_named_before_any_jvm_starts():
    """``--master bogus://x`` gave a Java stack trace, and an unreachable ``spark://`` master ~80
    s of retries, log lines, py4j tracebacks and 'unexpected ConnectionRefusedError'."""
    import socket

    from shallowmirror.reports.spark import master_problem

    for good in ("local", "local[*]", "local[2]", "local[2,3]", "yarn", "k8s://https://h:443"):
        assert master_problem(good) is None, good
    for bad in ("bogus://x", "local[x]", "spark", ""):
        assert "is not a Spark master URL" in master_problem(bad), bad
    assert "is not HOST:PORT" in master_problem("spark://nohost")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]          # bound, not listening: refused
        assert master_problem(f"spark://127.0.0.1:{port}") == (
            f"the Spark master at spark://127.0.0.1:{port} did not answer (127.0.0.1:{port}: "
            "Connection refused); is it running, and is that its address?")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert master_problem(f"spark://127.0.0.1:1,127.0.0.1:{port}") is None
