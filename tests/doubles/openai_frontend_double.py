#!/usr/bin/env python3
"""Stand-in for Triton's OpenAI frontend (/opt/tritonserver/python/openai/openai_frontend/main.py): it is there so
that presence checks see it; it records its arguments and exits 0 without serving."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from double_records import record  # noqa: E402

if __name__ == "__main__":
    record("openai_frontend", sys.argv[1:])
    print("openai frontend double: recorded, not serving", file=sys.stderr)
    sys.exit(0)
