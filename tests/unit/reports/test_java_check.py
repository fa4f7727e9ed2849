"""A missing or old Java is reported as such, naming what to install, before Spark starts."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from shallowmirror.errors import ShallowMirrorError
from shallowmirror.reports.spark import JavaMissingError, check_java, parse_java_major


def fake_java(tmp_path, version_line: str):
    """A JAVA_HOME whose bin/java prints ``version_line`` like `java -version` does (stderr)."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return {"JAVA_HOME": str(tmp_path / "jdk"), "PATH": os.environ.get("PATH", "")}


def test_no_java_anywhere(tmp_path):
    with pytest.raises(ShallowMirrorError) as info:
        check_java(env={"PATH": str(tmp_path)})
    message = str(info.value)
    assert "no `java` on PATH and JAVA_HOME is not set" in message
    assert "Java 17" in message and "JAVA_HOME" in message


def test_java_home_without_java(tmp_path):
    with pytest.raises(JavaMissingError, match=f"JAVA_HOME={tmp_path} has no bin/java"):
        check_java(env={"JAVA_HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")})


def test_java_too_old(tmp_path):
    env = fake_java(tmp_path, 'openjdk version "11.0.21" 2023-10-17')
    with pytest.raises(JavaMissingError, match="need Java 17 or newer, found Java 11"):
        check_java(env=env)


def test_java_new_enough(tmp_path):
    env = fake_java(tmp_path, 'openjdk version "21.0.2" 2024-01-16')
    info = check_java(env=env)
    assert info.major == 21 and info.path.endswith("jdk/bin/java")


@pytest.mark.parametrize(("text", "major"), [
    ('java version "1.8.0_392"', 8), ('openjdk version "17.0.15" 2025-04-15', 17),
    ('openjdk version "21" 2023-09-19', 21), ("garbage", None),
])
def test_parse_java_major(text, major):
    assert parse_java_major(text) == major


@pytest.mark.parametrize("ci, code", [(None, 0), ("true", 1)])
def test_java_check_module_explains_and_fails_only_under_ci(tmp_path, ci, code):
    env = {**os.environ, "PATH": str(tmp_path)}
    env.pop("JAVA_HOME", None)
    env.pop("CI", None)
    if ci:
        env["CI"] = ci
    proc = subprocess.run([sys.executable, "-m", "shallowmirror.testing.java_check"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == code
    expected = "CI=true and Spark cannot run" if ci else "Spark report tests will be skipped"
    assert expected in proc.stdout and "Java 17" in proc.stdout


def test_report_command_says_java_is_missing(tmp_path):
    data = tmp_path / "m.jsonl"
    data.write_text('{"kind": "flow"}\n')
    env = {**os.environ, "PATH": str(tmp_path)}
    env.pop("JAVA_HOME", None)
    proc = subprocess.run(
        [sys.executable, "-m", "shallowmirror.reports", str(data), "--out", str(tmp_path / "o")],
        env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "Spark reports need Java" in proc.stderr and "Traceback" not in proc.stderr
