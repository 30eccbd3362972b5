"""The front's chat templates (openai/chat_template.py): the environment they render in, each feature against
transformers' own renderer, what a template refuses, and a refused chat as a 400."""

from __future__ import annotations

import json
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest
import tokenizers
import transformers

from tests import factories
from trtllm_entrypoint.openai import chat_template as ct

USER = [{"role": "user", "content": "hi"}]


tokenizer = factories.tokenizer_dir


def both(template: str, messages: list[dict[str, Any]] = USER, **kwargs: Any) -> tuple[str, str]:
    """The same template rendered by transformers and by the front."""
    theirs = transformers.utils.chat_template_utils.render_jinja_template(
        conversations=[messages], chat_template=template, **kwargs
    )[0][0]
    found = ct.Found({ct.DEFAULT: template}, "test", {})
    variables = {k: v for k, v in kwargs.items() if k not in ("tools", "documents", "add_generation_prompt")}
    mine = ct.ChatTemplate(found).render(
        messages,
        tools=kwargs.get("tools"),
        documents=kwargs.get("documents"),
        add_generation_prompt=kwargs.get("add_generation_prompt", False),
        variables=variables,
    )
    return theirs, mine


# --- the environment -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        # loop controls (Command R7B, Command A)
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content }}|"
        "{% if loop.index > 1 %}{% break %}{% endif %}{% endfor %}",
        # the generation tag (Phi-4-reasoning, SmolLM3, LFM2.5), with whitespace control inside
        "{% for m in messages %}<{{ m.role }}>{% generation %}{{ m.content }}{% endgeneration %}\n{%- endfor %}",
        "{%- generation -%}  {{ messages[0].content }}  {%- endgeneration -%}",
        # trim_blocks and lstrip_blocks
        "  {% for m in messages %}\n    {{ m.content }}\n  {% endfor %}\n",
        # tojson and its keyword arguments (GLM, MiniMax, Seed-OSS), never HTML-escaped, never ASCII by default
        "{{ messages | tojson }}|{{ messages | tojson(indent=2) }}|{{ messages | tojson(ensure_ascii=True) }}|"
        "{{ messages | tojson(separators=(',', ':'), sort_keys=True) }}|{{ '<a & b>' | tojson }}",
        # dict() and namespace()
        "{% set d = dict(a=1, b=messages[0].role) %}{{ d.b }}{% set ns = namespace(n=0) %}"
        "{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
        # variables the request can pass, the special tokens, tools and documents
        "{{ bos_token }}{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
        "{{ tools | length if tools else 'none' }}{{ documents[0].title if documents else '' }}{{ eos_token }}",
        # undefined names render as nothing, as in transformers
        "{{ nothing }}{{ messages[0].missing }}{% if add_generation_prompt %}A:{% endif %}",
    ],
)
def test_the_environment_renders_as_transformers(template):
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": 'Ça va ? 東京 🗼 "quoted" <tag> & more'},
        {"role": "assistant", "content": "yes"},
    ]
    kwargs = {
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "documents": [{"title": "T", "text": "x"}],
        "add_generation_prompt": True,
        "enable_thinking": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
    }
    theirs, mine = both(template, messages, **kwargs)
    assert mine == theirs


def test_strftime_now_is_today():
    theirs, mine = both("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}")
    assert mine == theirs
    assert mine.startswith(datetime.now().strftime("%d %b %Y"))


def test_a_message_reads_as_transformers_hands_it_over():
    """Null values dropped (OpenAI's `content: null` beside tool_calls), reasoning under each of its names."""
    template = (
        "{% for m in messages %}{{ m.content is defined }}/{{ m.reasoning_content }}/{{ m.thinking }}/"
        "{{ m | list | join(',') }};{% endfor %}"
    )
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "assistant", "content": "a", "reasoning": "r"},
        {"role": "assistant", "content": "b", "thinking": "t"},
    ]
    found = ct.Found({ct.DEFAULT: template}, "test", {})
    theirs = hf_render(template, messages)
    assert ct.ChatTemplate(found).render(messages, add_generation_prompt=False) == theirs


def hf_render(template: str, messages: list[dict[str, Any]]) -> str:
    """transformers' apply_chat_template (whose message normalization runs there, not in render_jinja_template)."""
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
        chat_template=template,
    )
    return fast.apply_chat_template(messages, tokenize=False)


@pytest.mark.parametrize(
    ("template", "refusal"),
    [
        ("{{ raise_exception('Conversation roles must alternate') }}", "Conversation roles must alternate"),
        ("{{ messages[0].content + 1 }}", "TypeError"),
        ("{{ ''.__class__.__mro__ }}", "unsafe"),  # the sandbox
        ("{% set ns = namespace() %}{% set ns._hidden = 1 %}", "private name"),
        ("{{ messages.append(1) }}", "unsafe"),  # the immutable sandbox: the request's messages stay as they are
    ],
)
def test_what_a_template_refuses_is_one_error_naming_why(template, refusal):
    with pytest.raises(ct.ChatTemplateError, match=refusal):
        ct.ChatTemplate(ct.Found({ct.DEFAULT: template}, "test", {})).render(USER)


def test_a_template_that_does_not_compile_names_its_file_and_line(tmp_path):
    path = tokenizer(tmp_path, {}, {"chat_template.jinja": "line one\n{% for m in messages %}\n{{ m }}\n"})
    with pytest.raises(ct.ChatTemplateError, match=r"chat_template.jinja does not compile: .*endfor.*\(line \d\)"):
        ct.ChatTemplate(ct.discover(path))


@pytest.mark.parametrize(
    ("templates", "refusal"),
    [
        (
            {ct.DEFAULT: "{{ raise_exception('Conversation roles must alternate') }}"},
            "Conversation roles must alternate",
        ),
        ({}, "has no chat_template"),
    ],
)
def test_a_refused_chat_is_a_400_naming_messages(templates, refusal):
    from trtllm_entrypoint.openai import chat  # noqa: PLC0415
    from trtllm_entrypoint.openai.protocol import ApiError, ChatRequest, decode  # noqa: PLC0415
    from trtllm_entrypoint.openai.special_tokens import Guard  # noqa: PLC0415
    from trtllm_entrypoint.openai.structured import Support  # noqa: PLC0415

    template = ct.ChatTemplate(ct.Found(templates, "test", {}))
    served = SimpleNamespace(template=template, max_generations=256, special=Guard(()), support=Support(None))
    request = decode(json.dumps({"model": "m", "messages": USER}).encode(), ChatRequest)
    with pytest.raises(ApiError, match=refusal) as refused:
        chat.work(served, request)  # type: ignore[arg-type]
    assert (refused.value.status, refused.value.param) == (400, "messages")
