"""The tensorrt_llm_bls double as upstream's BLS model starts: upstream's model.py imports torch when Triton loads
it, the double (tests/doubles/python_models_double/tensorrt_llm_bls) does not need torch. The serving benchmark
installs this file as the model's model.py and the double beside it as bls_double.py, so that a repository with
the BLS model pays the start-up cost it pays in the NGC image.
"""

import importlib.util
import os
import sys
from pathlib import Path

# torch may live in a directory of its own (BLS_DOUBLE_TORCH_SITE), out of the tokenizer models' sight.
if os.environ.get("BLS_DOUBLE_TORCH_SITE"):
    sys.path.insert(0, os.environ["BLS_DOUBLE_TORCH_SITE"])
import torch  # noqa: E402,F401  (the cost being reproduced)

_spec = importlib.util.spec_from_file_location("bls_double", Path(__file__).with_name("bls_double.py"))
_double = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_double)
TritonPythonModel = _double.TritonPythonModel
