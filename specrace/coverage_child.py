"""One scenario under coverage.py: the child ``specrace coverage`` starts per scenario.

    python -m specrace.coverage_child OUT ROOT specrace-argv...

runs ``specrace ARGV`` (``repro SCENARIO --target T ...``) in this process with
coverage.py measuring the files under ROOT (the server package: nothing else is
recorded, so the rest of the run pays only coverage.py's per-file check), then writes
``{"files": {path relative to ROOT: [executed lines]}, "status": exit status}`` to OUT
(written whole, then renamed). The command's own output is its output. greenlet and
thread concurrency are declared: the engines switch greenlets within a thread, which a
tracer that assumes one stack per thread would misattribute.
"""
from __future__ import annotations

if __name__ == "__main__":  # the signal policy before the imports, as the console has it
    from seams import signals as _signals
    _signals.install()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import List  # noqa: E402


def run(out: str, root: str, argv: List[str]) -> int:
    try:
        import coverage
    except ImportError:
        print("specrace: error: coverage.py is not installed here (requirements.txt)",
              file=sys.stderr)
        return 2
    root = os.path.realpath(root)
    cov = coverage.Coverage(data_file=None, source=[root], config_file=False,
                            concurrency=["greenlet", "thread"])
    # a package whose modules the scenario never imports is the normal case, not news
    cov.set_option("run:disable_warnings", ["module-not-imported", "no-data-collected",
                                            "module-not-measured", "already-imported"])
    cov.start()
    try:
        from specrace.cli import main
        status = main(argv)
    finally:
        cov.stop()
    data = cov.get_data()
    files = {}
    for path in sorted(data.measured_files()):
        real = os.path.realpath(path)
        if real.startswith(root + os.sep):
            rel = os.path.relpath(real, root).replace(os.sep, "/")
            files[rel] = sorted(data.lines(path) or [])
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"files": files, "status": status}, f)
    os.replace(tmp, out)
    return status


def main() -> None:
    if len(sys.argv) < 4:
        print("usage: python -m specrace.coverage_child OUT ROOT ARGV...", file=sys.stderr)
        status = 2
    else:
        status = run(sys.argv[1], sys.argv[2], sys.argv[3:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # no interpreter teardown, as the console script (its docstring)


if __name__ == "__main__":
    main()
