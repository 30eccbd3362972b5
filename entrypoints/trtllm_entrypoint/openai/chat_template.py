"""The tokenizer's chat template: found (tokenizer_config.json's `chat_template`, or chat_template.jinja beside it)
and rendered by jinja2's sandbox with the variables Hugging Face templates read."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from trtllm_entrypoint.openai.protocol import ApiError


class ChatTemplate:
    def __init__(self, source: str | None, special_tokens: Mapping[str, str]) -> None:
        import jinja2  # noqa: PLC0415  (lazy: only the front's processes render templates)
        import jinja2.sandbox  # noqa: PLC0415

        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda value, indent=None: msgspec.json.format(
            msgspec.json.encode(value), indent=indent or 0
        ).decode()
        self.template = env.from_string(source) if source else None
        self.special_tokens = dict(special_tokens)

    def render(self, messages: list[dict[str, object]], add_generation_prompt: bool = True) -> str:
        if self.template is None:
            raise ApiError(
                400,
                "this model's tokenizer has no chat_template: use /v1/completions, or serve a model with one",
                "messages",
            )
        import jinja2  # noqa: PLC0415

        try:
            return self.template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, tools=None, **self.special_tokens
            )
        except jinja2.TemplateError as exc:
            raise ApiError(400, f"the chat template refused the messages: {exc}", "messages") from None


def template_source(config: Mapping[str, Any], beside: str | None) -> str | None:
    """tokenizer_config.json's chat_template (a string, or a list of named ones: `default`), else the file's."""
    found = config.get("chat_template")
    if isinstance(found, list):
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("default")
    return found if isinstance(found, str) else beside


def special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """bos_token, eos_token … as strings (tokenizer_config.json writes them as strings or AddedToken dicts)."""
    out = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def load(tokenizer_dir: Path) -> ChatTemplate:
    """The template of the tokenizer in `tokenizer_dir` (one without a template answers chat with a 400)."""
    config_path = tokenizer_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    beside = tokenizer_dir / "chat_template.jinja"
    source = template_source(config, beside.read_text() if beside.is_file() else None)
    return ChatTemplate(source, special_tokens(config))
