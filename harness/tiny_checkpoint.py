"""A tiny Hugging Face-format Llama checkpoint made on the fly (no hub access here), shared by the test suites."""

from __future__ import annotations

import json
import struct
from pathlib import Path

# The tokenizer knows the words of the README's prompts, so a served tiny model answers them with real tokens.
PROMPT = "What is TensorRT-LLM?"
PROMPT_WORDS = ("What", "is", "TensorRT", "-", "LLM", "?")  # how its Whitespace pre-tokenizer splits PROMPT


def write_safetensors(path: Path, tensors: dict[str, tuple[list[int], bytes]]) -> None:
    """The safetensors format by hand: u64 little-endian header length, JSON header, then the raw F16 bytes."""
    header, offset = {}, 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(data for _, data in tensors.values()))


def tiny_llama(dest: Path, tokenizer: str = "wordlevel") -> Path:
    """A tiny Llama-architecture checkpoint in Hugging Face format (configs, tokenizer, one weight tensor).

    tokenizer: "wordlevel" (the README's prompt words, one token each, no decoder: the doubles' answers read back as
    words) or a shape of harness/tokenizers_fixture.py ("llama2": SentencePiece with `▁` and byte fallback, as Llama 2
    and TinyLlama ship; "qwen", "llama3": byte-level BPE; …), the shape real models' text paths must get right."""
    dest.mkdir(parents=True)
    vocab, hidden = 32, 16
    bos_id, eos_id = 1, 2
    if tokenizer != "wordlevel":
        from harness import tokenizers_fixture  # noqa: PLC0415  (needs `tokenizers`; the word-level maker does not)

        tokenizers_fixture.write_tokenizer(dest, tokenizer, model_max_length=256)
        shaped = tokenizers_fixture.tokenizer_of(tokenizer)
        settings = tokenizers_fixture.SHAPES[tokenizer]
        vocab = shaped.get_vocab_size()
        bos_id = shaped.token_to_id(settings["bos_token"]) if settings.get("bos_token") else None
        eos_id = shaped.token_to_id(settings["eos_token"])
    (dest / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": hidden,
                "intermediate_size": 2 * hidden,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "vocab_size": vocab,
                "max_position_embeddings": 256,
                "rms_norm_eps": 1e-5,
                "torch_dtype": "float16",
                "bos_token_id": bos_id,
                "eos_token_id": eos_id,
            },
            indent=2,
        )
    )
    write_safetensors(
        dest / "model.safetensors", {"model.embed_tokens.weight": ([vocab, hidden], bytes(2 * vocab * hidden))}
    )
    if tokenizer == "wordlevel":
        write_word_level_tokenizer(dest, vocab)
    return dest


def write_word_level_tokenizer(dest: Path, vocab: int) -> None:
    known = ["<unk>", "<s>", "</s>", *PROMPT_WORDS]
    words = {word: i for i, word in enumerate(known + [f"w{i}" for i in range(len(known), vocab)])}
    (dest / "tokenizer.json").write_text(
        json.dumps(
            {
                "version": "1.0",
                "added_tokens": [],
                "normalizer": None,
                "pre_tokenizer": {"type": "Whitespace"},
                "post_processor": None,
                "decoder": None,
                "model": {"type": "WordLevel", "vocab": words, "unk_token": "<unk>"},
            }
        )
    )
    (dest / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 256,
            }
        )
    )
    (dest / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    )
