"""Load and validate matrix.yaml into frozen records; look entries up by NGC tag.

Validation here is about shape (keys, types, version syntax, order). Whether the fields agree with each other
(backend ref vs TensorRT-LLM version, ...) is checks.py's job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.versions import version_tuple

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "matrix.yaml"

STATUSES = ("supported", "unsupported")
WORKFLOWS = ("engine", "llmapi")
VERSION_FIELDS = ("triton", "tensorrt_llm", "tensorrt", "cuda", "python", "pytorch", "ubuntu")
BACKEND_KEYS = ("repo", "ref", "subdir", "in_image")
CAPABILITIES = ("engine_deprecated", "openai_frontend", "restricted_apis")  # true/false per entry
ENTRY_KEYS = ("tag", "status", "note", *VERSION_FIELDS, "backend", "workflows", *CAPABILITIES, "uncertain", "sources")
# Fields an `uncertain` reason may name: the facts, not the bookkeeping keys.
UNCERTAIN_KEYS = frozenset(
    {"note", *VERSION_FIELDS, "backend", "workflows", *CAPABILITIES} | {f"backend.{key}" for key in BACKEND_KEYS}
)

# The spellings NVIDIA uses, a strict subset of PEP 440 (so packaging parses every one): release, optional
# pre/post/dev segments, optional local part (NVIDIA's PyTorch builds).
VERSION_RE = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?$")
TAG_RE = re.compile(r"^\d{2}\.(0[1-9]|1[0-2])$")
REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]*$")


@dataclass(frozen=True)
class Backend:
    repo: str
    ref: str
    subdir: str
    in_image: bool


@dataclass(frozen=True)
class MatrixEntry:
    tag: str
    status: str
    note: str
    triton: str | None
    tensorrt_llm: str | None
    tensorrt: str | None
    cuda: str | None
    python: str | None
    pytorch: str | None
    ubuntu: str | None
    backend: Backend
    workflows: tuple[str, ...]
    engine_deprecated: bool
    openai_frontend: bool
    uncertain: Mapping[str, str] = field(hash=False)
    sources: tuple[str, ...]
    restricted_apis: bool = False  # tritonserver takes --http-restricted-api / --grpc-restricted-protocol

    @property
    def supported(self) -> bool:
        return self.status == "supported"

    @property
    def default_workflow(self) -> str:
        """What the image's entrypoint serves without WORKFLOW (its ImageFacts.default_workflow; a test compares)."""
        return "llmapi" if self.engine_deprecated and "llmapi" in self.workflows else "engine"

    @property
    def base_image(self) -> str:
        return f"nvcr.io/nvidia/tritonserver:{self.tag}-trtllm-python-py3"

    def to_dict(self) -> dict:
        """The entry as plain JSON-able data, same keys and shape as in matrix.yaml (the images carry this)."""
        data: dict[str, Any] = {key: getattr(self, key) for key in ENTRY_KEYS}
        data["backend"] = {key: getattr(self.backend, key) for key in BACKEND_KEYS}
        data["workflows"] = list(self.workflows)
        data["uncertain"] = dict(self.uncertain)
        data["sources"] = list(self.sources)
        return data


@dataclass(frozen=True)
class Matrix:
    entries: tuple[MatrixEntry, ...]

    def get(self, tag: str) -> MatrixEntry:
        for entry in self.entries:
            if entry.tag == tag:
                return entry
        supported = ", ".join(e.tag for e in self.supported())
        unsupported = ", ".join(e.tag for e in self.entries if not e.supported)
        message = f"unknown tag {tag!r}; known tags: {supported}"
        if unsupported:
            message += f" (also listed but unsupported: {unsupported})"
        raise UsageError(message, "tags are NGC releases YY.MM; `python build.py list` shows them all")

    def supported(self) -> tuple[MatrixEntry, ...]:
        return tuple(e for e in self.entries if e.supported)

    def tags(self) -> list[str]:
        return [e.tag for e in self.entries]

    def to_json(self) -> str:
        """A JSON list of entries; deterministic, because it is baked into image layers."""
        return json.dumps([e.to_dict() for e in self.entries], indent=2) + "\n"


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


def load(path: Path = DEFAULT_PATH) -> Matrix:
    path = Path(path)
    return parse(
        read_yaml(path, "matrix file", "run from a checkout of trtllm-images or pass --matrix FILE"), str(path)
    )


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


