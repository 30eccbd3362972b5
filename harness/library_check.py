"""Run by a library env's Python (harness/library_envs.py): what the OpenAI front's tokenizer and chat-template code
makes of fixed inputs under that env's tokenizers and transformers (jinja2: the vendored one), as one JSON object.
The tests compare it across every env: the same inputs must give the same answers under every release line.

    <env python> harness/library_check.py TOKENIZER_DIR SLOW_TOKENIZER_DIR
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

# Shaped like real models' templates: a system message hoisted out of the loop, role checks that raise, whitespace
# control, a namespace counter, tojson, and the generation prompt.
TEMPLATES = {
    "header-style": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
        "{% set messages = messages[1:] %}{% else %}{% set system = 'You are helpful.' %}{% endif %}"
        "<|start|>system<|sep|>{{ system | trim }}<|end|>\n"
        "{% for message in messages %}<|start|>{{ message['role'] }}<|sep|>{{ message['content'] | trim }}<|end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|start|>assistant<|sep|>{% endif %}"
    ),
    "alternating": (
        "{% set ns = namespace(turns=0) %}{{ bos_token }}{% for message in messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{% if message['role'] == 'user' %}{% set ns.turns = ns.turns + 1 %}[INST] {{ message['content'] }} [/INST]"
        "{% else %} {{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
        "{{ '' if add_generation_prompt else '' }}<!-- {{ ns.turns }} turns, {{ messages | length }} messages -->"
    ),
    "json-args": "{% for m in messages %}{{ m | tojson }}\n{% endfor %}",
}
MESSAGES = [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": "What is TensorRT-LLM?"},
    {"role": "assistant", "content": "A library."},
    {"role": "user", "content": 'And "Triton"? é ü'},
]
TEXTS = ["What is TensorRT-LLM?", "What is TensorRT-LLM? What is TensorRT-LLM?", ""]


def main(tokenizer_dir: Path, slow_dir: Path) -> dict[str, object]:
    from trtllm_entrypoint.openai import chat_template, tokenizer

    out: dict[str, object] = {
        "versions": {
            name: importlib.metadata.version(name)
            for name in ("huggingface_hub", "tokenizers", "transformers", "jinja2")
        },
        "python": ".".join(map(str, sys.version_info[:2])),
    }
    fast = tokenizer.load(tokenizer_dir)
    slow = tokenizer.load(slow_dir)
    out["tokens_fast"] = [fast.count(text) for text in TEXTS]
    out["tokens_slow"] = [slow.count(text) for text in TEXTS]
    specials = {"bos_token": "<s>", "eos_token": "</s>"}
    rendered: dict[str, str] = {}
    for name, source in TEMPLATES.items():
        found = chat_template.Found(templates={"default": source}, origin=name, special_tokens=specials)
        template = chat_template.ChatTemplate(found)
        try:
            rendered[name] = template.render(MESSAGES)
        except chat_template.ChatTemplateError as exc:
            rendered[name] = f"refused: {exc}"
        rendered[name + "/no-system"] = template.render(MESSAGES[1:2]) if name != "json-args" else ""
    out["templates"] = rendered
    from_dir = chat_template.load(tokenizer_dir)
    out["template_from_files"] = from_dir.render(MESSAGES[1:2]) if from_dir.found.templates else None
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2])), sort_keys=True))
