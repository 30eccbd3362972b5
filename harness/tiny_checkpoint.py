"""The tiny checkpoint of trtllm_images/tiny_model.py, with the tokenizer shapes of real models on top."""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_images import tiny_model
from trtllm_images.tiny_model import PROMPT, PROMPT_WORDS, write_safetensors, write_word_level_tokenizer

__all__ = ["PROMPT", "PROMPT_WORDS", "tiny_llama", "write_safetensors", "write_word_level_tokenizer"]

_WORD_LEVEL_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def tiny_llama(dest: Path, tokenizer: str = "wordlevel") -> Path:
    """A tiny Llama-architecture checkpoint in Hugging Face format (configs, tokenizer, one weight tensor).

    tokenizer: "wordlevel" (the README's prompt words, one token each, no decoder: the doubles' answers read back as
    words) or a shape of harness/tokenizers_fixture.py ("llama2": SentencePiece with `▁` and byte fallback, as Llama 2
    and TinyLlama ship; "qwen", "llama3": byte-level BPE; …), the shape real models' text paths must get right."""
    tiny_model.tiny_llama(dest)
    if tokenizer == "wordlevel":
        return dest
    from harness import tokenizers_fixture  # noqa: PLC0415  (needs `tokenizers`; the word-level maker does not)

    for name in _WORD_LEVEL_FILES:
        (dest / name).unlink(missing_ok=True)
    tokenizers_fixture.write_tokenizer(dest, tokenizer, model_max_length=256)
    shaped = tokenizers_fixture.tokenizer_of(tokenizer)
    settings = tokenizers_fixture.SHAPES[tokenizer]
    config = json.loads((dest / "config.json").read_text())
    vocab, hidden = shaped.get_vocab_size(), config["hidden_size"]
    config["vocab_size"] = vocab
    config["bos_token_id"] = shaped.token_to_id(settings["bos_token"]) if settings.get("bos_token") else None
    config["eos_token_id"] = shaped.token_to_id(settings["eos_token"])
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    write_safetensors(
        dest / "model.safetensors", {"model.embed_tokens.weight": ([vocab, hidden], bytes(2 * vocab * hidden))}
    )
    return dest
