"""Tokenizers in the shapes real models ship, built here with the `tokenizers` library (no hub access): tests and the
tiny checkpoint use them so that text paths meet what users' models do to spaces and to characters outside the
vocabulary.

- `sentencepiece(style)`: SentencePiece BPE as converted to tokenizer.json, `▁` for word starts and `<0xXX>` byte
  tokens for what the vocabulary lacks (byte fallback). Styles: "llama2" (normalizer prepends and replaces, decoder
  Replace/ByteFallback/Fuse/Strip: Llama 2, TinyLlama, Mistral <= v0.2), "metaspace" (Metaspace pre-tokenizer with
  prepend_scheme "first", no normalizer: newer conversions such as Mistral v0.3), "gemma" (no prefix space, turn
  tokens).
- `byte_level(style)`: byte-level BPE (GPT-2's byte-to-unicode alphabet). Styles: "qwen" (ChatML special tokens, no
  BOS) and "llama3" (a BOS added by the post-processor).
- `TiktokenStyle`: a raw-bytes vocabulary decoded as tiktoken does (bytes joined, then UTF-8 with replacement), for
  code that takes any encode/decode pair.

The vocabularies are trained on CORPUS, whose alphabet holds ASCII and a few accents: emoji, CJK and the other
accents of TEXTS come out as several tokens each.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

SPM = "\u2581"  # ▁, SentencePiece's word-start mark
CORPUS = (
    "What is TensorRT-LLM? TensorRT-LLM is a library for serving large language models on GPUs. "
    "The capital of France is Paris. The model answers questions, writes code and tells stories. "
    "Hello world, hello there! It's a nice day: isn't it? We're here and they've gone. "
    "Le café est très bon, et l'été arrive. Voilà une idée élégante. "
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 2024. Symbols: ( ) [ ] { } < > + - * / = _ ~ # @ $ % & | ; , . "
)
ALPHABET = sorted(set(CORPUS) | set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n\t'\"!?^`\\"))
# Texts whose tokens split characters: accents outside the alphabet, emoji (4 bytes, with joiners and variation
# selectors), CJK, runs of spaces and newlines, and stop strings' favourite material.
TEXTS = (
    "The capital of France is Paris.",
    " leading space and  double  spaces   here",
    "Le café est très bon, et l'été arrive à Noël.",
    "Ñandú, Zürich, Kraków, Ålesund, İstanbul, Đà Nẵng",
    "Emoji: 😀 👍🏽 👩‍👩‍👧 ❤️ 🇫🇷 done",
    "中文: 你好，世界。日本語: こんにちは。한국어: 안녕하세요",
    "Mixed: naïve café 😀 中 ok\nnew line\n\n  indented\ttab",
    "Hello , world ! It 's fine . They 're here , we 've gone .",
    "a",
    "",
)


def _train_bpe(pre_tokenizer: Any, alphabet: list[str], vocab_size: int, special: list[str]) -> tuple[dict, list]:
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.train_from_iterator([CORPUS] * 20, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges


@functools.cache
def _spm_model() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """SentencePiece's vocabulary layout: <unk> <s> </s>, the 256 byte tokens, then pieces and merges."""
    vocab, merges = _train_bpe(
        pre_tokenizers.Metaspace(replacement=SPM, prepend_scheme="always", split=True),
        [SPM if c == " " else c for c in ALPHABET if c not in "\n\t"],
        600,
        [],
    )
    layout = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    pieces = sorted(vocab, key=vocab.__getitem__)
    ordered = layout + [p for p in pieces if p not in layout]
    return {piece: i for i, piece in enumerate(ordered)}, merges


