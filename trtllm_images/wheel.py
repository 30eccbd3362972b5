"""A deterministic wheel of the container-side package (entrypoints/): same sources, same bytes, same Docker layer.

No build backend is run: the package is pure Python, so the wheel is a zip we can write ourselves with fixed
timestamps, modes and entry order (setuptools would embed build-time metadata and vary between versions).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import zipfile
from pathlib import Path

from trtllm_entrypoint.errors import Error
from trtllm_images.atomic import write_atomic

ENTRYPOINTS_DIR = Path(__file__).resolve().parents[1] / "entrypoints"
WHEEL_GLOB = "trtllm_entrypoint-*.whl"  # what images/_common.j2 installs
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip can store
_KEY_VALUE = re.compile(r"^\s*([A-Za-z0-9_.\"-]+)\s*=\s*(.+?)\s*$")


def build_wheel(project_dir: Path = ENTRYPOINTS_DIR, *, dest: Path) -> Path:
    """Write <dest>/<name>-<version>-py3-none-any.whl (atomically) and return its path."""
    project_dir = Path(project_dir)
    meta = read_project(project_dir / "pyproject.toml")
    dist = re.sub(r"[-_.]+", "_", meta["name"]).lower()
    dist_info = f"{dist}-{meta['version']}.dist-info"
    files = {}
    for package in meta["packages"]:
        files.update(_package_files(project_dir, package))
    files[f"{dist_info}/METADATA"] = _metadata(meta).encode()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: trtllm-images\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{dist_info}/entry_points.txt"] = _entry_points(meta["scripts"]).encode()
    record = f"{dist_info}/RECORD"
    files[record] = _record(files, record)

    return write_atomic(Path(dest) / f"{dist}-{meta['version']}-py3-none-any.whl", _zip(files))


def read_project(pyproject: Path) -> dict:
    """name, version, summary, requires_python, scripts and packages from a pyproject.toml.

    A deliberately tiny reader (one-line `key = value` with JSON-compatible strings and string lists), so the
    host side keeps working on Python 3.10, which has no tomllib.
    """
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError as exc:
        raise Error(f"cannot read {pyproject}: {exc.strerror}", "build from a checkout of trtllm-images") from None
    tables: dict[str, dict] = {}
    table = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            table = line.strip("[]").strip()
        elif match := _KEY_VALUE.match(line):
            try:
                value = json.loads(match.group(2))
            except ValueError:
                continue  # values this reader does not need (multi-line arrays, inline tables)
            tables.setdefault(table, {})[match.group(1).strip('"')] = value
    project = tables.get("project", {})
    missing = [key for key in ("name", "version") if key not in project]
    if missing or "packages" not in tables.get("tool.setuptools", {}):
        raise Error(
            f"{pyproject} lacks {', '.join(missing) or '[tool.setuptools] packages'}",
            "it needs one-line [project] name/version and [tool.setuptools] packages",
        )
    return {
        "name": project["name"],
        "version": project["version"],
        "summary": project.get("description", ""),
        "requires_python": project.get("requires-python", ""),
        "scripts": tables.get("project.scripts", {}),
        "packages": tables["tool.setuptools"]["packages"],
    }


def _package_files(project_dir: Path, package: str) -> dict[str, bytes]:
    root = project_dir.joinpath(*package.split("."))
    if not (root / "__init__.py").is_file():
        raise Error(f"package {package} not found under {project_dir}", "check [tool.setuptools] packages")
    return {
        path.relative_to(project_dir).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo")
    }


def _metadata(meta: dict) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {meta['name']}", f"Version: {meta['version']}"]
    if meta["summary"]:
        lines.append(f"Summary: {meta['summary']}")
    if meta["requires_python"]:
        lines.append(f"Requires-Python: {meta['requires_python']}")
    return "\n".join(lines) + "\n"


def _entry_points(scripts: dict) -> str:
    body = "".join(f"{name} = {target}\n" for name, target in sorted(scripts.items()))
    return f"[console_scripts]\n{body}" if body else ""


def _record(files: dict[str, bytes], record: str) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for name in sorted(files):
        digest = base64.urlsafe_b64encode(hashlib.sha256(files[name]).digest()).rstrip(b"=").decode()
        writer.writerow([name, f"sha256={digest}", len(files[name])])
    writer.writerow([record, "", ""])
    return out.getvalue().encode()


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        # Sorted, with RECORD last as the wheel spec recommends.
        for name in sorted(files, key=lambda n: (n.endswith(".dist-info/RECORD"), n)):
            info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
            info.create_system = 3  # Unix, so the mode below is honoured on every host OS
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, files[name])
    return buffer.getvalue()
