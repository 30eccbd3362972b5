"""Post-build verification: run `trtllm-entrypoint probe` in a built image and compare it with the matrix entry;
run `trtllm-entrypoint flags` there and fail on any flag our plans pass that the image's program does not take.

`expected`, `compare` and `flag_mismatches` are pure; `run_entrypoint` is the only Docker call. A fact the matrix
marks as uncertain still gets compared, but a difference is a warning (worth fixing in matrix.yaml), not a failed
build. A missing flag is always an error: the engine build or the server start would fail on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from docker.errors import DockerException

from trtllm_entrypoint.errors import Error
from trtllm_images.plan import STANDIN_PYTHON_LABEL

ERROR = "error"
WARNING = "warning"

# Compared exactly: the engine format and the entrypoint's flag set follow the TensorRT-LLM version.
EXACT_VERSIONS = ("tensorrt_llm",)
# Compared at the precision the matrix gives ("10.1.0" accepts an installed "10.1.0.27").
PREFIX_VERSIONS = ("tensorrt", "triton", "python")
# Engine builds need trtllm-build; tensor parallelism needs mpirun; serving needs tritonserver.
REQUIRED_PROGRAMS = ("tritonserver", "trtllm-build", "mpirun")
KIND_PROGRAMS = {"group": ("ssh", "sshd")}  # what an image kind needs on top: a group pod's ranks start over ssh
# Which matrix field a probe field follows, when the names differ (for `uncertain`).
FOLLOWS = {"templates": "workflows"}
# The probe imports tensorrt_llm, which can take a while on a cold page cache.
PROBE_TIMEOUT_S = 300


@dataclass(frozen=True)
class Mismatch:
    field: str
    expected: Any
    actual: Any
    level: str

    def __str__(self) -> str:
        return f"{self.field}: expected {_show(self.expected)}, found {_show(self.actual)}"


@dataclass(frozen=True)
class Verification:
    """The outcome of probing one image."""

    kind: str
    ref: str
    probe: Mapping[str, Any]
    mismatches: tuple[Mismatch, ...]

    @property
    def errors(self) -> tuple[Mismatch, ...]:
        return tuple(m for m in self.mismatches if m.level == ERROR)

    @property
    def warnings(self) -> tuple[Mismatch, ...]:
        return tuple(m for m in self.mismatches if m.level == WARNING)

    def raise_for_errors(self) -> None:
        if not self.errors:
            return
        listing = "\n".join(f"  {m}" for m in self.errors)
        raise Error(
            f"{self.kind} image {self.ref} does not match its matrix entry:\n{listing}",
            hint="fix matrix.yaml if the image is right, or --base-image if the wrong base image was used",
        )

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "ref": self.ref,
            "ok": not self.errors,
            "errors": [_mismatch_dict(m) for m in self.errors],
            "warnings": [_mismatch_dict(m) for m in self.warnings],
            "probe": dict(self.probe),
        }


def expected(entry, kind: str = "server") -> dict:
    """What the probe of an image of `kind` built for `entry` must report."""
    return {
        "tag": entry.tag,
        **{name: getattr(entry, name) for name in EXACT_VERSIONS + PREFIX_VERSIONS},
        "templates": {"inflight_batcher_llm": "engine" in entry.workflows, "llmapi": "llmapi" in entry.workflows},
        "programs": REQUIRED_PROGRAMS + KIND_PROGRAMS.get(kind, ()),
        "openai_frontend": entry.openai_frontend,
    }


def compare(entry, probe: Mapping[str, Any], kind: str = "server") -> list[Mismatch]:
    """Every difference between the entry and the probe of one of its images of `kind`."""
    want = expected(entry, kind)
    uncertain = set(entry.uncertain)
    found: list[Mismatch] = []

    def differ(field: str, exp: Any, act: Any) -> None:
        top = field.split(".")[0]
        level = WARNING if FOLLOWS.get(top, top) in uncertain or exp is None else ERROR
        found.append(Mismatch(field, exp, act, level))

    if probe.get("tag") != want["tag"]:
        differ("tag", want["tag"], probe.get("tag"))
    for name in EXACT_VERSIONS + PREFIX_VERSIONS:
        matches = _same_version if name in EXACT_VERSIONS else _version_prefix_matches
        if not matches(want[name], probe.get(name)):
            differ(name, want[name], probe.get(name))
    templates = probe.get("templates") or {}
    for name, needed in want["templates"].items():
        if needed and not templates.get(name):
            differ(f"templates.{name}", "present", "missing")
    programs = probe.get("programs") or {}
    for name in want["programs"]:
        if not programs.get(name):
            differ(f"programs.{name}", "a path", None)
    if bool(probe.get("openai_frontend")) != bool(want["openai_frontend"]):
        differ("openai_frontend", want["openai_frontend"], probe.get("openai_frontend"))
    return found


def flag_mismatches(entry, report: Mapping[str, Any]) -> list[Mismatch]:
    """From `trtllm-entrypoint flags`: each flag our plans pass that a program's --help does not list, and each
    program the plans run that the image lacks. A program whose help printed no flags (some import GPU libraries
    even for --help, and a build machine may have no GPU) is a warning: nothing was verified for it."""
    found = []
    for program in report.get("programs") or []:
        name = program["program"]
        if program.get("error"):
            found.append(Mismatch(f"flags.{name}", "the program our plans run", program["error"], ERROR))
        if program.get("unverified"):
            found.append(Mismatch(f"flags.{name}", "a --help listing its flags", program["unverified"], WARNING))
        for flag in program.get("missing") or []:
            found.append(
                Mismatch(
                    f"flags.{name}", f"{flag} (our plans pass it)", f"no {flag} in its --help at tag {entry.tag}", ERROR
                )
            )
    if not report.get("programs"):
        found.append(Mismatch("flags", "programs checked", "none", ERROR))
    return found


def image_labels(client, image_ref: str) -> dict[str, str]:
    try:
        return dict((client.api.inspect_image(image_ref).get("Config") or {}).get("Labels") or {})
    except (DockerException, OSError) as exc:
        raise Error(f"cannot read the labels of {image_ref}: {exc}") from exc


def run_probe(client, image_ref: str) -> dict:
    return run_entrypoint(client, image_ref, "probe")


def run_entrypoint(client, image_ref: str, command: str) -> dict:
    """Run `trtllm-entrypoint COMMAND` in a throw-away container of `image_ref` and parse its JSON."""
    try:
        container = client.containers.create(
            image_ref, entrypoint=["trtllm-entrypoint"], command=[command], network_disabled=True
        )
    except (DockerException, OSError) as exc:
        raise Error(f"cannot start `trtllm-entrypoint {command}` in {image_ref}: {exc}") from exc
    try:
        container.start()
        status = container.wait(timeout=PROBE_TIMEOUT_S)["StatusCode"]
        stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
    except (DockerException, OSError) as exc:
        raise Error(f"`trtllm-entrypoint {command}` in {image_ref} did not finish: {exc}") from exc
    finally:
        _remove_quietly(container)
    if status != 0:
        raise Error(
            f"`trtllm-entrypoint {command}` exited with {status} in {image_ref}: {_tail(stderr or stdout)}",
            hint="the image's entrypoint package is broken; rebuild after fixing it",
        )
    return parse_probe_output(stdout, image_ref, command)


def parse_probe_output(stdout: str, image_ref: str, command: str = "probe") -> dict:
    """The probe's JSON object; import-time chatter before it (some libraries print banners) is skipped."""
    lines = stdout.splitlines()
    # The object starts at the last line that opens one at column 0 (a pretty-printed object has exactly one).
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].startswith("{"):
            try:
                value = json.loads("\n".join(lines[start:]))
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    raise Error(
        f"`trtllm-entrypoint {command}` in {image_ref} printed no JSON object: {_tail(stdout) or '(no output)'}",
        hint=f"run `docker run --rm --entrypoint trtllm-entrypoint IMAGE {command}` to see its output",
    )


