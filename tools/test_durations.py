"""Seconds each test file takes in each backend's pass of `make test`, from the run's `--durations=0` report.

    make test PYTEST_ARGS="--durations=0" > test.log 2>&1
    python tools/test_durations.py test.log             # writes tests/durations.json

The suite hands whole test files to its two workers (`--dist loadfile`, so that a file's module fixtures
are built once) longest first, by these figures (`tests/conftest.py`): the last file to start is then a
short one and neither worker waits long for the other at the end of a pass. The figures only order the
files; stale ones cost balance, never a result. Refresh them when files are added or change much.
"""

import argparse
import collections
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASS = re.compile(r"^=== KERAS_BACKEND=(\w+) ===$")
DURATION = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(tests/[^:\s]+\.py)::")


def file_seconds(lines):
    """`{backend: {test file: seconds}}` summed over the setup, call and teardown lines of each pass."""
    seconds, backend = {}, None
    for line in lines:
        if match := PASS.match(line.strip()):
            backend = match.group(1)
            seconds[backend] = collections.Counter()
        elif backend and (match := DURATION.match(line)):
            seconds[backend][match.group(2)] += float(match.group(1))
    if not seconds or not any(seconds.values()):
        raise ValueError("no `=== KERAS_BACKEND=... ===` pass with `--durations=0` lines in the log: run "
                         "`make test PYTEST_ARGS=\"--durations=0\"` and pass its whole output")
    return {backend: {path: round(total, 1) for path, total in sorted(files.items())}
            for backend, files in seconds.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="the output of `make test PYTEST_ARGS=\"--durations=0\"`")
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "durations.json"))
    args = parser.parse_args(argv)
    with open(args.log, encoding="utf-8", errors="replace") as f:
        seconds = file_seconds(f)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(seconds, f, indent=1, sort_keys=True)
        f.write("\n")
    for backend, files in seconds.items():
        print(f"{backend}: {len(files)} files, {sum(files.values()) / 60:.1f} worker-minutes")


if __name__ == "__main__":
    main()
