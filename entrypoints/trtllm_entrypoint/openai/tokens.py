"""How many tokens the model's tokenizer makes of a prompt (for `usage`, and a chat answer's default room)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def counter(tokenizer_dir: Path) -> Callable[[str], int]:
    """Hugging Face's tokenizers over tokenizer.json, else transformers for tokenizers without one."""
    path = tokenizer_dir / "tokenizer.json"
    if path.is_file():
        import tokenizers  # noqa: PLC0415

        fast = tokenizers.Tokenizer.from_file(str(path))
        return lambda text: len(fast.encode(text, add_special_tokens=True).ids)
    import transformers  # noqa: PLC0415

    slow = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    return lambda text: len(slow.encode(text))
