"""Exact text from streamed token ids: the text of every answer, whole or streamed, is the tokenizer's decoding of
all its ids at once, and the streamed pieces add up to it.

Decoding one token alone loses what depends on its neighbours: SentencePiece's word-start `▁` becomes a space only
after another token (the decoder strips the first one), a character outside the vocabulary comes as several byte
tokens (`<0xF0><0x9F><0x98><0x80>`, or byte-level BPE's partial bytes) that decode to `�` until the last arrives,
and transformers' `clean_up_tokenization_spaces` joins " ." into "." across tokens. So each step decodes a short
window of ids that starts before the new ones (vLLM's detokenizer does the same with prefix and read offsets) and
sends only the part of the window's text that can no longer change:

    prefix = decode(ids[start:read])      the text already sent, decoded with the same left context
    window = decode(ids[start:])          the same, plus the new tokens
    send window[len(prefix):]             once it ends in a complete character

A byte-fallback decoder reads a run of `<0xXX>` tokens as a whole (text outside the vocabulary: CJK, emoji), so the
window ends at the run's last complete character while the run is open: each character goes out once its last byte
comes, not when the run ends. A run that later proves invalid UTF-8 is written as one `�` per byte by the decoder;
the characters already sent stand for their bytes and the rest of the run follows as `�` (as vLLM resets its decode
stream there): the only case where the pieces differ from the decoding of all ids at once.

Pure and synchronous: the front's worker feeds it the ids of each streamed response.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

REPLACEMENT = "\ufffd"  # what UTF-8 decoding with replacement gives for bytes that are not (yet) a character

# transformers' clean_up_tokenization_spaces, in its order (PreTrainedTokenizerBase.clean_up_tokenization).
CLEANUPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)
_CLEANUP_PREFIXES = frozenset(old[:n] for old, _ in CLEANUPS for n in range(1, len(old)))


def clean_up(text: str) -> str:
    for old, new in CLEANUPS:
        text = text.replace(old, new)
    return text


@dataclass(frozen=True)
class Codec:
    """What the detokenizer needs of a tokenizer.

    decode: ids -> text with the served skip_special_tokens, without transformers' cleanup (`cleanup` says whether
    the tokenizer applies it after decoding); byte_tokens: the byte-fallback tokens (`<0xXX>`, id -> byte), whose
    decoder joins a run of them (skipped special tokens do not end one) before reading UTF-8, and writes `�` for
    every byte of a run that is not valid as a whole."""

    decode: Callable[[Sequence[int]], str]
    cleanup: bool = False
    byte_tokens: Mapping[int, int] = field(default_factory=dict)
    skipped: frozenset[int] = frozenset()  # the special tokens that decode leaves out (skip_special_tokens)

    def text(self, ids: Sequence[int]) -> str:
        """The tokenizer's own decoding of `ids` as a whole."""
        text = self.decode(ids)
        return clean_up(text) if self.cleanup else text


class _Cleaner:
    """transformers' cleanup applied to streamed text. Every pattern starts with a space and is at most 4 characters
    long, so text cut where none of the 3 characters before the cut is a space cleans up the same in two parts as
    in one: text is sent up to the last such cut, or whole when its end cannot begin a pattern."""

    def __init__(self) -> None:
        self.held = ""

    def feed(self, text: str) -> str:
        text = self.held + text
        end = len(text)
        if any(text[-n:] in _CLEANUP_PREFIXES for n in (1, 2, 3) if n <= end):
            end = next((k for k in range(end - 1, 0, -1) if " " not in text[max(0, k - 3) : k]), 0)
        self.held = text[end:]
        return clean_up(text[:end])

    def flush(self) -> str:
        held, self.held = self.held, ""
        return clean_up(held)


