"""Files and directories a command writes when its work is done (a summary, results, a report):
checked before the work starts, so a path that cannot be written is an error up front instead of
after a whole run. Each check returns the problem in the operator's words (the option and the
path) or None; the caller raises it as its own kind of error."""

from __future__ import annotations

import os
from pathlib import Path


def file_problem(path: str | os.PathLike, option: str, *, make_parent: bool = False) -> str | None:
    """Why ``path`` cannot be appended to, or None; the file is created (empty) if it was not
    there, and with ``make_parent`` its missing directories too."""
    target = Path(path)
    try:
        if make_parent and not target.parent.exists():
            target.parent.mkdir(parents=True)
        with open(target, "a"):
            pass
    except OSError as err:
        return f"{option} {path}: cannot write to it ({err.strerror or err})"
    return None


def dir_problem(path: str | os.PathLike, option: str) -> str | None:
    """Why ``path`` cannot be created or written into as a directory, or None (it is created)."""
    if Path(path).exists() and not Path(path).is_dir():
        return f"{option} {path}: is a file, not a directory"
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"{option} {path}: cannot create the directory ({err.strerror or err})"
    if not os.access(path, os.W_OK):
        return f"{option} {path}: the directory is not writable"
    return None