def verify_image(client, entry, kind: str, ref: str) -> Verification:
    """Probe the image and check its programs' flags; call `raise_for_errors()` on the result to fail on
    error-level mismatches."""
    probe = run_probe(client, ref)
    flags = run_entrypoint(client, ref, "flags")
    standin_python = image_labels(client, ref).get(STANDIN_PYTHON_LABEL)
    if standin_python:  # a stand-in runs its own OS's Python, which it declares, not the NGC image's
        entry = dataclasses.replace(entry, python=standin_python)
    mismatches = compare(entry, probe, kind) + flag_mismatches(entry, flags)
    return Verification(kind=kind, ref=ref, probe={**probe, "flags": flags}, mismatches=tuple(mismatches))


def _same_version(expected_version: str | None, actual: str | None) -> bool:
    return expected_version is not None and actual == expected_version


def _version_prefix_matches(expected_version: str | None, actual: str | None) -> bool:
    if expected_version is None or actual is None:
        return False
    want = str(expected_version).split(".")
    return str(actual).split(".")[: len(want)] == want


def _mismatch_dict(mismatch: Mismatch) -> dict:
    return {"field": mismatch.field, "expected": mismatch.expected, "actual": mismatch.actual, "message": str(mismatch)}


def _show(value: Any) -> str:
    return "nothing" if value is None else str(value)


def _tail(text: str, lines: int = 5) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _remove_quietly(container) -> None:
    # Removal failing must not hide the probe's own result or error.
    with contextlib.suppress(DockerException, OSError):
        container.remove(force=True)