def parse(data: object, source: str) -> Matrix:
    """Validate the loaded document; every problem is collected and reported in one UsageError."""
    errors: list[str] = []
    if not isinstance(data, dict) or set(data) != {"entries"}:
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        errors.append(f"top level: expected a mapping with the single key 'entries', got {keys}")
    elif not isinstance(data["entries"], list) or not data["entries"]:
        errors.append("entries: expected a non-empty list of entries")
    else:
        parsed = [_entry(raw, f"#{i}", errors) for i, raw in enumerate(data["entries"])]
        entries = [e for e in parsed if e is not None]
        _check_order(entries, errors)
        if not errors:
            return Matrix(tuple(entries))
    count = f"{len(errors)} problem" + ("s" if len(errors) != 1 else "")
    raise UsageError(
        f"{source}: {count} in the matrix:\n" + "\n".join(f"  - {e}" for e in errors),
        "matrix.yaml's header comment describes every field and its allowed values",
    )


def _check_order(entries: list[MatrixEntry], errors: list[str]) -> None:
    seen: set[str] = set()
    previous: MatrixEntry | None = None
    for entry in entries:
        if entry.tag in seen:
            errors.append(f"entry {entry.tag}: tag: duplicate tag {entry.tag!r}")
        elif previous is not None and version_tuple(entry.tag) < version_tuple(previous.tag):
            errors.append(
                f"entry {entry.tag}: tag: tags not sorted ({entry.tag} comes after {previous.tag}); "
                "list entries oldest first"
            )
        seen.add(entry.tag)
        previous = entry


def _entry(raw: object, index: str, errors: list[str]) -> MatrixEntry | None:
    """One entry, or None after appending its problems to `errors`."""
    if not isinstance(raw, dict):
        errors.append(f"entry {index}: expected a mapping of fields, got {type(raw).__name__}")
        return None
    tag = raw.get("tag")
    name = tag if isinstance(tag, str) and TAG_RE.match(tag) else index
    before = len(errors)

    def problem(key: str, text: str) -> None:
        errors.append(f"entry {name}: {key}: {text}")

    _check_keys(raw, ENTRY_KEYS, "", problem)
    _check_scalars(raw, problem)
    # Missing keys are already reported; the helpers only see values that are present.
    backend = _backend(raw["backend"], problem) if "backend" in raw else None
    workflows = _string_list(raw["workflows"], "workflows", problem, WORKFLOWS) if "workflows" in raw else []
    sources = _string_list(raw["sources"], "sources", problem) if "sources" in raw else []
    uncertain = _uncertain(raw["uncertain"], problem) if "uncertain" in raw else {}
    if len(errors) > before or backend is None:
        return None
    return MatrixEntry(
        **{key: raw[key] for key in ("tag", "status", "note", *VERSION_FIELDS, *CAPABILITIES)},
        backend=backend,
        workflows=tuple(workflows),
        uncertain=MappingProxyType(dict(uncertain)),
        sources=tuple(sources),
    )


def _check_keys(raw: dict, expected: tuple[str, ...], prefix: str, problem) -> None:
    for key in raw:
        if key not in expected:
            problem(f"{prefix}{key}", f"unknown key; allowed keys: {', '.join(expected)}")
    for key in expected:
        if key not in raw:
            problem(f"{prefix}{key}", "missing key")


def _type_name(value: object) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"


def _check_scalars(raw: dict, problem) -> None:
    tag = raw.get("tag")
    if "tag" in raw and not (isinstance(tag, str) and TAG_RE.match(tag)):
        problem("tag", f'expected a quoted NGC tag YY.MM such as "25.01", got {_type_name(tag)}')
    status = raw.get("status")
    if "status" in raw and status not in STATUSES:
        problem("status", f"expected one of {', '.join(STATUSES)}, got {_type_name(status)}")
    note = raw.get("note")
    if "note" in raw and not isinstance(note, str):
        problem("note", f"expected a string, got {_type_name(note)}")
    elif status == "unsupported" and not note:
        problem("note", "an unsupported entry needs a note saying why")
    for key in CAPABILITIES:
        if key in raw and not isinstance(raw[key], bool):
            problem(key, f"expected true or false, got {_type_name(raw[key])}")
    uncertain = raw.get("uncertain")
    if not isinstance(uncertain, dict):
        uncertain = {}
    for key in VERSION_FIELDS:
        value = raw.get(key)
        if key not in raw:
            continue
        if value is None:
            if not uncertain.get(key):
                problem(key, "null needs a reason under `uncertain`")
        elif not isinstance(value, str):
            problem(key, f"expected a quoted version string, got {_type_name(value)}")
        elif not VERSION_RE.match(value):
            problem(
                key,
                f"malformed version {value!r} (expected e.g. 1.2.0, 0.17.0.post1, 1.2.0rc8, 2.6.0a0+ecf3bae40a.nv25.1)",
            )


