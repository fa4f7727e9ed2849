"""Starting Spark for the reports, and checking first that the Java it needs is there.

PySpark launches a JVM through ``spark-submit``, which uses ``$JAVA_HOME/bin/java`` when
``JAVA_HOME`` is set and ``java`` from ``PATH`` otherwise. When that Java is missing or too old,
PySpark fails with a long gateway traceback that does not say what to install; :func:`check_java`
looks first, the same way, and raises a :class:`ShallowMirrorError` that does.

Out of scope: installing Java, and configuring a cluster (pass its master URL).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shallowmirror.errors import ShallowMirrorError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Spark 4 needs Java 17 (Spark 3.5 would accept 8/11/17); the project tests on 17.
MIN_JAVA_MAJOR = 17

INSTALL_HINT = (
    f"install Java {MIN_JAVA_MAJOR} or newer (Debian/Ubuntu: apt-get install openjdk-{MIN_JAVA_MAJOR}"
    f"-jre-headless; macOS: brew install openjdk@{MIN_JAVA_MAJOR}) and put its `java` on PATH "
    f"or set JAVA_HOME to its home directory"
)

_VERSION_RE = re.compile(r'version "(\d+)(?:\.(\d+))?[^"]*"')


class JavaMissingError(ShallowMirrorError):
    """No usable Java for Spark: missing, not runnable, or older than :data:`MIN_JAVA_MAJOR`."""


@dataclass(frozen=True)
class JavaInfo:
    """The Java that Spark will launch."""

    path: str
    major: int
    version_line: str


def find_java(env: Mapping[str, str] | None = None) -> str | None:
    """Path of the ``java`` Spark would run (``$JAVA_HOME/bin/java``, else ``PATH``), or None."""
    env = os.environ if env is None else env
    java_home = env.get("JAVA_HOME")
    if java_home:
        # spark-submit does not fall back to PATH when JAVA_HOME is set, so neither do we.
        candidate = os.path.join(java_home, "bin", "java")
        return candidate if os.access(candidate, os.X_OK) else None
    return shutil.which("java", path=env.get("PATH", ""))


def parse_java_major(version_output: str) -> int | None:
    """Major version from ``java -version`` output: ``"1.8.0_392"`` -> 8, ``"17.0.15"`` -> 17."""
    match = _VERSION_RE.search(version_output)
    if not match:
        return None
    first = int(match.group(1))
    if first == 1 and match.group(2) is not None:  # Java 8 and older call themselves 1.x
        return int(match.group(2))
    return first


def check_java(env: Mapping[str, str] | None = None, min_major: int = MIN_JAVA_MAJOR) -> JavaInfo:
    """Return the Java Spark would use, or raise :class:`JavaMissingError` saying what to install."""
    env = os.environ if env is None else env
    java = find_java(env)
    if java is None:
        where = (
            f"JAVA_HOME={env['JAVA_HOME']} has no bin/java"
            if env.get("JAVA_HOME")
            else "no `java` on PATH and JAVA_HOME is not set"
        )
        raise JavaMissingError(f"Spark reports need Java: {where}; {INSTALL_HINT}")
    try:
        proc = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, env=dict(env)
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise JavaMissingError(f"Spark reports need Java, but {java} did not run ({err}); "
                               f"{INSTALL_HINT}") from err
    output = (proc.stderr or "") + (proc.stdout or "")  # java -version writes to stderr
    major = parse_java_major(output)
    first_line = output.strip().splitlines()[0] if output.strip() else ""
    if proc.returncode != 0 or major is None:
        raise JavaMissingError(
            f"Spark reports need Java, but `{java} -version` failed (exit {proc.returncode}: "
            f"{first_line!r}); {INSTALL_HINT}"
        )
    if major < min_major:
        raise JavaMissingError(
            f"Spark reports need Java {min_major} or newer, found Java {major} at {java} "
            f"({first_line}); {INSTALL_HINT}"
        )
    return JavaInfo(path=java, major=major, version_line=first_line)


#: Spark's default log4j2 profile prints INFO banners and a native-hadoop WARN on every start;
#: reports only want errors on the console.
_LOG4J2_QUIET = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""

#: What the driver JVM prints on every start, whatever log4j2 says: the JVM's note on the vector
#: incubator module Spark 4 adds, and Spark's banner for a Python driver (it announces the
#: shell's WARN default even when our log4j2 profile says error). Dropped from its stderr.
_JVM_START_NOISE = (b"WARNING: Using incubator modules: jdk.incubator.vector",
                    b'Setting default log level to "',
                    b"To adjust logging level use sc.setLogLevel(newLevel).")


@contextlib.contextmanager
def _quiet_log4j2_file():
    """A log4j2 properties file that logs errors only, removed once the JVM has read it."""
    fd, path = tempfile.mkstemp(prefix="shallowmirror-log4j2-", suffix=".properties")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_LOG4J2_QUIET)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


@contextlib.contextmanager
def _jvm_stderr_filtered():
    """While the driver JVM is launched, give it a stderr pipe that forwards every line to the
    real stderr except ``_JVM_START_NOISE`` (a thread copies until the JVM exits); this
    process's own stderr is restored as soon as the launch returns."""

    read_fd, write_fd = os.pipe()
    saved = os.dup(2)
    out = os.dup(2)

    def forward() -> None:
        with os.fdopen(read_fd, "rb") as pipe, os.fdopen(out, "wb", buffering=0) as real:
            for line in pipe:
                if not line.rstrip().startswith(_JVM_START_NOISE):
                    real.write(line)

    threading.Thread(target=forward, name="spark-stderr", daemon=True).start()
    sys.stderr.flush()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


