"""Reading the small files of a model the user gave (config.json, tokenizer files): regular files only, bounded in
size, UTF-8 JSON of the expected shape. A FIFO is opened without blocking and refused, as are devices, directories
and anything too large; every failure is one UsageError (exit 2) naming the file and what was expected."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from trtllm_entrypoint.errors import UsageError

MAX_BYTES = 64 << 20  # above any config or tokenizer file (large vocabularies' tokenizer.json are ~30 MiB)
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_bytes(path: Path, limit: int = MAX_BYTES) -> bytes | None:
    """The content of a regular file of at most `limit` bytes; None when it does not exist."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{path} cannot be read: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"{path} is not allowed: expected a regular file, found {_kind(mode)}")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"{path} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UsageError(f"{path} is not allowed: expected a file of at most {limit >> 20} MiB")
    return data


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object from a UTF-8 file (read_bytes' rules); None when the file does not exist."""
    data = read_bytes(path)
    if data is None:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not allowed: expected UTF-8 JSON, found other bytes") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not allowed: expected JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UsageError(f"{path} is not allowed: expected a JSON object, found {type(value).__name__}")
    return value


def check_names(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """A Hugging Face config.json whose model_type is a string and architectures a list of strings, if given."""
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise UsageError(
            f'{path} is not allowed: expected "model_type" to be a name such as "llama", got {_short(model_type)}'
        )
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise UsageError(
            f'{path} is not allowed: expected "architectures" to be a list of names such as '
            f'["LlamaForCausalLM"], got {_short(archs)}'
        )
    return config


def _short(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."
