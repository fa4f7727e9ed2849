"""`python -m shallowmirror.testing.java_check`: say whether Spark's Java is usable.

`make test` runs this before pytest so a missing Java is explained once, up front, instead of
as skipped `spark` tests. It exits 0 so a machine without Java can still run the rest, except
under ``CI=true``, where Java 17 is part of the contract and its absence fails the run.
"""

from __future__ import annotations

import os

from shallowmirror.reports.spark import JavaMissingError, check_java


def main() -> int:
    try:
        info = check_java()
    except JavaMissingError as err:
        if os.environ.get("CI") == "true":
            print(f"java check: CI=true and Spark cannot run: {err}")
            return 1
        print(f"java check: Spark report tests will be skipped: {err}")
        return 0
    print(f"java check: Java {info.major} at {info.path} ({info.version_line})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
