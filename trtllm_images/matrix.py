"""Load and validate matrix.yaml into frozen records; look entries up by NGC tag.

An entry in the file says what is true of its tag (versions, sources, uncertainty). What follows from those versions
through capabilities.yaml's thresholds (the backend's location, the workflows, engine deprecation, the OpenAI frontend)
is derived here, once, while the entry is loaded. Validation is about shape (keys, types, version syntax, order);
whether the facts agree with each other is checks.py's job.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.versions import version_tuple
from trtllm_images.capabilities import Capabilities, load_capabilities
from trtllm_images.datafile import TAG_RE, VERSION_RE, read_yaml

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "matrix.yaml"

STATUSES = ("supported", "unsupported")
VERSION_FIELDS = ("triton", "tensorrt_llm", "tensorrt", "cuda", "python", "pytorch", "ubuntu")
ENTRY_KEYS = ("tag", "status", "note", *VERSION_FIELDS, "uncertain", "sources")
# A fact the thresholds cannot express, given only where it holds (its source under `sources`).
OPTIONAL_KEYS = ("backend_ref",)
BACKEND_KEYS = ("repo", "ref", "subdir", "in_image")
# matrix.json (what the images carry): the entry's facts with the derived fields in between.
IMAGE_KEYS = (
    "tag",
    "status",
    "note",
    *VERSION_FIELDS,
    "backend",
    "workflows",
    "engine_deprecated",
    "openai_frontend",
    "uncertain",
    "sources",
)
# Fields an `uncertain` reason may name: the tag's facts (the backend ref, which follows from the TensorRT-LLM
# version, is a fact of the tag too).
UNCERTAIN_KEYS = frozenset({"note", *VERSION_FIELDS, "backend.ref"})
# Where the Triton backend lives, before and from capability `backend_in_tensorrt_llm`: (repo, subdir).
BACKEND_HOME = ("triton-inference-server/tensorrtllm_backend", "")
BACKEND_HOME_IN_TENSORRT_LLM = ("NVIDIA/TensorRT-LLM", "triton_backend")

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
    # Derived from the versions through capabilities.yaml (_derived()); not written in matrix.yaml.
    backend: Backend
    workflows: tuple[str, ...]
    engine_deprecated: bool
    openai_frontend: bool
    uncertain: Mapping[str, str] = field(hash=False)
    sources: tuple[str, ...]

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
        """The entry as plain JSON-able data, its derived fields included (the images carry this)."""
        data: dict[str, Any] = {key: getattr(self, key) for key in IMAGE_KEYS}
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


def load(path: Path = DEFAULT_PATH, capabilities: Capabilities | None = None) -> Matrix:
    path = Path(path)
    return parse(
        read_yaml(path, "matrix file", "run from a checkout of trtllm-images or pass --matrix FILE"),
        str(path),
        capabilities,
    )


def parse(data: object, source: str, capabilities: Capabilities | None = None) -> Matrix:
    """Validate the loaded document and derive each entry's capabilities-given fields (capabilities.yaml unless
    given); every problem is collected and reported in one UsageError."""
    capabilities = capabilities or load_capabilities()
    errors: list[str] = []
    if not isinstance(data, dict) or set(data) != {"entries"}:
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        errors.append(f"top level: expected a mapping with the single key 'entries', got {keys}")
    elif not isinstance(data["entries"], list) or not data["entries"]:
        errors.append("entries: expected a non-empty list of entries")
    else:
        parsed = [_entry(raw, f"#{i}", errors, capabilities) for i, raw in enumerate(data["entries"])]
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


def _entry(raw: object, index: str, errors: list[str], capabilities: Capabilities) -> MatrixEntry | None:
    """One entry, or None after appending its problems to `errors`."""
    if not isinstance(raw, dict):
        errors.append(f"entry {index}: expected a mapping of fields, got {type(raw).__name__}")
        return None
    tag = raw.get("tag")
    name = tag if isinstance(tag, str) and TAG_RE.match(tag) else index
    before = len(errors)

    def problem(key: str, text: str) -> None:
        errors.append(f"entry {name}: {key}: {text}")

    _check_keys(raw, problem)
    _check_scalars(raw, problem)
    # Missing keys are already reported; the helpers only see values that are present.
    sources = _string_list(raw["sources"], "sources", problem) if "sources" in raw else []
    uncertain = _uncertain(raw["uncertain"], problem) if "uncertain" in raw else {}
    if len(errors) > before:
        return None
    release = _Release(raw["tag"], raw["tensorrt_llm"])
    return MatrixEntry(
        **{key: raw[key] for key in ("tag", "status", "note", *VERSION_FIELDS)},
        **_derived(raw["tensorrt_llm"], raw.get("backend_ref"), capabilities.features_of(release)),
        uncertain=MappingProxyType(dict(uncertain)),
        sources=tuple(sources),
    )


class _Release(NamedTuple):
    """What capabilities.yaml's rules compare, before the entry exists."""

    tag: str
    tensorrt_llm: str | None


