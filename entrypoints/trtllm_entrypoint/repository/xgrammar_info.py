"""The tokenizer-info file TensorRT-LLM's C++ backend needs for guided decoding (its `xgrammar_tokenizer_info_path`
parameter): the model's vocabulary in id order, the tokenizer's own JSON, and the stop token, as one JSON object
{"encoded_vocab": [...], "tokenizer_str": "...", "stop_token_ids": [...]} — what the backend's model_instance_state.cc
reads (tensorrtllm_backend v0.19.0, and TensorRT-LLM's triton_backend after it) and what upstream's
examples/generate_xgrammar_tokenizer_info.py writes with transformers.

Made here from tokenizer.json and tokenizer_config.json with the standard library (the entrypoint imports no
transformers): the vocabulary is the model's plus the added tokens, ordered by id, as a fast tokenizer's get_vocab()
gives it; the stop token is the tokenizer's eos_token. A model without tokenizer.json (a slow-only tokenizer) has no
such file: guided decoding then stays off, and the front says why.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FILE_NAME = "xgrammar_tokenizer_info.json"
SOURCES = ("tokenizer.json", "tokenizer_config.json")


class NoTokenizerInfo(Exception):
    """Why a model's tokenizer gives no tokenizer info (guided decoding stays off)."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise NoTokenizerInfo(f"{path.name} cannot be read: {exc}") from None


def vocabulary(tokenizer: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, int]:
    """token -> id: the model's vocabulary, then the added tokens (tokenizer.json's, then tokenizer_config.json's)."""
    model = tokenizer.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, Mapping):  # BPE, WordPiece, WordLevel
        tokens = {str(token): int(i) for token, i in vocab.items()}
    elif isinstance(vocab, list):  # Unigram (SentencePiece): [piece, score] at its id
        tokens = {str(entry[0]): i for i, entry in enumerate(vocab)}
    else:
        raise NoTokenizerInfo(f"tokenizer.json has no vocabulary this reader knows (model type {model.get('type')!r})")
    for added in tokenizer.get("added_tokens") or ():
        tokens[str(added["content"])] = int(added["id"])
    for i, added in (config.get("added_tokens_decoder") or {}).items():
        tokens.setdefault(str(added["content"]), int(i))
    return tokens


def _token_text(value: object) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def tokenizer_info(tokenizer_dir: Path) -> dict[str, Any]:
    """The tokenizer-info object for the model's tokenizer, or NoTokenizerInfo saying why there is none."""
    tokenizer_path = tokenizer_dir / "tokenizer.json"
    try:
        text = tokenizer_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NoTokenizerInfo(f"{tokenizer_dir} has no tokenizer.json (a fast tokenizer's file)") from None
    try:
        tokenizer = json.loads(text)
    except ValueError as exc:
        raise NoTokenizerInfo(f"tokenizer.json is not JSON: {exc}") from None
    config = _read_json(tokenizer_dir / "tokenizer_config.json") or {}
    tokens = vocabulary(tokenizer, config)
    eos = _token_text(config.get("eos_token"))
    if eos is None or eos not in tokens:
        raise NoTokenizerInfo(f"tokenizer_config.json's eos_token {eos!r} is not a token of tokenizer.json")
    return {
        "encoded_vocab": [token for token, _ in sorted(tokens.items(), key=lambda item: item[1])],
        "tokenizer_str": text,
        "stop_token_ids": [tokens[eos]],
    }


def source_digest(tokenizer_dir: Path) -> str:
    """What the file depends on (the two tokenizer files' bytes), to key it in the cache."""
    digest = hashlib.sha256()
    for name in SOURCES:
        path = tokenizer_dir / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"(absent)")
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def ensure(root: Path, tokenizer_dir: Path) -> Path:
    """The file for this tokenizer under root/<digest of its files>/, written once (atomically: a reader never sees
    half of it; a concurrent writer of the same bytes only replaces it with the same); NoTokenizerInfo when the
    tokenizer gives none."""
    dest = root / source_digest(tokenizer_dir) / FILE_NAME
    if dest.is_file():
        try:
            json.loads(dest.read_text(encoding="utf-8"))
            return dest
        except (OSError, ValueError):
            pass  # a damaged file: written again below
    info = tokenizer_info(tokenizer_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(info, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, dest)
    return dest


FEATURE = "guided_decoding"  # capabilities.yaml: the backend's models take a guide per request


def guided_off(features: tuple[str, ...], workflow: str, tag: str, first_tag: str | None, problem: str | None) -> str:
    """Why the served model takes no guided decoding guide, as the front's 400 says it ("" when it does): the
    workflow, the tag's capability, or the tokenizer-info file that could not be made (`problem`)."""
    way_out = f"the first tag that serves it is {first_tag}" if first_tag else "no tag of this matrix serves it"
    if workflow != "engine":
        return f"the {workflow} workflow's model takes no per-request guide; serve with WORKFLOW=engine ({way_out})"
    if FEATURE not in features:
        return f"tag {tag}'s backend models declare no guided decoding inputs; {way_out}"
    if problem:
        return f"the backend needs the model's tokenizer info for it, and {problem}"
    return ""
