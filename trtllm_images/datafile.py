"""Reading the project's YAML data (matrix.yaml, capabilities.yaml, models.yaml): one strict loader, and the version
and tag spellings the files may use."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from trtllm_entrypoint.errors import UsageError

# The spellings NVIDIA uses, a strict subset of PEP 440 (so packaging parses every one): release, optional
# pre/post/dev segments, optional local part (NVIDIA's PyTorch builds).
VERSION_RE = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?$")
TAG_RE = re.compile(r"^\d{2}\.(0[1-9]|1[0-2])$")


class _StrictLoader(yaml.SafeLoader):
    """safe_load that rejects a key given twice in one mapping (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path, what: str, missing_hint: str) -> object:
    """The YAML document at `path` (duplicate keys rejected); a missing file or a syntax error is one UsageError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist", missing_hint) from None
    except OSError as exc:
        raise UsageError(f"{what} {path} cannot be read: {exc.strerror}", missing_hint) from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {path} is not UTF-8 text (byte {exc.start})", f"give a YAML {what}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise UsageError(
            f"{path}: YAML syntax error{where}: {problem}", 'fix the YAML; quote versions and tags ("25.01")'
        ) from None
    return data
