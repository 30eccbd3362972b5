"""The served model's tokenizer in the front, the one place it is loaded: prompt text to ids as upstream's
preprocessing model makes them (the ids the engine gets, and `usage`'s count), a rendered chat's ids as
transformers' apply_chat_template(tokenize=True) makes them, ids to text as its postprocessing
model decodes them (detokenize.Codec), a prompt given as ids back to text, and the end and pad ids the engine stops
and pads with.

Hugging Face's `tokenizers` reads tokenizer.json directly, which is what transformers' fast tokenizers run; a model
without one (a slow, SentencePiece-only or custom tokenizer) goes through transformers, loaded the way the
preprocessing model loads it (legacy=False, left padding, the repository's own code allowed). Imported only by the
front's processes.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_entrypoint.openai import logprobs
from trtllm_entrypoint.openai.detokenize import Codec

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@dataclass(frozen=True)
class Tokenizer:
    encode: Callable[[str], list[int]]  # with the special tokens the preprocessing model adds (add_special_tokens)
    encode_chat: Callable[[str], list[int]]  # a rendered chat: none added (its template wrote the ones it wants)
    codec: Codec  # decoding, with the served skip_special_tokens
    end_id: int  # the eos token's id: the engine stops there (the end_id the preprocessing model sends)
    pad_id: int  # the pad token's, else the eos token's (as the preprocessing model)
    decode_kept: Callable[[Sequence[int]], str]  # decoding that keeps special tokens (a prompt's own ids)
    vocab_size: int  # added tokens included
    token_bytes: logprobs.TokenBytes  # a token's own bytes: what chat's logprobs show of it
    bos_added: str | None = None  # the BOS token's text where encoding with special tokens puts it first
    end_ids: frozenset[int] = frozenset()  # every id that ends the model's turn: end_id and generation_config's

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def chat_text(self, rendered: str) -> str:
        """A rendered chat for a model that encodes text itself adding special tokens (the LLM API does): without
        the template's leading BOS where the tokenizer adds one, so the model sees it once."""
        if self.bos_added and rendered.startswith(self.bos_added):
            return rendered[len(self.bos_added) :]
        return rendered

    def decode_prompt_ids(self, ids: Sequence[int]) -> str:
        """A prompt given as token ids, as text (special tokens kept, no cleanup: the text that encodes back to
        them); an id outside the vocabulary is a ValueError naming it and the range."""
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the model's vocabulary (0 to {self.vocab_size - 1})")
        return self.decode_kept(ids)


def _token(config: Mapping[str, Any], name: str) -> str | None:
    value = config.get(name)
    if isinstance(value, dict):  # an AddedToken as tokenizer_config.json writes it
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def load(directory: Path, *, skip_special_tokens: bool = True, add_special_tokens: bool = True) -> Tokenizer:
    """The tokenizer of a model directory (tokenizer.json, tokenizer_config.json, special_tokens_map.json), with the
    end ids of generation_config.json."""
    found = _load(directory, skip_special_tokens, add_special_tokens)
    return dataclasses.replace(found, end_ids=frozenset({found.end_id, *generation_end_ids(directory)}))


def generation_end_ids(directory: Path) -> list[int]:
    """generation_config.json's `eos_token_id`, an int or a list of them (Llama 3 Instruct lists <|eot_id|> beside
    the tokenizer's eos, Gemma <end_of_turn>): where a model's authors say its turn ends. Anything else is ignored."""
    value = _read_json(directory / "generation_config.json").get("eos_token_id")
    values = value if isinstance(value, list) else [value]
    return [i for i in values if isinstance(i, int) and not isinstance(i, bool)]


