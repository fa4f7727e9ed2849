"""README stays true: its configuration reference is the one the settings tables generate."""

from pathlib import Path

from shallowmirror.cli.info import readme_with_reference

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_configuration_reference_is_current():
    text = README.read_text()
    assert readme_with_reference(text) == text, (
        "README's configuration reference is stale: run "
        "`.venv/bin/shallowmirror info --write-readme README.md`"
    )


def test_readme_quick_start_has_the_two_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_write_readme_names_a_file_it_cannot_use(tmp_path):
    """A missing file, a folder, a binary file or one without the block: one line naming it
    and status 1 (each said 'unexpected ... (this is a bug)' before)."""
    import re
    import subprocess
    import sys

    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    plain = tmp_path / "plain.md"
    plain.write_text("# no block here\n")
    for path, reason in ((tmp_path / "missing.md", "cannot read .*: No such file"),
                         (tmp_path, "cannot read .*: Is a directory"),
                         (binary, "cannot read .*: not a UTF-8 text file"),
                         (plain, "has no configuration reference block")):
        done = subprocess.run([sys.executable, "-m", "shallowmirror", "info", "--write-readme",
                               str(path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        assert re.match(rf"shallowmirror info: .*{reason}", done.stderr), done.stderr
        assert "Traceback" not in done.stderr and "bug" not in done.stderr
    assert plain.read_text() == "# no block here\n"
    current = tmp_path / "README.md"
    current.write_text(README.read_text())
    done = subprocess.run([sys.executable, "-m", "shallowmirror", "info", "--write-readme",
                           str(current)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (
        0, f"the configuration reference in {current} is up to date")
