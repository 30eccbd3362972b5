"""Lay out the NVIDIA doubles of tests/doubles the way an NGC TensorRT-LLM image has the real programs, under one
root directory.

    root/bin/{tritonserver,trtllm-build,mpirun,nvidia-smi}      put on PATH
    root/site/{tensorrt_llm,tensorrt}[-<v>.dist-info]            put on PYTHONPATH (importlib.metadata sees them)
    root/app/{all_models,tools,examples}                         the NGC /app layout (with_app=True)

The Python models Triton runs are upstream's own model.py files wherever the stored upstream set has them (every
tensorrtllm_backend release); our doubles from python_models_double/ stand in only where it has none (the
TensorRT-LLM >= 0.20 snapshot, templates only).

It also reads back what the doubles recorded (`read_records`).

Every program is a tiny wrapper that runs a `*_double.py` script from `scripts_dir`: the repo's tests/doubles on the
host, or wherever the stand-in image copies them (the wrappers must stay valid after being copied elsewhere).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from trtllm_images.capabilities import LAYOUTS
from trtllm_images.model_support import load_models

# The doubles themselves live under tests/doubles (a double is test code and says so in its name); this installs them.
DOUBLES_DIR = Path(__file__).resolve().parents[1] / "tests" / "doubles"

PROGRAMS = {
    "tritonserver": "tritonserver_double.py",
    "trtllm-build": "trtllm_build_double.py",
    "mpirun": "mpirun_double.py",
    "nvidia-smi": "nvidia_smi_double.py",
}
PYTHON_MODEL_DOUBLES = DOUBLES_DIR / "python_models_double"


def examples() -> dict[str, str]:
    """Every converter models.yaml names, in both examples layouts (TensorRT-LLM <= 0.19 and >= 0.20), the
    quantization script and the LoRA adapter converter: path under the app dir -> the double that plays it."""
    paths = {
        f"{model.converter_dir(layout)}/convert_checkpoint.py": "convert_checkpoint_double.py"
        for model in load_models()
        if model.engine is not None
        for layout in LAYOUTS
    }
    return {
        **dict(sorted(paths.items())),
        "examples/quantization/quantize.py": "quantize_double.py",
        "examples/hf_lora_convert.py": "hf_lora_convert_double.py",
    }


def wrapper_text(script: str) -> str:
    return (
        "#!/usr/bin/env python3\n"
        "# trtllm-images test double: runs the double script below under this program's name.\n"
        "import runpy\n"
        f"runpy.run_path({script!r}, run_name='__main__')\n"
    )


def write_wrapper(path: Path, script: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(wrapper_text(script))
    path.chmod(0o755)
    return path


def write_distribution(site: Path, name: str, version: str) -> Path:
    """A package `name` whose __version__ and dist-info both say `version`, as a real install would."""
    package = site / name
    package.mkdir(parents=True, exist_ok=True)
    init = package / "__init__.py"
    init.write_text(
        f'"""Test double of the {name} package: versions only, no functionality."""\n__version__ = {version!r}\n'
    )
    dist_info = site / f"{name}-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: trtllm-images test double\n"
    )
    (dist_info / "INSTALLER").write_text("trtllm-images-doubles\n")
    files = [f"{name}/__init__.py", *(f"{dist_info.name}/{f}" for f in ("METADATA", "INSTALLER", "RECORD"))]
    (dist_info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    return package


def write_app(app: Path, scripts_dir: str, templates_src: Path | None) -> Path:
    for relative, script in examples().items():
        write_wrapper(app / relative, f"{scripts_dir}/{script}")
    (app / "tools").mkdir(parents=True, exist_ok=True)
    if templates_src is not None:
        shutil.copytree(templates_src, app / "all_models", dirs_exist_ok=True)
        complete_templates(app / "all_models")
    return app


def python_model_doubles(all_models: Path) -> list[str]:
    """The Python models (`<workflow>/<model>`) of an `all_models` directory that have no model.py of upstream's and
    so run our double: none for a backend release's complete set, every one for the TensorRT-LLM >= 0.20 snapshot
    (templates only)."""
    return [
        str(config.parent.relative_to(all_models))
        for config in sorted(all_models.glob("*/*/config.pbtxt"))
        if (PYTHON_MODEL_DOUBLES / config.parent.relative_to(all_models) / "1" / "model.py").is_file()
        and not (config.parent / "1" / "model.py").exists()
    ]


def python_models_origin(all_models: Path) -> str:
    """One line for test output and stand-in labels: whose Python models a repository filled from `all_models` runs."""
    doubles = python_model_doubles(all_models)
    return f"doubles for {', '.join(doubles)}" if doubles else "upstream's"


def complete_templates(all_models: Path) -> None:
    """Add what a backend checkout may lack: each model's version directory `1/` (Triton loads no model without
    one) and, where a Python model's model.py is missing, our double of it
    (python_models_double/<workflow>/<model>/1/model.py)."""
    doubles = set(python_model_doubles(all_models))
    for config in sorted(all_models.glob("*/*/config.pbtxt")):
        model = config.parent.relative_to(all_models)
        (config.parent / "1").mkdir(exist_ok=True)
        if str(model) in doubles:
            shutil.copyfile(PYTHON_MODEL_DOUBLES / model / "1" / "model.py", config.parent / "1" / "model.py")


def install_doubles(
    root: Path,
    *,
    trtllm_version: str,
    tensorrt_version: str,
    with_app: bool,
    templates_src: Path | None,
    scripts_dir: str | None = None,
) -> dict[str, Path]:
    """Create bin/, site/ and (with_app) app/ under `root`; return {"bin", "site", "app"?: path}.

    `templates_src` is an `all_models` directory (holding inflight_batcher_llm/ …); `scripts_dir` is where the
    wrappers find the *_double.py scripts at run time (default: this directory).
    """
    scripts = scripts_dir or str(DOUBLES_DIR)
    paths = {"bin": root / "bin", "site": root / "site"}
    for program, script in PROGRAMS.items():
        write_wrapper(paths["bin"] / program, f"{scripts}/{script}")
    write_distribution(paths["site"], "tensorrt_llm", trtllm_version)
    write_distribution(paths["site"], "tensorrt", tensorrt_version)
    if with_app:
        paths["app"] = write_app(root / "app", scripts, templates_src)
    return paths


# Variables of the caller's shell that would change what the entrypoint does, or leak a token into a run: the tests
# and the benchmarks start it without them and set what they mean to.
CALLER_VARIABLES = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_FILE",
    "MODEL_ID",
    "ENGINE_DIR",
    "CACHE_DIR",
    "REPOSITORY_DIR",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "TRITON_ADMIN_KEY",
    "TRITON_ADMIN_KEY_FILE",
    "RESTRICTED_APIS",
    "TRITON_ARGS",
    "LOG_FORMAT",
)


def without_caller_variables(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in CALLER_VARIABLES}


def double_environ(paths: dict[str, Path], record_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which the doubles shadow the real programs and packages, recording into `record_dir`."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(paths["bin"]), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(paths["site"]), env.get("PYTHONPATH", "")) if p)
    env["DOUBLE_RECORD_DIR"] = str(record_dir)
    return env


def read_records(directory: Path, program: str) -> list[dict]:
    """Every recorded invocation of `program` in `directory`, oldest first ([] when it never ran)."""
    path = Path(directory) / f"{program}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
