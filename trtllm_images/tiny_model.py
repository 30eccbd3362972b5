"""A tiny Hugging Face-format Llama checkpoint made on the fly, without the hub: `python build.py tiny-model --out DIR`
makes one to try the stand-in images with (docs/no-gpu.md), and the tests and benchmarks use the same maker
(harness/tiny_checkpoint.py adds the tokenizer shapes of real models on top)."""

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


def tiny_llama(dest: Path) -> Path:
    """A tiny Llama-architecture checkpoint in Hugging Face format (configs, tokenizer, one weight tensor)."""
    dest.mkdir(parents=True)
    vocab, hidden = 32, 16
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
                "bos_token_id": 1,
                "eos_token_id": 2,
            },
            indent=2,
        )
    )
    write_word_level_tokenizer(dest, vocab)
    write_safetensors(
        dest / "model.safetensors", {"model.embed_tokens.weight": ([vocab, hidden], bytes(2 * vocab * hidden))}
    )
    return dest


def write_word_level_tokenizer(dest: Path, vocab: int) -> None:
    """tokenizer.json (word level, Whitespace pre-tokenizer) that knows the README's prompt words, and its configs."""
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
