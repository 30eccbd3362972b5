"""A directory that looks to the entrypoint like the inside of one of our images, and how tests and benchmarks run
the entrypoint in it (`trtllm-entrypoint prepare|serve|…` as its own process, with the NVIDIA doubles of tests/doubles
on PATH / PYTHONPATH)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import realtriton
from harness.doubles import double_environ, install_doubles, without_caller_variables
from harness.image_data import write_image_data
from harness.tiny_checkpoint import tiny_llama
from harness.upstream_files import upstream_path
from trtllm_images import matrix

REPO = Path(__file__).resolve().parents[1]
# The admin key tests and benchmarks give the real server.
KEY = "admin-key-for-tests-0123456789"

# Every template set of the upstream layout (harness/upstream_files.py), with the matrix tag whose TensorRT-LLM is
# closest to it.
TEMPLATE_SETS = [
    ("v0.7.0", "24.04"),
    ("v0.8.0", "24.04"),
    ("v0.12.0", "24.08"),
    ("v0.13.0", "24.09"),
    ("v0.17.0", "25.01"),
    ("v0.19.0", "25.05"),
    ("triton_backend", "26.07"),
]


def templates_for(name: str) -> Path:
    return upstream_path(
        "tensorrt_llm/triton_backend/all_models" if name == "triton_backend" else f"tensorrtllm_backend/{name}"
    )


def records(record_dir: Path, program: str) -> list[dict]:
    path = record_dir / f"{program}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class Image:
    """A directory that looks to the entrypoint like the inside of one of our images for `tag`."""

    def __init__(
        self,
        root: Path,
        tag: str,
        templates: Path | None,
        *,
        trtllm_version: str | None = None,
        tokenizer: str = "wordlevel",
    ):
        entry = matrix.load().get(tag)
        self.root, self.tag = root, tag
        self.records = root / "records"
        self.paths = install_doubles(
            root / "doubles",
            trtllm_version=trtllm_version or entry.tensorrt_llm,
            tensorrt_version=entry.tensorrt or "0",
            with_app=True,
            templates_src=templates,
        )
        matrix_file = write_image_data(root / "etc")
        self.model = tiny_llama(root / "models" / "tiny", tokenizer)  # tiny_checkpoint's tokenizer shapes
        self.cache = root / "cache"
        self.repo = root / "repository"
        self.templates = self.paths["app"] / "all_models"
        env = without_caller_variables(double_environ(self.paths, self.records))
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "entrypoints"), env["PYTHONPATH"]])
        env.update(
            MATRIX_TAG=tag,
            TRTLLM_MATRIX_FILE=str(matrix_file),
            TRTLLM_APP_DIR=str(self.paths["app"]),
            CACHE_DIR=str(self.cache),
            REPOSITORY_DIR=str(self.repo),
            MODEL_ID=str(self.model),
        )
        self.env = env

    def start(self, *args: str, **overrides: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "trtllm_entrypoint", *args],
            env={**self.env, **overrides},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def run(self, *args: str, **overrides: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "trtllm_entrypoint", *args],
            env={**self.env, **overrides},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def prebuilt(self, world_size: int = 1) -> Path:
        """An engine of this image's TensorRT-LLM under root/engines/prebuilt, with the tokenizer beside it."""
        engine = self.root / "engines" / "prebuilt"
        engine.mkdir(parents=True, exist_ok=True)
        config = {
            "version": matrix.load().get(self.tag).tensorrt_llm,
            "build_config": {"max_batch_size": 8},
            "pretrained_config": {"mapping": {"world_size": world_size}},
        }
        (engine / "config.json").write_text(json.dumps(config))
        for rank in range(world_size):
            (engine / f"rank{rank}.engine").write_bytes(b"engine")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (engine / name).write_bytes((self.model / name).read_bytes())
        return engine

    def builds(self) -> int:
        return len(records(self.records, "trtllm-build"))

    def published(self) -> list[Path]:
        engines = self.cache / "engines"
        return sorted(p for p in engines.iterdir() if (p / "stamp.json").exists()) if engines.exists() else []


def prepared_argv(img: Image, key: str | None = None, **env: str) -> list[str]:
    """prepare's command line, with the key it leaves out put back (what `serve` execs)."""
    ports = {name: str(realtriton.free_port()) for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT")}
    keyed = {"TRITON_ADMIN_KEY": key} if key else {}
    result = img.run("prepare", **{"WORKFLOW": "engine", **keyed, **ports, **env})
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["argv"]
    return realtriton.with_admin_key(argv, key) if key else argv
