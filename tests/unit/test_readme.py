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