def _derived(tensorrt_llm: str | None, backend_ref: str | None, features: tuple[str, ...]) -> dict[str, Any]:
    """The fields of an entry that follow from its versions: its named capabilities (capabilities.yaml) and the
    backend's tag, "v" + the TensorRT-LLM base release (0.17.0.post1 -> v0.17.0) unless the entry gives backend_ref."""
    repo, subdir = BACKEND_HOME_IN_TENSORRT_LLM if "backend_in_tensorrt_llm" in features else BACKEND_HOME
    ref = backend_ref or "v" + ".".join(map(str, version_tuple(tensorrt_llm or "")))
    return {
        "backend": Backend(repo, ref, subdir, in_image="app_in_image" in features),
        "workflows": ("engine", "llmapi") if "llmapi_workflow" in features else ("engine",),
        "engine_deprecated": "engine_deprecated" in features,
        "openai_frontend": "openai_frontend" in features,
    }


def _check_keys(raw: dict, problem) -> None:
    for key in raw:
        if key not in ENTRY_KEYS and key not in OPTIONAL_KEYS:
            problem(key, f"unknown key; allowed keys: {', '.join((*ENTRY_KEYS, *OPTIONAL_KEYS))}")
    for key in ENTRY_KEYS:
        if key not in raw:
            problem(key, "missing key")


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
    ref = raw.get("backend_ref")
    if "backend_ref" in raw and not (isinstance(ref, str) and REF_RE.match(ref)):
        problem("backend_ref", f"expected a git tag such as v0.7.2, got {_type_name(ref)}")
    elif "tensorrt_llm" in raw and raw["tensorrt_llm"] is None and "backend_ref" not in raw:
        problem("backend_ref", "needed when tensorrt_llm is null: the backend's tag follows from that version")
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


def _string_list(raw: object, key: str, problem) -> list[str]:
    if not isinstance(raw, list) or not raw:
        problem(key, f"expected a non-empty list, got {_type_name(raw)}")
        return []
    for item in raw:
        if not isinstance(item, str) or not item:
            problem(key, f"expected non-empty strings, got {_type_name(item)}")
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
        ("backend", _backend_cell, ("backend.ref",)),
        ("templates in image", lambda e: "yes" if e.backend.in_image else "no", ()),
        ("workflows", lambda e: ", ".join(e.workflows), ()),
        ("Triton OpenAI frontend", lambda e: "yes" if e.openai_frontend else "no", ()),
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
        lines += ["", "Uncertain values (?n):", ""]
        for i, note in enumerate(notes, 1):  # wrapped, as the docs' lines are: at most 120 characters
            lines += textwrap.wrap(f"{i}. {note}", 116, subsequent_indent="   ", break_long_words=False)
    return "\n".join(lines) + "\n"


def _backend_cell(entry: MatrixEntry) -> str:
    where = entry.backend.repo.split("/")[-1] + (f"/{entry.backend.subdir}" if entry.backend.subdir else "")
    return f"{where}@{entry.backend.ref}"


def image_matrix_json(matrix: Matrix, capabilities: Capabilities) -> str:
    """matrix.json as the images carry it: every entry with its named capabilities. Deterministic (image layers)."""
    entries = [{**entry.to_dict(), "capabilities": capabilities.of(entry).to_dict()} for entry in matrix.entries]
    return json.dumps(entries, indent=2) + "\n"
