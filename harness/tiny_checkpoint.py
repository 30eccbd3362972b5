"""The tiny checkpoint the test suites share: the supported maker (trtllm_images/tiny_model.py, which
`python build.py tiny-model` runs), under the names the tests import."""

from __future__ import annotations

from trtllm_images.tiny_model import PROMPT, PROMPT_WORDS, tiny_llama, write_safetensors, write_word_level_tokenizer

__all__ = ["PROMPT", "PROMPT_WORDS", "tiny_llama", "write_safetensors", "write_word_level_tokenizer"]
