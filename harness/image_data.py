"""The data files build.py bakes into every image (matrix.json with capabilities, models.json), for tests that play
the inside of an image without building one."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import fields
from pathlib import Path

from trtllm_entrypoint.config.image_facts import ImageFacts
from trtllm_entrypoint.config.records import DERIVED_FROM, EngineSpec
from trtllm_entrypoint.config.variables import VARIABLES
from trtllm_images import matrix, model_support

# The facts of a 25.05 image (both workflows, the OpenAI frontend, /app): what the unit tests of settings, launch and
# the repository run against.
FACTS = ImageFacts(
    tag="25.05",
    tensorrt_llm="0.19.0",
    tensorrt="10.9.0.34",
    triton="2.58.0",
    workflows=("engine", "llmapi"),
    engine_deprecated=False,
    openai_frontend=True,
    app_dir=Path("/app"),
)

# The engine spec of a start that sets none of its variables: the variable table's defaults.
ENGINE_DEFAULTS = {
    f.name: f.default if DERIVED_FROM in f.metadata else VARIABLES[f.name.upper()].default for f in fields(EngineSpec)
}


def write_image_data(directory: Path, the_matrix: matrix.Matrix | None = None) -> Path:
    """Write matrix.json and models.json into `directory`; return the matrix file (for TRTLLM_MATRIX_FILE)."""
    matrix_json, models_json = model_support.image_data(the_matrix or matrix.load())
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "models.json").write_text(models_json)
    matrix_file = directory / "matrix.json"
    matrix_file.write_text(matrix_json)
    return matrix_file


@functools.cache
def _data_dir() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="trtllm-image-data-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    write_image_data(directory)
    return directory


def image_facts(tag: str, app_dir: Path = Path("/app")):
    """The container side's ImageFacts for an image of `tag`, read from the real data files (matrix.yaml and
    capabilities.yaml), as load_facts reads them inside the image."""
    from trtllm_entrypoint.config.image_facts import load_facts

    return load_facts(
        {"MATRIX_TAG": tag, "TRTLLM_MATRIX_FILE": str(_data_dir() / "matrix.json"), "TRTLLM_APP_DIR": str(app_dir)}
    )


def model_table():
    """The container side's ModelTable from the real models.yaml."""
    from trtllm_entrypoint.model import support as models

    return models.load(_data_dir() / "models.json")
