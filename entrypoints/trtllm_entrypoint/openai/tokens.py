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
        # encode_batch releases the GIL while it works (encode holds it): the loop streams on meanwhile (cpu.py)
        return lambda text: len(fast.encode_batch([text], add_special_tokens=True)[0].ids)
    import transformers  # noqa: PLC0415

    slow = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    return lambda text: len(slow.encode(text))


def decoder(tokenizer_dir: Path) -> Callable[[list[int]], str]:
    """Token ids back to text (a prompt given as ids, sent to the model as text), ids outside the vocabulary refused
    with ValueError."""
    path = tokenizer_dir / "tokenizer.json"
    if path.is_file():
        import tokenizers  # noqa: PLC0415

        fast = tokenizers.Tokenizer.from_file(str(path))
        size = fast.get_vocab_size(with_added_tokens=True)

        def decode_fast(ids: list[int]) -> str:
            _check_ids(ids, size)
            return str(fast.decode(ids, skip_special_tokens=False))

        return decode_fast
    import transformers  # noqa: PLC0415

    slow = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))

    def decode_slow(ids: list[int]) -> str:
        _check_ids(ids, len(slow))
        return str(slow.decode(ids, skip_special_tokens=False))

    return decode_slow


def _check_ids(ids: list[int], size: int) -> None:
    bad = next((i for i in ids if not 0 <= i < size), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is outside the model's vocabulary (0 to {size - 1})")
