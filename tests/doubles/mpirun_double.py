#!/usr/bin/env python3
"""Stand-in for `mpirun`: records the command, splits the MPMD app contexts on ':', and (MPIRUN_DOUBLE_EXEC=1, the
default) execs the first context's program so a rank-0 tritonserver double runs in the foreground as it would."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from double_records import record  # noqa: E402

# How many words each mpirun option takes after it; an option not listed is a switch.
_VALUES = {
    "-n": 1,
    "-np": 1,
    "--np": 1,
    "-x": 1,
    "--map-by": 1,
    "--bind-to": 1,
    "-host": 1,
    "--host": 1,
    "-H": 1,
    "-wdir": 1,
    "--wdir": 1,
    "--mca": 2,
}


def app_contexts(args: list[str]) -> list[list[str]]:
    contexts, current = [], []
    for arg in args:
        if arg == ":":
            contexts.append(current)
            current = []
        else:
            current.append(arg)
    contexts.append(current)
    return [c for c in contexts if c]


def program_of(context: list[str]) -> list[str]:
    """The command line after mpirun's own options (`-n 1 --allow-run-as-root prog args` -> `prog args`)."""
    i = 0
    while i < len(context) and context[i].startswith("-"):
        i += 1 + _VALUES.get(context[i], 0)
    return context[i:]


def main(argv: list[str]) -> int:
    contexts = app_contexts(argv)
    programs = [program_of(c) for c in contexts]
    record("mpirun", argv, contexts=contexts, programs=programs)
    if os.environ.get("MPIRUN_DOUBLE_EXEC", "1") != "1":
        return 0
    if not programs or not programs[0]:
        print("mpirun: error: no executable given", file=sys.stderr)
        return 1
    os.environ.update({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": str(len(programs))})
    try:
        os.execvp(programs[0][0], programs[0])
    except OSError as exc:
        print(f"mpirun: error: cannot run {programs[0][0]}: {exc}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
