"""Chat's `logprobs`: one entry per generated token, as OpenAI's answers carry them, with the token's own text and
bytes (not the text pieces the detokenizer sends: a character of several tokens, or text held for a stop string, is
one piece but several tokens, each with its log-probability).

A token's bytes are what it adds to the text: byte-level BPE's vocabulary writes bytes as printable characters
(GPT-2's table), SentencePiece's writes a space as `▁` and bytes outside the vocabulary as `<0xXX>` tokens; a
token that is only part of a character has bytes that are no text of their own, and its `token` shows `�` there
(the `bytes` say exactly which). Special tokens are their own text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trtllm_entrypoint.openai.protocol import TokenLogprob

SPM_SPACE = "\u2581"  # SentencePiece's word-start mark
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")

TokenBytes = Callable[[int], bytes]


@functools.cache
def _byte_level_table() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte, reversed: the character a byte-level vocabulary writes -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


def _decoder_kinds(decoder: Any) -> set[str]:
    """The types of a tokenizer.json decoder, a Sequence's included."""
    if not isinstance(decoder, dict):
        return set()
    kinds = {str(decoder.get("type", ""))}
    for inner in decoder.get("decoders") or ():
        kinds |= _decoder_kinds(inner)
    return kinds


def token_bytes(token_of: Callable[[int], str | None], specials: Mapping[int, str], decoder: Any) -> TokenBytes:
    """id -> the token's bytes, from the vocabulary's token strings (`token_of`), the special tokens' contents and
    tokenizer.json's `decoder`, which says how the vocabulary writes bytes."""
    kinds = _decoder_kinds(decoder)
    byte_level = "ByteLevel" in kinds
    table = _byte_level_table()

    @functools.lru_cache(maxsize=65536)
    def of(token_id: int) -> bytes:
        if token_id in specials:
            return specials[token_id].encode()
        token = token_of(token_id) or ""
        if byte_level and all(c in table for c in token):
            return bytes(table[c] for c in token)
        byte = _BYTE_TOKEN.fullmatch(token)
        if byte:
            return bytes((int(byte.group(1), 16),))
        return token.replace(SPM_SPACE, " ").encode()

    return of


def entries(ids: Sequence[int], logprobs: Sequence[float], bytes_of: TokenBytes) -> list[TokenLogprob]:
    """One entry per id of a streamed step, with the step's log-probabilities (the engine's output_log_probs; the
    last len(ids) values where it sends more)."""
    values = logprobs[len(logprobs) - len(ids) :] if len(logprobs) > len(ids) else logprobs
    out = []
    for token_id, logprob in zip(ids, values, strict=False):
        raw = bytes_of(token_id)
        out.append(TokenLogprob(raw.decode("utf-8", errors="replace"), logprob, list(raw), []))
    return out