def sentencepiece(style: str = "llama2") -> tokenizers.Tokenizer:
    vocab, merges = _spm_model()
    specials = ["<unk>", "<s>", "</s>"]
    if style == "gemma":
        vocab = dict(vocab)
        for token in ("<pad>", "<start_of_turn>", "<end_of_turn>"):
            vocab[token] = len(vocab)
        specials += ["<pad>", "<start_of_turn>", "<end_of_turn>"]
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    tok = tokenizers.Tokenizer(model)
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in specials])
    bos = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    if style == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPM), normalizers.Replace(" ", SPM)])
        tok.decoder = decoders.Sequence(
            [decoders.Replace(SPM, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        tok.post_processor = bos
    elif style == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPM, prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence(
            [decoders.Replace(SPM, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        tok.post_processor = bos
    elif style == "gemma":
        tok.normalizer = normalizers.Replace(" ", SPM)
        tok.decoder = decoders.Sequence([decoders.Replace(SPM, " "), decoders.ByteFallback(), decoders.Fuse()])
        tok.post_processor = bos
    else:
        raise ValueError(f"unknown SentencePiece style {style!r}")
    return tokenizers.Tokenizer.from_str(tok.to_str())  # as a served tokenizer.json loads


BYTE_LEVEL_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>")


@functools.cache
def _byte_level_model() -> tuple[dict[str, int], list[tuple[str, str]]]:
    return _train_bpe(
        pre_tokenizers.ByteLevel(add_prefix_space=False),
        pre_tokenizers.ByteLevel.alphabet(),
        700,
        list(BYTE_LEVEL_SPECIALS),
    )


def byte_level(style: str = "qwen") -> tokenizers.Tokenizer:
    vocab, merges = _byte_level_model()
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in BYTE_LEVEL_SPECIALS])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if style == "llama3":
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    elif style == "qwen":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        raise ValueError(f"unknown byte-level style {style!r}")
    return tokenizers.Tokenizer.from_str(tok.to_str())


class TiktokenStyle:
    """tiktoken's way: every token is raw bytes (GPT-2's byte-level vocabulary, unmapped), a decode joins them and
    reads UTF-8 with replacement."""

    def __init__(self) -> None:
        inner = byte_level("qwen")
        self._inner = inner
        byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        self.tokens: dict[int, bytes] = {}
        for token, i in inner.get_vocab().items():
            if token in BYTE_LEVEL_SPECIALS:
                self.tokens[i] = token.encode()
            else:
                self.tokens[i] = bytes(byte_of[c] for c in token)
        self.special = {inner.token_to_id(s) for s in BYTE_LEVEL_SPECIALS}

    def encode(self, text: str) -> list[int]:
        return list(self._inner.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        kept = [i for i in ids if not (skip_special_tokens and i in self.special)]
        return b"".join(self.tokens[i] for i in kept).decode("utf-8", errors="replace")


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (what ByteLevel vocabularies are written in)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


SHAPES: dict[str, dict[str, Any]] = {
    # tokenizer_config.json for each shape, as the real ones write it (special tokens, cleanup, template-free).
    "llama2": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "clean_up_tokenization_spaces": False,
               "tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "add_eos_token": False},
    "metaspace": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                  "clean_up_tokenization_spaces": False, "tokenizer_class": "LlamaTokenizerFast"},
    "gemma": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
              "clean_up_tokenization_spaces": False, "tokenizer_class": "GemmaTokenizerFast"},
    "qwen": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
             "clean_up_tokenization_spaces": False, "tokenizer_class": "Qwen2TokenizerFast"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": True,
               "tokenizer_class": "PreTrainedTokenizerFast"},
}  # fmt: skip


def tokenizer_of(shape: str) -> tokenizers.Tokenizer:
    return byte_level(shape) if shape in ("qwen", "llama3") else sentencepiece(shape)


def write_tokenizer(dest: Path, shape: str, **config: Any) -> Path:
    """tokenizer.json, tokenizer_config.json (SHAPES[shape] updated with `config`) and special_tokens_map.json of
    one shape into `dest` (made if missing); returns dest."""
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer_of(shape).save(str(dest / "tokenizer.json"))
    settings = {**SHAPES[shape], "model_max_length": 4096, **config}
    (dest / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    special = {k: v for k, v in settings.items() if k.endswith("_token") and isinstance(v, str)}
    (dest / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    return dest
