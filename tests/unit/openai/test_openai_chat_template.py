"""The tokenizer's chat template (openai/chat_template.py): found where Hugging Face keeps it and rendered with the
variables its templates read; a template's own refusal, and a tokenizer without one, are 400s."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("jinja2")
pytest.importorskip("msgspec")

from trtllm_entrypoint.openai import chat_template  # noqa: E402
from trtllm_entrypoint.openai.protocol import ApiError  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]


def test_chat_templates_as_hugging_face_writes_them():
    config = {
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
             "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"},
        ],
        "bos_token": {"content": "<s>", "lstrip": False},
    }  # fmt: skip
    template = chat_template.ChatTemplate(
        chat_template.template_source(config, None), chat_template.special_tokens(config)
    )
    assert template.render(MESSAGES) == "<s>[user]hi[assistant]"
    assert template.render(MESSAGES, add_generation_prompt=False) == "<s>[user]hi"
    assert chat_template.template_source({}, "from the file") == "from the file"


def test_a_templates_refusal_and_a_missing_template_are_400s_naming_messages():
    strict = chat_template.ChatTemplate("{{ raise_exception('roles must alternate') }}", {})
    with pytest.raises(ApiError, match="roles must alternate") as refused:
        strict.render(MESSAGES)
    with pytest.raises(ApiError, match="no chat_template") as missing:
        chat_template.ChatTemplate(chat_template.template_source({}, None), {}).render(MESSAGES)
    assert (refused.value.status, refused.value.param, missing.value.status) == (400, "messages", 400)


def test_load_reads_the_config_first_then_the_file_beside_it(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("file:{{ messages[0]['content'] }}")
    assert chat_template.load(tmp_path).render(MESSAGES) == "file:hi"
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "config:{{ eos_token }}", "eos_token": "</s>"})
    )
    assert chat_template.load(tmp_path).render(MESSAGES) == "config:</s>"
    assert chat_template.load(tmp_path / "missing").template is None
