"""``make test``: the whole suite on embedded tansu, then the integration suite on Apache Kafka.

    python -m shallowmirror.testing.suite [pytest args...]

Run 1 is every test with the embedded tansu clusters (the users' default). Run 2 is every
``integration`` test again with real Apache Kafka clusters from ``KAFKA_HOME``
(``SHALLOWMIRROR_BROKER=kafka``). Both run in three pytest-xdist workers (whole files per worker,
each with its own pair of clusters) when pytest-xdist is installed:
``SHALLOWMIRROR_TANSU_WORKERS`` / ``SHALLOWMIRROR_KAFKA_WORKERS`` change that (1: one process).
Most integration tests wait (group joins, process start-up, brokers coming back), so more
workers than cores pay off: on the project's 2-core machine two workers left the CPU 20-60%
idle through the Kafka run, and three took run 1 from 447 s to 341 s and run 2 from 666 s to
592 s (2026-11-29), with the CPU then busy throughout. Without a distribution or Java, run 2 is
skipped with one line saying why — unless ``SHALLOWMIRROR_REQUIRE_KAFKA=1`` (CI, when a
distribution ships beside the project), where that is a failure. Clusters given by
``SHALLOWMIRROR_SOURCE/TARGET_BOOTSTRAP`` replace both runs by one.

Run 2 starts some 40 Kafka JVMs. While run 1 goes, one throwaway broker writes a class-data
archive of Kafka's start-up (``kafka.build_class_archive``) that run 2's brokers map: a broker
then comes up in 4.4 instead of 6.4 CPU s. If it cannot be written, run 2 goes without it.

Exit status: non-zero if any run failed or collected no test. The last line counts both runs in
the form CI reads: ``total: N passed, N failed, N skipped``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from shallowmirror.testing.clusters import BROKER_ENV
from shallowmirror.testing.embedded import SOURCE_ENV, TARGET_ENV, BrokerStartError
from shallowmirror.testing.kafka import CLASS_ARCHIVE_ENV, build_class_archive, find_kafka_home

REQUIRE_KAFKA_ENV = "SHALLOWMIRROR_REQUIRE_KAFKA"
KAFKA_WORKERS_ENV = "SHALLOWMIRROR_KAFKA_WORKERS"
TANSU_WORKERS_ENV = "SHALLOWMIRROR_TANSU_WORKERS"
#: pytest-xdist workers per run unless the variables above say otherwise (see the module text).
WORKERS = 3
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")


@dataclass
class RunResult:
    name: str
    exit_code: int
    counts: dict[str, int]
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.counts.get("passed", 0) > 0


def _counts(summary: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for number, word in _COUNT.findall(summary):
        key = "errors" if word.startswith("error") else word
        counts[key] = counts.get(key, 0) + int(number)
    return counts


def run_pytest(name: str, args: list[str], env: dict[str, str]) -> RunResult:
    """Run pytest as a child, streaming its output; return its exit code and closing counts."""
    print(f"\n===== {name} =====", flush=True)
    started = time.monotonic()
    summary = ""
    with subprocess.Popen([sys.executable, "-m", "pytest", *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            if re.search(r"\d+ (passed|failed|error)", line) and " in " in line:
                summary = line
        code = proc.wait()
    return RunResult(name, code, _counts(summary), time.monotonic() - started)


def kafka_run_plan() -> tuple[str | None, str]:
    """(KAFKA_HOME to use or None, the reason when None)."""
    try:
        return str(find_kafka_home()), ""
    except BrokerStartError as err:
        return None, str(err)


class ClassArchive:
    """``kafka.build_class_archive`` in a thread of its own, while run 1 goes."""

    def __init__(self, kafka_home: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="shallowmirror-kafka-classes-"))
        self.path: Path | None = None
        self.problem = ""
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._build, args=(kafka_home,), daemon=True)
        self._thread.start()

    def _build(self, kafka_home: str) -> None:
        started = time.monotonic()
        try:
            self.path = build_class_archive(self.folder / "kafka.jsa", kafka_home=kafka_home)
        except Exception as err:  # noqa: BLE001 - run 2 goes without it, and says why
            self.problem = str(err).splitlines()[0] if str(err) else type(err).__name__
        self.seconds = time.monotonic() - started

    def wait(self) -> Path | None:
        """The archive once written (None, with ``problem`` saying why, if it was not)."""
        self._thread.join()
        return self.path

    def remove(self, *, wait: bool = True) -> None:
        """Remove the archive; ``wait=False`` (interrupted) does not wait for a build still
        running: its broker was launched from the build's thread, so it gets SIGTERM when that
        thread ends with this process (``embedded._set_parent_death_signal``)."""
        if wait:
            self._thread.join()
        shutil.rmtree(self.folder, ignore_errors=True)


def _xdist_args(workers: int) -> list[str]:
    try:
        import xdist  # noqa: F401
    except ImportError:
        return []
    return ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []


def main(argv: list[str] | None = None) -> int:
    try:
        return _runs(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        # pytest has said where it stopped; no traceback of this runner over it.
        print("\ninterrupted (Ctrl-C)", file=sys.stderr)
        return 130


def _runs(args: list[str]) -> int:
    base_env = dict(os.environ)
    results: list[RunResult] = []
    if base_env.get(SOURCE_ENV) or base_env.get(TARGET_ENV):
        results.append(run_pytest(f"external clusters ({base_env.get(SOURCE_ENV)})", args,
                                  base_env))
        return _finish(results, missing_kafka=None)

    home, why = kafka_run_plan()
    archive = ClassArchive(home) if home is not None else None
    try:
        tansu_env = {**base_env, BROKER_ENV: "tansu"}
        tansu_args = [*_xdist_args(int(base_env.get(TANSU_WORKERS_ENV, str(WORKERS)))), *args]
        results.append(run_pytest("run 1 of 2: every test, embedded tansu brokers", tansu_args,
                                  tansu_env))
        if home is None or archive is None:
            return _finish(results, missing_kafka=why)
        workers = int(base_env.get(KAFKA_WORKERS_ENV, str(WORKERS)))
        kafka_env = {**base_env, BROKER_ENV: "kafka", "KAFKA_HOME": home}
        if archive.wait() is not None:
            kafka_env[CLASS_ARCHIVE_ENV] = str(archive.path)
            print(f"\nKafka class archive for run 2's brokers: written in {archive.seconds:.0f}s",
                  flush=True)
        else:
            print(f"\nKafka class archive not written ({archive.problem}): run 2's brokers "
                  "start without it", flush=True)
        kafka_args = ["-m", "integration", *_xdist_args(workers), *args]
        results.append(run_pytest(f"run 2 of 2: integration tests, Apache Kafka from {home}",
                                  kafka_args, kafka_env))
        return _finish(results, missing_kafka=None)
    except KeyboardInterrupt:
        if archive is not None:
            archive.remove(wait=False)
            archive = None
        raise
    finally:
        if archive is not None:
            archive.remove()


def _finish(results: list[RunResult], missing_kafka: str | None) -> int:
    print("\n===== summary =====")
    failed = False
    for result in results:
        counts = ", ".join(f"{n} {k}" for k, n in result.counts.items()) or "no test ran"
        verdict = "ok" if result.ok else f"FAILED (pytest exit {result.exit_code})"
        print(f"{result.name}: {counts} in {result.seconds:.0f}s — {verdict}")
        failed |= not result.ok
    if missing_kafka is not None:
        required = os.environ.get(REQUIRE_KAFKA_ENV) == "1"
        label = "FAILED" if required else "skipped"
        print(f"Apache Kafka run {label}: {missing_kafka}"
              + (f" ({REQUIRE_KAFKA_ENV}=1 requires it)" if required else ""))
        failed |= required
    total = {k: sum(r.counts.get(k, 0) for r in results) for k in ("passed", "failed", "skipped")}
    total["failed"] += sum(r.counts.get("errors", 0) for r in results)
    print(f"total: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
