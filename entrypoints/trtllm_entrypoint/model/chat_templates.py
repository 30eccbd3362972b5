"""Where a tokenizer's chat templates and special tokens are, found as transformers' tokenizer finds them: standard
library only, so that the entrypoint's preflight and the OpenAI front (openai/chat_template.py, which renders them)
use this one discovery.

Where transformers looks (AutoTokenizer), in order: chat_template.jinja with the named templates of
additional_chat_templates/*.jinja; else tokenizer_config.json's `chat_template` (a string, or a list of
{name, template}). The processor's legacy chat_template.json is read last, when nothing else has a template (vLLM
falls back to the processor's template the same way). Special tokens come from tokenizer_config.json, and from
special_tokens_map.json where the config has no `added_tokens_decoder` (then the map's values win), as transformers
reads them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.model.files import read_bytes, read_json_object

TEMPLATE_FILE = "chat_template.jinja"
NAMED_DIR = "additional_chat_templates"
CONFIG_FILE = "tokenizer_config.json"
PROCESSOR_FILE = "chat_template.json"
TOKENS_MAP_FILE = "special_tokens_map.json"
# The tokenizer's named special tokens (transformers' SPECIAL_TOKENS_ATTRIBUTES); other `*_token` keys holding a
# token are the model's own (e.g. image_token) and are passed too.
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
DEFAULT = "default"
CHECKER = "trtllm_entrypoint.openai.chat_template"  # `python -m` it with `--check DIR`: the front's compile check
CHECK_TIMEOUT_S = 120.0
TOOL_USE = "tool_use"  # the named template transformers picks when the request has tools


class ChatTemplateError(Exception):
    """The template cannot serve a chat: none fits the request, it does not compile, or it refused these messages."""


@dataclass(frozen=True)
class Found:
    """A tokenizer's chat templates (by name; a single one is `default`), where they came from, and the special
    tokens the templates see."""

    templates: Mapping[str, str]
    origin: str
    special_tokens: Mapping[str, str]

    def select(self, tools: object = None) -> str:
        """The template transformers renders: with several, `tool_use` when tools are given, else `default`."""
        if not self.templates:
            raise ChatTemplateError(
                "this model's tokenizer has no chat_template: use /v1/completions, or serve a model with one"
            )
        if tools is not None and TOOL_USE in self.templates:
            return self.templates[TOOL_USE]
        if DEFAULT in self.templates:
            return self.templates[DEFAULT]
        raise ChatTemplateError(
            f"this model's chat templates ({', '.join(sorted(self.templates))}, in {self.origin}) have no "
            f"`{DEFAULT}` one{' and the request has no tools' if TOOL_USE in self.templates else ''}"
        )


def _text(path: Path) -> str | None:
    data = read_bytes(path)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not allowed: expected UTF-8 text, found other bytes") from None


def _named_list(path: Path, value: object) -> dict[str, str]:
    """tokenizer_config.json's `chat_template`: a string, or a list of {"name", "template"} objects."""
    if isinstance(value, str):
        return {DEFAULT: value}
    if isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in value
    ):
        return {t["name"]: t["template"] for t in value}
    raise UsageError(
        f'{path} is not allowed: expected "chat_template" to be a string or a list of '
        '{"name": ..., "template": ...} objects'
    )


def _templates(tokenizer: Path, config: Mapping[str, Any]) -> tuple[dict[str, str], str]:
    templates: dict[str, str] = {}
    named = tokenizer / NAMED_DIR
    if named.is_dir():
        for path in sorted(named.glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = _text(path) or ""
    own = _text(tokenizer / TEMPLATE_FILE)
    if own is not None:
        templates[DEFAULT] = own
    if templates:
        return templates, str(tokenizer / (TEMPLATE_FILE if own is not None else NAMED_DIR))
    if config.get("chat_template") is not None:
        return _named_list(tokenizer / CONFIG_FILE, config["chat_template"]), str(tokenizer / CONFIG_FILE)
    processor = read_json_object(tokenizer / PROCESSOR_FILE)
    if processor is not None and processor.get("chat_template") is not None:
        return _named_list(tokenizer / PROCESSOR_FILE, processor["chat_template"]), str(tokenizer / PROCESSOR_FILE)
    return {}, ""


def _token(value: object) -> str | None:
    """A token as written: a string, or an AddedToken object ({"content": ..., ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens(config: Mapping[str, Any], tokens_map: Mapping[str, Any] | None) -> dict[str, str]:
    """The special tokens a template sees: the named ones, then the model's own `*_token` entries (and the named
    entries of a dict `extra_special_tokens`)."""
    merged = dict(config)
    if tokens_map is not None and "added_tokens_decoder" not in config:
        merged.update(tokens_map)  # the legacy file, read (and winning) only where the config lists no added tokens
    own = merged.get("extra_special_tokens")
    if isinstance(own, dict):  # named extra tokens (transformers 5), which win over a top-level entry
        merged = {**merged, **own}
    out: dict[str, str] = {}
    for name in SPECIAL_TOKENS:
        token = _token(merged.get(name))
        if token is not None:
            out[name] = token
    for name, value in merged.items():
        token = _token(value)
        if name not in out and name.endswith("_token") and token is not None:
            out[name] = token
    return out


def discover(tokenizer: Path) -> Found:
    """The chat templates and special tokens beside a tokenizer, as transformers' AutoTokenizer finds them. Every
    unreadable or malformed file is one UsageError naming it."""
    config = read_json_object(tokenizer / CONFIG_FILE) or {}
    templates, origin = _templates(tokenizer, config)
    return Found(templates, origin, special_tokens(config, read_json_object(tokenizer / TOKENS_MAP_FILE)))


def check_with(tokenizer: Path, python: str, env: Mapping[str, str]) -> str:
    """That the templates compile, checked by the front's own code run with the front's Python and environment (its
    jinja2, its path): the entrypoint never imports jinja2 itself. Returns the check's line; raises UsageError with
    its one line when they do not compile."""
    argv = [python, "-m", CHECKER, "--check", str(tokenizer)]
    try:
        done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise UsageError(f"checking the chat template in {tokenizer} took over {CHECK_TIMEOUT_S:.0f} s") from None
    lines = (done.stdout + done.stderr).strip().splitlines()
    line = lines[-1] if lines else f"exit status {done.returncode}"
    if done.returncode == 0:
        return line
    if done.returncode == UsageError.exit_code:
        raise UsageError(line)
    raise UsageError(f"the chat template in {tokenizer} could not be checked: {line}")