class _Run:
    """The run of byte tokens at the end of the ids so far: where it starts, where its last complete character
    ends, and whether its bytes are still valid UTF-8 (strictly, as the decoder reads them)."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.cut = start  # the ids before this one end with a complete character of the run
        self.valid = True
        self._utf8 = codecs.getincrementaldecoder("utf-8")()

    def feed(self, byte: int, at: int) -> None:
        if not self.valid:
            return
        try:
            if self._utf8.decode(bytes((byte,))):
                self.cut = at + 1
        except UnicodeDecodeError:
            self.valid = False

    @property
    def whole(self) -> bool:
        """Valid UTF-8 as a whole if it ended here."""
        return self.valid and not self._utf8.getstate()[0]


@dataclass
class IncrementalDetokenizer:
    """Token ids in, text out: `push(new_ids)` returns the text that is final now (maybe ""), `finish()` the rest.
    The concatenation of everything returned equals `codec.text(all ids)` (but for a byte run that proves invalid
    after some of its characters went out: see the module's docstring)."""

    codec: Codec
    ids: list[int] = field(default_factory=list)
    start: int = 0  # the window's first id: left context for the decoder
    read: int = 0  # ids before this one are sent
    prefix: str = ""  # decode(ids[start:read])
    sent: list[str] = field(default_factory=list)  # the raw (pre-cleanup) pieces sent, for finish()'s check
    run: _Run | None = None  # the open run of byte tokens (byte-fallback tokenizers)
    _cleaner: _Cleaner | None = None

    def __post_init__(self) -> None:
        if self.codec.cleanup:
            self._cleaner = _Cleaner()

    def push(self, new_ids: Sequence[int]) -> str:
        if not new_ids:
            return ""
        at = len(self.ids)
        self.ids.extend(new_ids)
        if not self.codec.byte_tokens:
            return self._advance(len(self.ids))
        text = ""
        for k in range(at, len(self.ids)):
            byte = self.codec.byte_tokens.get(self.ids[k])
            if byte is not None:
                if self.run is None:
                    self.run = _Run(k)
                self.run.feed(byte, k)
            elif self.run is not None and self.ids[k] not in self.codec.skipped:
                text += self._close(k)
        if self.run is None:
            end = len(self.ids)
        else:  # up to the run's last complete character; none of a run already invalid (all `�` once it ends)
            end = self.run.cut if self.run.valid else self.run.start
        return text + self._advance(end)

    def _advance(self, end: int) -> str:
        """Sends what ids[:end] make final."""
        if end <= self.read:
            return ""
        window = self.codec.decode(self.ids[self.start : end])
        if len(window) <= len(self.prefix) or window.endswith(REPLACEMENT) or not window.startswith(self.prefix):
            return ""  # nothing new, a character not yet complete, or the decoder still rewrites the prefix
        piece = window[len(self.prefix) :]
        # The next window starts at the first id just sent, unless those ids decode to nothing (skipped special
        # tokens, a lone `▁` that the decoder strips): a window must begin with text, or a decoder that strips its
        # first space would drop the space of the word after them.
        sent_now = self.codec.decode(self.ids[self.read : end])
        if sent_now:
            self.start, self.prefix = self.read, sent_now
        else:
            self.prefix = window
        self.read = end
        return self._emit(piece)

    def _close(self, end: int) -> str:
        """The open run ends before ids[end]. If it proves invalid after some of its characters were sent, the
        decoder now writes `�` for each of its bytes: the characters sent stand for their bytes, the rest of the
        run is sent as the decoder writes it, and the window starts again at the run."""
        run, self.run = self.run, None
        if run is None or run.whole or self.read <= run.start:
            return ""
        run_text = self.codec.decode(self.ids[run.start : end])
        if run_text.startswith(self.codec.decode(self.ids[run.start : self.read])):
            return ""  # a decoder that keeps the valid characters of an invalid run: nothing was rewritten
        sent_bytes = sum(1 for i in self.ids[run.start : self.read] if i in self.codec.byte_tokens)
        self.start, self.prefix, self.read = run.start, run_text, end
        return self._emit(run_text[sent_bytes:])

    def finish(self) -> str:
        """The rest: what was held (an incomplete character, a byte run, a cleanup tail), so that the whole text is
        the decoding of all ids at once."""
        text = self._close(len(self.ids))
        raw = "".join(self.sent)
        whole = self.codec.decode(self.ids)
        if whole.startswith(raw):
            rest = whole[len(raw) :]
        else:  # the decoder rewrote text already sent (a byte run proved invalid): send what the window adds
            window = self.codec.decode(self.ids[self.start :])
            rest = window[len(self.prefix) :] if window.startswith(self.prefix) else ""
        self.read = len(self.ids)
        if rest:
            text += self._emit(rest)
        if self._cleaner is not None:
            text += self._cleaner.flush()
        return text

    def _emit(self, raw: str) -> str:
        self.sent.append(raw)
        return self._cleaner.feed(raw) if self._cleaner is not None else raw


class CumulativeText:
    """The llmapi model's streamed text: each response holds the whole text so far (TensorRT-LLM's LLM API
    detokenizes; its Triton model sends `output.text`, not `text_diff`), so a piece is what a response adds. The LLM
    API applies clean_up_tokenization_spaces to each new piece alone, which leaves " 's" or " n't" split across two
    pieces: where the tokenizer cleans up (`cleanup`), the pieces are cleaned up again as a whole."""

    def __init__(self, cleanup: bool = False) -> None:
        self.text = ""
        self._cleaner = _Cleaner() if cleanup else None

    def push(self, text: str) -> str:
        if not text.startswith(self.text):  # never seen: the LLM API only appends; keep what was sent
            return ""
        piece, self.text = text[len(self.text) :], text
        return self._cleaner.feed(piece) if self._cleaner is not None and piece else piece

    def finish(self) -> str:
        return self._cleaner.flush() if self._cleaner is not None else ""
