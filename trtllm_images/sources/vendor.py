"""Files every image gets besides our wheel (vendor.lock.json): tini as PID 1, and what the entrypoint's repository
check needs to parse configs with Triton's own ModelConfig message (protobuf's pure-Python runtime and the generated
model_config_pb2.py), in a private directory that only our code puts on its path.

Each artifact is pinned by URL and sha256, downloaded on the host into the user cache (`vendor/<sha256>-<file>`,
renamed into place only once the digest matched), and only the members its record names are taken out of it, so
`docker build` stays hermetic and never touches the base image's site-packages.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trtllm_entrypoint.errors import Error
from trtllm_images.matrix import DEFAULT_PATH
from trtllm_images.sources.archive import download
from trtllm_images.sources.cache import cache_root

LOCK_PATH = DEFAULT_PATH.parent / "vendor.lock.json"
FORMATS = ("zip", "deb")
MAX_MEMBER_BYTES = 64 << 20


@dataclass(frozen=True)
class Artifact:
    name: str
    version: str
    url: str
    sha256: str
    format: str  # zip (a wheel) or deb
    take: Mapping[str, str]  # member (a file, or a directory ending in /) -> path in the vendor dir

    @property
    def file_name(self) -> str:
        return posixpath.basename(self.url)


def load(path: Path = LOCK_PATH) -> tuple[Artifact, ...]:
    try:
        records = json.loads(path.read_text())["artifacts"]
        artifacts = tuple(
            Artifact(r["name"], r["version"], r["url"], r["sha256"], r["format"], dict(r["take"])) for r in records
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Error(f"{path} is not a readable vendor lock: {exc!r}", "restore it from git") from None
    for artifact in artifacts:
        targets = list(artifact.take.values())
        if artifact.format not in FORMATS or not all(p and _safe(p) for p in targets + list(artifact.take)):
            raise Error(
                f"{path.name}: {artifact.name} has format {artifact.format!r} or an unsafe path",
                f"formats: {', '.join(FORMATS)}; relative paths without '..'",
            )
    return artifacts


def _safe(path: str) -> bool:
    """Relative, and never above where it is put."""
    return not path.startswith("/") and ".." not in PurePosixPath(path).parts


def fetch(artifact: Artifact, cache: Path, log: Callable[[str], None]) -> Path:
    """The verified file of `artifact`, from the cache or downloaded (renamed into place only once its digest
    matched, so the cache never holds a file that does not)."""
    root = Path(cache) / "vendor"
    final = root / f"{artifact.sha256}-{artifact.file_name}"
    if final.is_file() and _sha256(final) == artifact.sha256:
        return final
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as scratch:
        tmp = Path(scratch) / artifact.file_name
        log(f"downloading {artifact.url}")
        download(
            artifact.name, artifact.url, tmp, f"retry on a machine that reaches {artifact.url}, or put it at {final}"
        )
        actual = _sha256(tmp)
        if actual != artifact.sha256:
            raise Error(
                f"{artifact.name}: sha256 mismatch for {artifact.url}: expected {artifact.sha256}, got {actual}",
                f"the file changed on its way or upstream; nothing was cached. Check it and update {LOCK_PATH.name}",
            )
        os.replace(tmp, final)
    return final


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        while chunk := data.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _zip_members(path: Path) -> dict[str, bytes | None]:
    """Regular files of a zip (a wheel) by name; None for anything else."""
    with zipfile.ZipFile(path) as archive:
        return {
            info.filename: None if info.is_dir() or info.file_size > MAX_MEMBER_BYTES else archive.read(info)
            for info in archive.infolist()
        }


def _deb_members(path: Path) -> dict[str, bytes | None]:
    """Regular files of a .deb's data.tar.* (an `ar` archive around tar files) by name without the leading './'."""
    data = path.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise Error(f"{path} is not a Debian package (no ar header)", "check the artifact's URL")
    offset, payload = 8, None
    while offset + 60 <= len(data):
        header = data[offset : offset + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        if name.startswith("data.tar"):
            payload = data[offset + 60 : offset + 60 + size]
            break
        offset += 60 + size + (size % 2)
    if payload is None:
        raise Error(f"{path} has no data.tar member", "check the artifact's URL")
    members: dict[str, bytes | None] = {}
    with tarfile.open(fileobj=io.BytesIO(payload)) as archive:
        for info in archive.getmembers():
            name = info.name.removeprefix("./")
            handle = archive.extractfile(info) if info.isreg() and info.size <= MAX_MEMBER_BYTES else None
            members[name] = handle.read() if handle is not None else None
    return members


def extract(artifact: Artifact, path: Path, dest: Path) -> None:
    """Write the members `artifact.take` names (a directory: every regular file below it) under `dest`."""
    members = _zip_members(path) if artifact.format == "zip" else _deb_members(path)
    for source, target in artifact.take.items():
        picked: dict[str, bytes] = {}
        for name, data in members.items():
            rel = name[len(source) :] if source.endswith("/") and name.startswith(source) else None
            if name == source and data is not None:
                picked[""] = data
            elif rel and data is not None and "__pycache__" not in rel:
                picked[rel] = data
        if not picked:
            raise Error(f"{artifact.name}: {path.name} has no {source}", f"check {LOCK_PATH.name}")
        for rel, data in picked.items():
            if not _safe(rel):
                raise Error(f"{artifact.name}: unsafe member {source}{rel}", "check the artifact")
            out = dest / target / rel if rel else dest / target
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            out.chmod(0o755 if artifact.format == "deb" else 0o644)  # the one program taken is tini


def assemble(dest: Path, log: Callable[[str], None], cache: Path | None = None, lock: Path = LOCK_PATH) -> Path:
    """Every artifact's members under `dest` (created): what the build context's vendor/ directory holds."""
    cache = cache or cache_root()
    dest.mkdir(parents=True, exist_ok=True)
    for artifact in load(lock):
        extract(artifact, fetch(artifact, cache, log), dest)
    return dest
