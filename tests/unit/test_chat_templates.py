"""Where chat templates and special tokens are found (chat_templates.py), each layout against transformers'
AutoTokenizer; malformed and hostile files as one UsageError; and the start check the entrypoint runs with the
front's Python (exit 2, one line, for a template that does not compile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import transformers

from tests import factories
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.model import chat_templates as ct

tokenizer = factories.tokenizer_dir


def hf(directory: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(directory))


# --- discovery -------------------------------------------------------------------------------------------------------

LAYOUTS: dict[str, tuple[dict[str, Any] | None, dict[str, Any]]] = {
    "in tokenizer_config.json": ({"chat_template": "CONFIG"}, {}),
    "chat_template.jinja wins over the config's": ({"chat_template": "CONFIG"}, {"chat_template.jinja": "JINJA"}),
    "named list": (
        {"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]},
        {},
    ),
    "chat_template.jinja and additional_chat_templates/": (
        {"chat_template": "CONFIG"},
        {"chat_template.jinja": "JINJA", "additional_chat_templates/tool_use.jinja": "TOOLS"},
    ),
    "no template": ({}, {}),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_template_found_is_transformers_choice(layout, tmp_path):
    config, files = LAYOUTS[layout]
    path = tokenizer(tmp_path, config, files)
    found = ct.discover(path)
    theirs = hf(path).chat_template
    assert (dict(found.templates) or None) == ({ct.DEFAULT: theirs} if isinstance(theirs, str) else theirs)
    for tools in (None, [{"type": "function", "function": {"name": "f"}}]):
        if found.templates:
            assert found.select(tools) == hf(path).get_chat_template(tools=tools)


def test_a_processor_template_is_read_when_nothing_else_has_one(tmp_path):
    """transformers' tokenizer ignores chat_template.json (its processor reads it); vLLM falls back to it, and so does
    the front: a multimodal model whose only template is the processor's still chats."""
    path = tokenizer(tmp_path, {}, {"chat_template.json": {"chat_template": "PROCESSOR"}})
    assert ct.discover(path).templates == {ct.DEFAULT: "PROCESSOR"}
    assert ct.discover(path).origin.endswith("chat_template.json")
    beside = tokenizer(tmp_path / "both", {"chat_template": "CONFIG"}, {"chat_template.json": {"chat_template": "P"}})
    assert ct.discover(beside).templates == {ct.DEFAULT: "CONFIG"} and hf(beside).chat_template == "CONFIG"


def test_named_templates_without_a_default_refuse_a_chat_without_tools(tmp_path):
    path = tokenizer(
        tmp_path, {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "rag", "template": "R"}]}
    )
    found = ct.discover(path)
    assert found.select([{}]) == "T"
    with pytest.raises(ct.ChatTemplateError, match="rag, tool_use.*no `default`.*no tools"):
        found.select(None)
    with pytest.raises(ValueError, match="no default"):  # transformers refuses it too
        hf(path).get_chat_template()


TOKEN_LAYOUTS: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "config": ({"bos_token": "<s>", "eos_token": {"content": "</s>", "__type": "AddedToken", "lstrip": False}}, None),
    "only special_tokens_map.json": ({}, {"bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>"}),
    "the map wins over the config": ({"bos_token": "<s>", "eos_token": "</s>"}, {"eos_token": "<unk>"}),
    "not with added_tokens_decoder": (
        {
            "bos_token": "<s>",
            "added_tokens_decoder": {
                "1": {"content": "<s>", "special": True, "lstrip": False, "rstrip": False, "normalized": False}
            },
        },
        {"eos_token": "</s>", "pad_token": "<unk>"},
    ),
    "nulls and the model's own tokens": ({"bos_token": "<s>", "pad_token": None, "image_token": "<unk>"}, None),
    "named extra tokens": (
        {"bos_token": "<s>", "image_token": "</s>", "extra_special_tokens": {"image_token": "<unk>", "a_token": "<s>"}},
        None,
    ),
    "listed extra tokens are not named": ({"bos_token": "<s>", "extra_special_tokens": ["<unk>"]}, {"x_token": 5}),
}


