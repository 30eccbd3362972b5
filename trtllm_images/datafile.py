"""Reading the project's YAML data (matrix.yaml, capabilities.yaml, models.yaml): one strict loader, and the version
and tag spellings the files may use."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NoReturn

import yaml

from trtllm_entrypoint.errors import UsageError

# The spellings NVIDIA uses, a strict subset of PEP 440 (so packaging parses every one): release, optional
# pre/post/dev segments, optional local part (NVIDIA's PyTorch builds).
VERSION_RE = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?$")
ROOT = Path(__file__).resolve().parents[1]  # the checkout: matrix.yaml, capabilities.yaml, models.yaml
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


# --- what every loader's validation shares: problems are collected, then raised as one UsageError ---------------


def raise_problems(path: Path, errors: list[str], hint: str) -> NoReturn:
    count = f"{len(errors)} problem" + ("s" if len(errors) != 1 else "")
    raise UsageError(f"{path}: {count}:\n" + "\n".join(f"  - {e}" for e in errors), hint)


def expect_mapping(raw: object, where: str, errors: list[str]) -> dict:
    if isinstance(raw, dict):
        return raw
    errors.append(f"{where}: expected a mapping, got {type(raw).__name__}")
    return {}


def expect_version(
    raw: object, where: str, errors: list[str], pattern=VERSION_RE, example: str = "0.20.0"
) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, str) and pattern.match(raw):
        return raw
    errors.append(f'{where}: expected a quoted version such as "{example}", got {raw!r}')
    return None


def expect_strings(raw: object, where: str, errors: list[str]) -> tuple[str, ...]:
    if isinstance(raw, list) and all(isinstance(item, str) and item for item in raw):
        return tuple(raw)
    errors.append(f"{where}: expected a list of non-empty strings, got {raw!r}")
    return ()
