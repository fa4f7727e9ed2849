"""The package as installed: version, CLI entry points, and which codec implementation is chosen."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import shallowmirror
from shallowmirror.cli.main import SUBCOMMANDS, build_parser


def _run(code_or_args: list[str], **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("SHALLOWMIRROR_PURE_PYTHON", "SHALLOWMIRROR_REQUIRE_NATIVE")}
    environment.update(env)
    return subprocess.run([sys.executable, *code_or_args], capture_output=True, text=True,
                          env=environment, timeout=60)


def test_version_is_a_release_string():
    parts = shallowmirror.__version__.split(".")
    assert len(parts) >= 2 and all(p.isdigit() for p in parts[:2])


def test_help_lists_the_written_subcommands():
    parser = build_parser()
    written = [name for name, _ in parser._subparsers._group_actions[0].choices.items()]
    assert "load" in written and "info" in written
    assert set(written) <= set(SUBCOMMANDS)
    for argv in (["-m", "shallowmirror", "--help"], ["-m", "shallowmirror.cli.main", "--help"]):
        proc = _run(argv)
        assert proc.returncode == 0, proc.stderr
        for name in written:
            assert name in proc.stdout
    proc = _run(["-m", "shallowmirror", "--version"])
    assert proc.stdout.strip() == f"shallowmirror {shallowmirror.__version__}"


def test_console_script_help():
    script = os.path.join(os.path.dirname(sys.executable), "shallowmirror")
    if not os.path.exists(script):
        pytest.skip("console script not installed in this environment")
    proc = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "load" in proc.stdout


def _implementation(**env: str) -> subprocess.CompletedProcess:
    return _run(["-c", "import shallowmirror.codec as c; print(c.IMPLEMENTATION)"], **env)


def test_native_codec_is_used_when_not_forced():
    """The native build really builds: without switches the extension, not the twin, is in use."""
    proc = _implementation()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "native"


def test_twin_is_used_when_forced():
    proc = _implementation(SHALLOWMIRROR_PURE_PYTHON="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "python"


_HIDE_NATIVE = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("shallowmirror.codec._crecords", "shallowmirror.codec._cmessages"):
            raise ImportError(f"hidden by the test: {name}", name=name)
        return None
sys.meta_path.insert(0, Hide())
import shallowmirror.codec as c
print(c.IMPLEMENTATION)
"""


def test_missing_extension_falls_back_to_the_twin():
    proc = _run(["-c", _HIDE_NATIVE])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "python"


def test_missing_extension_is_an_error_when_native_is_required():
    proc = _run(["-c", _HIDE_NATIVE], SHALLOWMIRROR_REQUIRE_NATIVE="1")
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "native codec is required" in proc.stderr and "hidden by the test" in proc.stderr


def test_both_implementations_expose_the_same_functions():
    from shallowmirror import codec
    from shallowmirror.codec import messages, records

    for name in ("split_batches", "filter_batches", "rewrite_for_produce"):
        assert callable(getattr(records, name)) and callable(getattr(codec, name))
    for name in ("decode_fetch_response", "encode_produce_request", "decode_produce_response"):
        assert callable(getattr(messages, name)) and callable(getattr(codec, name))
    if codec.IMPLEMENTATION == "native":
        from shallowmirror.codec import _cmessages, _crecords

        assert codec.split_batches is _crecords.split_batches
        assert codec.decode_fetch_response is _cmessages.decode_fetch_response


def test_the_code_is_ruff_clean():
    """What `make lint` checks, checked by `make test` too (CI runs only the latter)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "shallowmirror", "tests",
                           "benchmarks"], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