def _load(directory: Path, skip_special_tokens: bool, add_special_tokens: bool) -> Tokenizer:
    config = {**_read_json(directory / "special_tokens_map.json"), **_read_json(directory / "tokenizer_config.json")}
    path = directory / "tokenizer.json"
    if not path.is_file():
        return _load_transformers(directory, skip_special_tokens, add_special_tokens)
    import tokenizers  # noqa: PLC0415  (lazy: only the front's processes tokenize)

    fast = tokenizers.Tokenizer.from_file(str(path))
    eos = _token(config, "eos_token")
    end_id = fast.token_to_id(eos) if eos else None
    if end_id is None:
        raise ValueError(f"{directory}: no eos_token in tokenizer_config.json or special_tokens_map.json")
    pad = _token(config, "pad_token")
    pad_id = fast.token_to_id(pad) if pad else None
    bos = _token(config, "bos_token")

    def encode(text: str) -> list[int]:
        # encode_batch releases the GIL while it works (encode holds it): the loop streams on meanwhile (cpu.py)
        return list(fast.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)

    def encode_chat(text: str) -> list[int]:
        return list(fast.encode_batch([text], add_special_tokens=False)[0].ids)

    def decode(ids: Sequence[int]) -> str:
        return str(fast.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def decode_kept(ids: Sequence[int]) -> str:
        return str(fast.decode(list(ids), skip_special_tokens=False))

    spec = _read_json(path)
    model = spec.get("model") or {}
    added_tokens = fast.get_added_tokens_decoder()
    added = {i: token.content for i, token in added_tokens.items()}
    return Tokenizer(
        encode=encode,
        encode_chat=encode_chat,
        codec=Codec(
            decode=decode,
            cleanup=_cleans_up(config, str(model.get("type", ""))),
            byte_tokens=byte_tokens(fast.get_vocab()) if model.get("byte_fallback") else {},
            skipped=frozenset(i for i, token in added_tokens.items() if token.special and skip_special_tokens),
        ),
        end_id=end_id,
        pad_id=end_id if pad_id is None else pad_id,
        decode_kept=decode_kept,
        vocab_size=fast.get_vocab_size(with_added_tokens=True),
        token_bytes=logprobs.token_bytes(fast.id_to_token, added, spec.get("decoder")),
        bos_added=_bos_added(bos, fast.token_to_id(bos) if bos else None, fast.encode("").ids),
    )


def _bos_added(bos: str | None, bos_id: int | None, empty: Sequence[int]) -> str | None:
    """`bos` where the ids of an empty text encoded with special tokens (`empty`) start with its id."""
    return bos if bos is not None and bos_id is not None and list(empty[:1]) == [bos_id] else None


def _cleans_up(config: Mapping[str, Any], model_type: str) -> bool:
    """Whether decoding applies clean_up_tokenization_spaces, as the transformers beside the front (the backend's)
    decodes: as the config says (False when it is silent, transformers' default since 4.45), except that
    transformers 5 ignores it for BPE models (it strips spaces before punctuation) unless forced."""
    if not config.get("clean_up_tokenization_spaces", False):
        return False
    if model_type == "BPE" and _transformers_major() >= 5:
        return bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False))
    return True


def _transformers_major() -> int:
    try:
        return int(importlib.metadata.version("transformers").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 0


def byte_tokens(vocab: Mapping[str, int]) -> dict[int, int]:
    """The byte-fallback tokens (`<0xXX>`): id -> the byte."""
    return {
        i: int(token[3:5], 16) for token, i in vocab.items() if isinstance(token, str) and _BYTE_TOKEN.fullmatch(token)
    }


def _load_transformers(directory: Path, skip_special_tokens: bool, add_special_tokens: bool) -> Tokenizer:
    import transformers  # noqa: PLC0415

    slow = transformers.AutoTokenizer.from_pretrained(
        str(directory), legacy=False, padding_side="left", trust_remote_code=True
    )
    eos = slow.eos_token
    if eos is None:
        raise ValueError(f"{directory}: the tokenizer has no eos_token")
    end_id = slow.encode(eos, add_special_tokens=False)[0]
    pad_id = slow.encode(slow.pad_token, add_special_tokens=False)[0] if slow.pad_token else end_id

    def encode(text: str) -> list[int]:
        return list(slow.encode(text, add_special_tokens=add_special_tokens))

    def encode_chat(text: str) -> list[int]:
        return list(slow.encode(text, add_special_tokens=False))

    def decode(ids: Sequence[int]) -> str:
        return str(slow.decode(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False))

    def decode_kept(ids: Sequence[int]) -> str:
        return str(slow.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))

    return Tokenizer(
        encode=encode,
        encode_chat=encode_chat,
        codec=Codec(
            decode=decode,
            cleanup=bool(getattr(slow, "clean_up_tokenization_spaces", False)),
            byte_tokens=byte_tokens(slow.get_vocab()),
            skipped=frozenset(slow.all_special_ids) if skip_special_tokens else frozenset(),
        ),
        end_id=end_id,
        pad_id=pad_id,
        decode_kept=decode_kept,
        vocab_size=len(slow),
        token_bytes=logprobs.token_bytes(
            lambda i: str(slow.convert_ids_to_tokens(i)),
            {i: str(token) for i, token in slow.added_tokens_decoder.items()},
            {"type": "ByteLevel"} if hasattr(slow, "byte_decoder") else None,  # GPT-2's slow tokenizers
        ),
        bos_added=_bos_added(slow.bos_token, slow.bos_token_id, slow.encode("", add_special_tokens=True)),
    )
