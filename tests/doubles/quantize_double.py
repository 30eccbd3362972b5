#!/usr/bin/env python3
"""Stand-in for TensorRT-LLM's `examples/quantization/quantize.py`: like convert_checkpoint, plus --qformat."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from convert_checkpoint_double import write_checkpoint  # noqa: E402
from double_records import last, parse_flags  # noqa: E402
from help_flags import parse_or_exit  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    parse_or_exit("quantize", args)
    qformat = last(parse_flags(args), "qformat", "full_prec")
    sys.exit(write_checkpoint("quantize", args, {"quantization": {"quant_algo": qformat.upper()}}))
