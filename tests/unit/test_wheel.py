"""wheel.build_wheel: deterministic bytes, valid wheel metadata, installable offline with its console script."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from trtllm_entrypoint.errors import Error
from trtllm_images.wheel import ENTRYPOINTS_DIR, build_wheel, read_project

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]

[project]
name = "trtllm-entrypoint"
version = "1.2.3"
description = "test package"
requires-python = ">=3.10"
dependencies = []

[project.scripts]
trtllm-entrypoint = "trtllm_entrypoint.main:main"

[tool.setuptools]
packages = ["trtllm_entrypoint"]
"""


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    package = root / "trtllm_entrypoint"
    package.mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text("def main():\n    print('hello from the entrypoint')\n    return 0\n")
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"\0")
    return root


def test_same_sources_give_the_same_bytes_whatever_the_mtimes(project, tmp_path):
    first = build_wheel(project, dest=tmp_path / "a").read_bytes()
    os.utime(project / "trtllm_entrypoint" / "main.py", (1_900_000_000, 1_900_000_000))
    second = build_wheel(project, dest=tmp_path / "b")
    assert second.read_bytes() == first
    assert second.name == "trtllm_entrypoint-1.2.3-py3-none-any.whl"
    assert [p.name for p in second.parent.iterdir()] == [second.name]  # no temp files left


def test_changed_source_changes_the_bytes(project, tmp_path):
    first = build_wheel(project, dest=tmp_path / "a").read_bytes()
    (project / "trtllm_entrypoint" / "main.py").write_text("def main():\n    return 1\n")
    assert build_wheel(project, dest=tmp_path / "b").read_bytes() != first


def test_wheel_layout_and_metadata(project, tmp_path):
    with zipfile.ZipFile(build_wheel(project, dest=tmp_path)) as archive:
        names = archive.namelist()
        info = "trtllm_entrypoint-1.2.3.dist-info"
        assert names[-1] == f"{info}/RECORD"
        assert names[:-1] == sorted(names[:-1])
        assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)
        assert {"trtllm_entrypoint/__init__.py", "trtllm_entrypoint/main.py"} <= set(names)
        assert all(i.date_time == (1980, 1, 1, 0, 0, 0) for i in archive.infolist())
        wheel = archive.read(f"{info}/WHEEL").decode()
        assert "Root-Is-Purelib: true" in wheel and "Tag: py3-none-any" in wheel
        metadata = archive.read(f"{info}/METADATA").decode()
        assert "Name: trtllm-entrypoint\n" in metadata and "Version: 1.2.3\n" in metadata
        assert "Requires-Python: >=3.10" in metadata
        assert (
            archive.read(f"{info}/entry_points.txt").decode()
            == "[console_scripts]\ntrtllm-entrypoint = trtllm_entrypoint.main:main\n"
        )
        rows = list(csv.reader(io.StringIO(archive.read(f"{info}/RECORD").decode())))
        assert sorted(row[0] for row in rows) == sorted(names)
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = archive.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={expected}", len(data))


@pytest.mark.process
def test_pip_installs_it_offline_with_the_console_script(project, tmp_path):
    wheel = build_wheel(project, dest=tmp_path / "dist")
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    script = target / "bin" / "trtllm-entrypoint"
    assert "from trtllm_entrypoint.main import main" in script.read_text()
    result = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout == "hello from the entrypoint\n"


def test_the_real_entrypoints_project_builds(tmp_path):
    wheel = build_wheel(dest=tmp_path)
    assert wheel.name.startswith("trtllm_entrypoint-") and wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "trtllm_entrypoint/contract.py" in names
    sources = sorted((ENTRYPOINTS_DIR / "trtllm_entrypoint").rglob("*.py"))
    assert {p.relative_to(ENTRYPOINTS_DIR).as_posix() for p in sources} <= names
    # setuptools (pip install -e) takes only the packages named, subpackages included: every folder is listed.
    folders = {p.parent.relative_to(ENTRYPOINTS_DIR).as_posix().replace("/", ".") for p in sources}
    assert folders == set(read_project(ENTRYPOINTS_DIR / "pyproject.toml")["packages"])


def test_pyproject_without_version_is_a_build_error(project, tmp_path):
    path = project / "pyproject.toml"
    path.write_text(PYPROJECT.replace('version = "1.2.3"\n', ""))
    with pytest.raises(Error, match="version"):
        build_wheel(project, dest=tmp_path / "dist")
    assert not (tmp_path / "dist").exists()


def test_missing_package_is_a_build_error(project, tmp_path):
    shutil.rmtree(project / "trtllm_entrypoint")
    with pytest.raises(Error, match="package trtllm_entrypoint not found"):
        build_wheel(project, dest=tmp_path / "dist")