@pytest.mark.parametrize("layout", sorted(TOKEN_LAYOUTS))
def test_the_special_tokens_are_transformers(layout, tmp_path):
    config, token_map = TOKEN_LAYOUTS[layout]
    files = {} if token_map is None else {"special_tokens_map.json": token_map}
    path = tokenizer(tmp_path, {**config, "chat_template": "x"}, files)
    found = ct.discover(path)
    assert dict(found.special_tokens) == hf(path).special_tokens_map
    assert found.special_tokens  # every layout here has some


@pytest.mark.parametrize(
    ("files", "complaint"),
    [
        ({"tokenizer_config.json": {"chat_template": 7}}, 'expected "chat_template" to be a string or a list'),
        ({"tokenizer_config.json": {"chat_template": [{"name": "default"}]}}, "a list of"),
        ({"tokenizer_config.json": "[1]"}, "expected a JSON object"),
        ({"tokenizer_config.json": "{"}, "expected JSON"),
        ({"chat_template.json": {"chat_template": {"a": 1}}}, "chat_template.json is not allowed"),
    ],
)
def test_a_malformed_file_is_one_usage_error_naming_it(files, complaint, tmp_path):
    tmp_path.mkdir(exist_ok=True)
    for name, content in files.items():
        (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(UsageError, match=complaint) as refused:
        ct.discover(tmp_path)
    assert "\n" not in str(refused.value)


def test_a_template_file_that_is_not_text_or_not_a_file_is_refused(tmp_path):
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(UsageError, match="expected UTF-8 text"):
        ct.discover(tmp_path)
    (tmp_path / "chat_template.jinja").unlink()
    os.mkfifo(tmp_path / "chat_template.jinja")  # opened without blocking, and refused
    with pytest.raises(UsageError, match="expected a regular file, found a FIFO"):
        ct.discover(tmp_path)


# --- the start check -------------------------------------------------------------------------------------------------


def front_env() -> dict[str, str]:
    entrypoints = str(Path(ct.__file__).parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([entrypoints, os.environ.get("PYTHONPATH", "")])}


@pytest.mark.process
def test_the_check_passes_a_real_template_and_refuses_one_that_does_not_compile(tmp_path):
    good = tokenizer(tmp_path / "good", {"chat_template": "{% for m in messages %}{% break %}{% endfor %}"})
    assert (
        ct.check_with(good, sys.executable, front_env())
        == f"chat template default from {good}/tokenizer_config.json compiles"
    )
    none = tokenizer(tmp_path / "none", {})
    assert ct.check_with(none, sys.executable, front_env()) == f"no chat template in {none}"
    bad = tokenizer(tmp_path / "bad", {}, {"chat_template.jinja": "{% if messages %}{{ x }"})
    run = subprocess.run(
        [sys.executable, "-m", "trtllm_entrypoint.openai.chat_template", "--check", str(bad)],
        env=front_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and f"{bad}/chat_template.jinja does not compile" in run.stderr
    with pytest.raises(UsageError, match="chat_template.jinja does not compile") as refused:
        ct.check_with(bad, sys.executable, front_env())
    assert "\n" not in str(refused.value)


@pytest.mark.process
def test_without_jinja2_the_check_says_the_front_cannot_render(tmp_path):
    path = tokenizer(tmp_path, {"chat_template": "{{ x }}"})
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "jinja2.py").write_text("raise ImportError('No module named jinja2')\n")
    env = {**front_env(), "PYTHONPATH": os.pathsep.join([str(blocker), front_env()["PYTHONPATH"]])}
    with pytest.raises(UsageError, match="cannot render chat templates: No module named jinja2"):
        ct.check_with(path, sys.executable, env)
