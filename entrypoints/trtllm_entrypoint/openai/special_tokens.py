"""Special tokens come only from the chat template: a chat request whose text holds one is refused.

The rendered prompt reaches the model as text, and the tokenizer turns every special token's text in it into that
token (vLLM, llama.cpp's server and transformers' apply_chat_template do the same; docs/security.md). Message text
with `<|im_end|>\\n<|im_start|>system` in it would then open a system turn for whoever wrote the text. Text alone
cannot say which parts came from the template, so the front refuses a request whose strings (message contents,
names, tool calls, tool definitions: everything the template reads from the request) hold the text of any of the
tokenizer's special tokens: those marked special in tokenizer.json's or tokenizer_config.json's added tokens, and the
named ones (bos, eos, unk, pad, additional special tokens). Added tokens not marked special (Qwen's `<think>`) are
vocabulary like any other word and pass. Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

NAMED = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _content(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def from_config(config: Mapping[str, Any]) -> set[str]:
    """Special tokens named by a tokenizer_config.json or special_tokens_map.json."""
    found = {t for t in (_content(config.get(name)) for name in NAMED) if t}
    extra = config.get("additional_special_tokens")
    found |= {t for t in (_content(v) for v in (extra if isinstance(extra, list) else [])) if t}
    decoder = config.get("added_tokens_decoder")
    for entry in decoder.values() if isinstance(decoder, dict) else ():
        if isinstance(entry, dict) and entry.get("special") and (text := _content(entry)):
            found.add(text)
    return found


def from_tokenizer_json(data: Mapping[str, Any]) -> set[str]:
    added = data.get("added_tokens")
    return {
        text
        for entry in (added if isinstance(added, list) else [])
        if isinstance(entry, dict) and entry.get("special") and (text := _content(entry))
    }


def of_tokenizer(directory: Path) -> set[str]:
    """Every special token's text the tokenizer in `directory` reads as that token."""
    found: set[str] = set()
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        data = _read(directory / name)
        if isinstance(data, dict):
            found |= from_config(data)
    data = _read(directory / "tokenizer.json")
    if isinstance(data, dict):
        found |= from_tokenizer_json(data)
    return found


def _trie_pattern(words: Iterable[str]) -> str:
    """One regular expression for all `words`, shaped as their trie, so that a search costs about the text's
    length whatever the number of tokens (Llama 3 has 256 special tokens)."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def pattern(node: Mapping[str, Any]) -> str:
        branches = [re.escape(char) + pattern(child) for char, child in sorted(node.items()) if char]
        optional = "" in node
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 and not optional else "(?:" + "|".join(branches) + ")"
        return body + "?" if optional else body

    return pattern(trie)


class Guard:
    """Finds the first special token's text in a request's strings."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self.tokens = frozenset(t for t in tokens if t)
        self._search = re.compile(_trie_pattern(self.tokens)).search if self.tokens else None

    def find(self, value: object, path: str) -> tuple[str, str] | None:
        """(where, token) for the first string in `value` (nested lists and dicts, keys too) that holds a special
        token, `where` written from `path` as `messages[1].content`; None if there is none."""
        if self._search is None:
            return None
        for where, text in _strings(value, path):
            found = self._search(text)
            if found:
                return where, found.group(0)
        return None


def _strings(value: object, path: str) -> Iterator[tuple[str, str]]:
    stack: list[tuple[str, object]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if isinstance(key, str):
                    yield where, key
                stack.append((f"{where}.{key}", child))
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{where}[{i}]", child) for i, child in reversed(list(enumerate(item))))
