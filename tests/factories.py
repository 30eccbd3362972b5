"""The values many tests need, made one way: an image's facts, settings parsed as the entrypoint parses them, and a
matrix entry. Each takes the fields a test cares about; the rest are those of a plausible image (harness.image_data's
25.05 facts, a 25.01 matrix entry)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import tokenizers

from harness.image_data import FACTS
from trtllm_entrypoint.config.image_facts import ImageFacts
from trtllm_entrypoint.config.records import CommandLine
from trtllm_entrypoint.config.settings import Settings
from trtllm_images.matrix import Backend, MatrixEntry

CACHE_DIR = "/var/cache/trtllm"  # never created: settings parse it, nothing here writes below it


def image_facts(**changes: object) -> ImageFacts:
    """harness.image_data.FACTS (a 25.05 image: both workflows, /app) with `changes`."""
    return dataclasses.replace(FACTS, **changes)  # type: ignore[arg-type]


def settings(
    facts: ImageFacts = FACTS, command_line: CommandLine | None = None, env: Mapping[str, str] = {}, **variables: str
) -> Settings:
    """Settings.from_env over CACHE_DIR=/var/cache/trtllm and the variables given (by name, or in `env`)."""
    return Settings.from_env({"CACHE_DIR": CACHE_DIR, **env, **variables}, facts, command_line or CommandLine())


def matrix_entry(**changes: object) -> MatrixEntry:
    """A supported 25.01 entry (TensorRT-LLM 0.17.0, the backend repository's v0.17.0, /app in the image)."""
    base = MatrixEntry(
        tag="25.01",
        status="supported",
        note="",
        triton="2.54.0",
        tensorrt_llm="0.17.0",
        tensorrt="10.8.0.43",
        cuda="12.8.0.038",
        python="3.12.3",
        pytorch="2.6.0a0+ecf3bae40a.nv25.1",
        ubuntu="24.04",
        backend=Backend("triton-inference-server/tensorrtllm_backend", "v0.17.0", "", True),
        workflows=("engine",),
        engine_deprecated=False,
        openai_frontend=True,
        uncertain=MappingProxyType({}),
        sources=("test",),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def tokenizer_dir(directory: Path, config: dict[str, Any] | None = None, files: dict[str, Any] | None = None) -> Path:
    """A tokenizer directory as the Hub lays it out: a tiny tokenizer.json, tokenizer_config.json, other files."""
    directory.mkdir(parents=True, exist_ok=True)
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    model.save(str(directory / "tokenizer.json"))
    if config is not None:
        (directory / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config})
        )
    for name, content in (files or {}).items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return directory


# One chat and one tool for the front's chat tests (rendered by real templates, by the front and by transformers).
SYSTEM = {"role": "system", "content": "You are a concise assistant."}
USER = {"role": "user", "content": "What is the capital of France?"}
ANSWER = {"role": "assistant", "content": "Paris."}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


# The real chat templates of tests/data/chat_templates (SOURCES.md) and each one's special tokens.
CHAT_TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
TEMPLATE_TOKENS: dict[str, dict[str, str]] = json.loads((CHAT_TEMPLATES / "special_tokens.json").read_text())


def chat_template_text(name: str) -> str:
    return (CHAT_TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