#: The local driver JVM compiles hot code with the quick compiler (C1) only. A report runs ~40
#: small jobs over megabytes in a JVM that lives under a minute, and the optimising compiler
#: (C2) spent more CPU compiling than it saved: measured with ``shallowmirror report`` on the
#: test inputs on 2 cores, 86 CPU s and 50 s without this, 49 CPU s and 40 s with it.
LOCAL_JIT_OPTION = "-XX:TieredStopAtLevel=1"


_MASTER_FORMS = re.compile(r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[.+\]|yarn|"
                           r"(spark|k8s|mesos)://.+")


def master_form_problem(master: str) -> str | None:
    """Why ``master`` is not a Spark master URL at all (a usage error), or None."""
    if not _MASTER_FORMS.fullmatch(master):
        return (f"--master {master!r} is not a Spark master URL: local, local[N], local[*], "
                "spark://HOST:PORT, yarn, k8s://..., mesos://...")
    if master.startswith("spark://"):
        for address in master[len("spark://"):].split(","):
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                return f"--master {master!r}: {address!r} is not HOST:PORT"
    return None


def master_problem(master: str, timeout_s: float = 5.0) -> str | None:
    """Why ``master`` cannot work, found before a JVM starts, or None. Spark reports a bad URL
    with a Java stack trace, and an unreachable ``spark://`` master after ~80 s of retries and
    log lines; here the first is refused by its form, the second by one TCP connect to each
    of its addresses."""
    problem = master_form_problem(master)
    if problem or not master.startswith("spark://"):
        return problem
    reasons = []
    for address in master[len("spark://"):].split(","):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return None
        except OSError as err:
            reasons.append(f"{address}: {err.strerror or err}")
    return (f"the Spark master at {master} did not answer ({'; '.join(reasons)}); is it "
            "running, and is that its address?")


def spark_session(
    master: str = "local[*]",
    app_name: str = "shallowmirror-report",
    shuffle_partitions: int = 4,
) -> SparkSession:
    """A SparkSession for the report jobs: quiet, no UI, few shuffle partitions (inputs are small).

    Checks Java first. ``master`` is any Spark master URL (``local[*]``, ``spark://host:7077``,
    ``yarn``...). Stop it with ``stop_session(session)`` when done.
    """
    check_java()
    problem = master_problem(master)
    if problem:
        raise ShallowMirrorError(problem)
    try:
        from pyspark.sql import SparkSession
    except ImportError as err:
        raise ShallowMirrorError(
            "Spark reports need pyspark: pip install 'shallowmirror[bench]'"
        ) from err
    # Executors must run this interpreter (the one with shallowmirror's dependencies), not
    # whatever `python3` is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        # Report inputs are megabytes: the default 200 shuffle partitions only add task overhead.
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Times in the inputs are epoch seconds; keep any rendering of them in UTC.
        .config("spark.sql.session.timeZone", "UTC")
    )
    if master.startswith("local"):
        # A local run needs no network identity; binding to loopback avoids hostname lookups
        # that hang or fail on sandboxed and offline machines.
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    else:
        builder = builder.config("spark.log.level", "ERROR")
    children_before = _child_pids()
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with _quiet_log4j2_file() as log4j2, _jvm_stderr_filtered():
            if master.startswith("local"):
                # Read by the driver JVM that spark-submit launches, so it applies from Spark's
                # first log line. Local only: on a cluster, its own spark-defaults may set these.
                builder = builder.config("spark.driver.extraJavaOptions",
                                         f"-Dlog4j2.configurationFile=file:{log4j2} "
                                         f"{LOCAL_JIT_OPTION}")
            session = builder.getOrCreate()
    except BaseException as err:
        # A gateway JVM launched but not yet connected (Ctrl-C during the launch, or a failed
        # start) is nobody's: PySpark ignores SIGINT in it and only watches its stdin once
        # connected. It would run on after this process, so it goes now.
        _kill_children_since(children_before)
        if isinstance(err, Exception):  # py4j raises plain Exceptions on gateway failure
            raise ShallowMirrorError(f"could not start Spark (master {master}): {err}") from err
        raise
    # PySpark's SIGINT handler cancels the jobs through the gateway from inside the handler;
    # when the main thread is itself waiting on the gateway, that call is re-entrant and py4j
    # logs errors with tracebacks over the operator's Ctrl-C. The caller's handler comes back
    # (``stop_session`` ends the jobs with the JVM).
    if sigint is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, sigint)
    session.sparkContext.setLogLevel("ERROR")
    return session


def _child_pids() -> set[int]:
    import psutil

    return {child.pid for child in psutil.Process().children()}


def _kill_children_since(before: set[int], timeout_s: float = 10.0) -> None:
    """SIGKILL this process's children that were not there in ``before``, and reap them."""
    import psutil

    new = [child for child in psutil.Process().children() if child.pid not in before]
    for child in new:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(new, timeout=timeout_s)


def stop_session(session: SparkSession, timeout_s: float = 30.0) -> None:
    """Stop the session *and* its JVM: ``session.stop()`` alone leaves py4j's gateway JVM
    (``SparkSubmit``) running until this interpreter exits, so a caller that returns right
    after (``make test``, the report CLI) would leave a Java process behind for seconds."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)  # the Popen of the JVM this interpreter launched
    session.stop()
    if gateway is not None:
        with contextlib.suppress(Exception):
            gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
    if proc is None:
        return
    with contextlib.suppress(Exception):
        proc.stdin.close()  # the gateway JVM exits when its stdin closes
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout_s)
