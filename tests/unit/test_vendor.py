"""vendor.lock.json: every artifact verified by sha256 before anything is taken from it, and only the members named."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile

import pytest

from trtllm_entrypoint.errors import Error
from trtllm_entrypoint.openai import sandbox
from trtllm_images import matrix
from trtllm_images.sources import vendor
from trtllm_images.sources.cache import cache_root


def lock_with(tmp_path, artifacts: list[dict]):
    path = tmp_path / "vendor.lock.json"
    path.write_text(json.dumps({"artifacts": artifacts}))
    return path


def a_wheel(tmp_path):
    path = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("pkg/__init__.py", "x = 1\n")
        wheel.writestr("pkg/sub/mod.py", "y = 2\n")
        wheel.writestr("pkg/__pycache__/mod.cpython-311.pyc", b"\0")
        wheel.writestr("other/skip.py", "")
    return path


def a_deb(tmp_path):
    """An `ar` archive around a data.tar.gz, as dpkg-deb writes it."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        body = b"\x7fELF tini"
        info = tarfile.TarInfo("./usr/bin/tini-static")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    members = [(b"debian-binary", b"2.0\n"), (b"control.tar.gz", b"c"), (b"data.tar.gz", data.getvalue())]
    raw = b"!<arch>\n"
    for name, payload in members:
        header = name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8)
        raw += header + str(len(payload)).encode().ljust(10) + b"`\n" + payload + (b"\n" if len(payload) % 2 else b"")
    path = tmp_path / "tini_1_amd64.deb"
    path.write_bytes(raw)
    return path


def record(path, take, fmt, sha256=None):
    digest = sha256 or hashlib.sha256(path.read_bytes()).hexdigest()
    return {"name": path.stem, "version": "1", "url": path.as_uri(), "sha256": digest, "format": fmt, "take": take}


def test_assemble_takes_only_the_named_members_of_verified_files(tmp_path):
    wheel, deb = a_wheel(tmp_path), a_deb(tmp_path)
    lock = lock_with(
        tmp_path, [record(wheel, {"pkg/": "kit/pkg/"}, "zip"), record(deb, {"usr/bin/tini-static": "bin/tini"}, "deb")]
    )
    dest = vendor.assemble(tmp_path / "out", log=lambda m: None, cache=tmp_path / "cache", lock=lock)
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files == ["bin/tini", "kit/pkg/__init__.py", "kit/pkg/sub/mod.py"]
    assert (dest / "bin/tini").read_bytes() == b"\x7fELF tini" and (dest / "bin/tini").stat().st_mode & 0o111


def test_a_file_whose_digest_differs_is_refused_and_not_cached(tmp_path):
    wheel = a_wheel(tmp_path)
    lock = lock_with(tmp_path, [record(wheel, {"pkg/": "kit/"}, "zip", sha256="0" * 64)])
    with pytest.raises(Error, match="sha256 mismatch"):
        vendor.assemble(tmp_path / "out", log=lambda m: None, cache=tmp_path / "cache", lock=lock)
    assert not [p for p in (tmp_path / "cache" / "vendor").iterdir()], "nothing is kept"


@pytest.mark.parametrize("take", [{"../x": "kit/"}, {"pkg/": "/etc/"}, {"pkg/": "../../x"}])
def test_unsafe_paths_in_the_lock_are_refused(tmp_path, take):
    lock = lock_with(tmp_path, [record(a_wheel(tmp_path), take, "zip")])
    with pytest.raises(Error, match="unsafe path"):
        vendor.load(lock)


def test_the_projects_lock_pins_every_artifact():
    artifacts = vendor.load()
    front = {"aiohttp", "aiohappyeyeballs", "aiosignal", "attrs", "frozenlist", "idna", "msgspec", "multidict"}
    front |= {"prometheus-client", "propcache", "typing-extensions", "yarl", "jinja2", "markupsafe", "async-timeout"}
    assert {a.name for a in artifacts} == {"protobuf", "tritonclient", "tini"} | front
    # The front's compiled libraries: one wheel each for every Python of the matrix's tags (and the stand-in's).
    pythons = {".".join(e.python.split(".")[:2]) for e in matrix.load().supported() if e.python}
    compiled = [a for a in artifacts if "py3-none-any" not in a.file_name and a.name in front]
    for name in {a.name for a in compiled}:
        assert pythons <= {t.split("/")[1][2:] for a in compiled if a.name == name for t in a.take.values()}, name
    assert all(len(a.sha256) == 64 and a.url.endswith(a.file_name) for a in artifacts)
    # The front renders untrusted chat templates: never with a jinja2 that has the sandbox escapes fixed in 3.1.6.
    (jinja2,) = [a for a in artifacts if a.name == "jinja2"]
    assert sandbox.version_of(jinja2.version) >= sandbox.MIN_JINJA2 and jinja2.take == {"jinja2/": "front/any/jinja2/"}


def _front_pythons() -> set[str]:
    """X.Y of every Python that runs the front: the matrix's tags' and the stand-in images' (front/pyX.Y sets)."""
    return {a.take[t].split("/")[1][2:] for a in vendor.load() for t in a.take if a.take[t].startswith("front/py")}


def _requirements(wheel, python: str) -> set[str]:
    """The distributions a wheel requires on Python `python` (no extras), names normalized."""
    import re  # noqa: PLC0415

    from packaging.requirements import Requirement  # noqa: PLC0415

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    found = set()
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1].strip())
            env = {"python_version": python, "python_full_version": f"{python}.0", "extra": ""}
            if requirement.marker is None or requirement.marker.evaluate(env):
                found.add(re.sub(r"[-_.]+", "-", requirement.name).lower())
    return found


@pytest.mark.process
def test_every_python_that_runs_the_front_gets_everything_its_libraries_require():
    """aiohttp imports async_timeout below Python 3.11: a missing dependency stops the front on such images."""
    import re  # noqa: PLC0415

    artifacts = [a for a in vendor.load() if any(t.startswith("front/") for t in a.take.values())]
    for python in sorted(_front_pythons()):
        mine = [
            a for a in artifacts if all(t.startswith(("front/any/", f"front/py{python}/")) for t in a.take.values())
        ]
        present = {re.sub(r"[-_.]+", "-", a.name).lower() for a in mine}
        for artifact in mine:
            wheel = vendor.fetch(artifact, cache_root(), lambda message: None)  # the user cache, as build.py
            missing = _requirements(wheel, python) - present
            assert not missing, f"Python {python}: {artifact.name} requires {sorted(missing)}, which the lock lacks"