def _backend(raw: object, problem) -> Backend | None:
    if not isinstance(raw, dict):
        problem("backend", f"expected a mapping with keys {', '.join(BACKEND_KEYS)}, got {_type_name(raw)}")
        return None
    _check_keys(raw, BACKEND_KEYS, "backend.", problem)
    checks = {
        "repo": (lambda v: isinstance(v, str) and REPO_RE.match(v), "a GitHub owner/name"),
        "ref": (lambda v: isinstance(v, str) and REF_RE.match(v), "a git tag or branch such as v0.17.0"),
        "subdir": (
            lambda v: isinstance(v, str) and not v.startswith("/") and ".." not in v.split("/"),
            'a relative directory or ""',
        ),
        "in_image": (lambda v: isinstance(v, bool), "true or false"),
    }
    for key, (ok, expected) in checks.items():
        if key in raw and not ok(raw[key]):
            problem(f"backend.{key}", f"expected {expected}, got {_type_name(raw[key])}")
    if not set(BACKEND_KEYS) <= set(raw):
        return None
    return Backend(**{key: raw[key] for key in BACKEND_KEYS})


def _string_list(raw: object, key: str, problem, allowed: tuple[str, ...] = ()) -> list[str]:
    if not isinstance(raw, list) or not raw:
        problem(key, f"expected a non-empty list, got {_type_name(raw)}")
        return []
    for item in raw:
        if not isinstance(item, str) or not item:
            problem(key, f"expected non-empty strings, got {_type_name(item)}")
        elif allowed and item not in allowed:
            problem(key, f"unknown workflow {item!r}; allowed: {', '.join(allowed)}")
    if len(set(map(str, raw))) != len(raw):
        problem(key, "an item is listed twice")
    return list(raw)


def _uncertain(value: object, problem) -> dict:
    if not isinstance(value, dict):
        problem("uncertain", f"expected a mapping field -> reason ({{}} when none), got {_type_name(value)}")
        return {}
    for key, reason in value.items():
        if key not in UNCERTAIN_KEYS:
            problem(f"uncertain.{key}", f"names no field of an entry; allowed: {', '.join(sorted(UNCERTAIN_KEYS))}")
        elif not isinstance(reason, str) or not reason.strip():
            problem(f"uncertain.{key}", f"expected a reason (a non-empty string), got {_type_name(reason)}")
    return value


def markdown_table(matrix: Matrix) -> str:
    """docs/matrix.md's table; cells whose field is uncertain get "?" and a numbered footnote with the reason."""
    columns = [
        ("tag", lambda e: e.tag, ()),
        ("status", lambda e: e.status, ()),
        ("Triton", lambda e: e.triton, ("triton",)),
        ("TRT-LLM", lambda e: e.tensorrt_llm, ("tensorrt_llm",)),
        ("TensorRT", lambda e: e.tensorrt, ("tensorrt",)),
        ("CUDA", lambda e: e.cuda, ("cuda",)),
        ("Python", lambda e: e.python, ("python",)),
        ("backend", _backend_cell, ("backend", "backend.repo", "backend.ref", "backend.subdir")),
        ("templates in image", lambda e: "yes" if e.backend.in_image else "no", ("backend.in_image",)),
        ("workflows", lambda e: ", ".join(e.workflows), ("workflows",)),
        ("OpenAI", lambda e: "yes" if e.openai_frontend else "no", ("openai_frontend",)),
    ]
    lines = ["| " + " | ".join(title for title, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    notes: list[str] = []
    for entry in matrix.entries:
        cells = []
        for _, cell, fields in columns:
            text = cell(entry) or "—"
            reasons = [f"{entry.tag} {f}: {entry.uncertain[f]}" for f in fields if f in entry.uncertain]
            if reasons:
                text += " ?" + ",".join(str(len(notes) + i + 1) for i in range(len(reasons)))
                notes.extend(reasons)
            cells.append(text.replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "Uncertain values (?n):", ""] + [f"{i}. {note}" for i, note in enumerate(notes, 1)]
    return "\n".join(lines) + "\n"


def _backend_cell(entry: MatrixEntry) -> str:
    where = entry.backend.repo.split("/")[-1] + (f"/{entry.backend.subdir}" if entry.backend.subdir else "")
    return f"{where}@{entry.backend.ref}"
