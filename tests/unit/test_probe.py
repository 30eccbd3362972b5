import json
import platform
from pathlib import Path
from types import SimpleNamespace

import pytest

from trtllm_entrypoint.config import image_facts
from trtllm_entrypoint.config.image_facts import ImageFacts, installation
from trtllm_entrypoint.inspection import probe as probe_mod
from trtllm_entrypoint.inspection.probe import probe


def touch(path: Path, executable: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    if executable:
        path.chmod(0o755)
    return path


@pytest.fixture
def image(tmp_path, monkeypatch):
    """A fake image root: /app layout, Triton files and programs, none of them on the host's real paths."""
    app = tmp_path / "app"
    (app / "all_models" / "inflight_batcher_llm").mkdir(parents=True)
    touch(app / "tools" / "fill_template.py")
    tritonserver = touch(tmp_path / "opt" / "tritonserver" / "bin" / "tritonserver", executable=True)
    openai = touch(tmp_path / "opt" / "tritonserver" / "python" / "openai" / "openai_frontend" / "main.py")
    version_file = tmp_path / "opt" / "tritonserver" / "TRITON_VERSION"
    version_file.write_text("2.54.0\n")
    monkeypatch.setattr(probe_mod.contract, "TRITONSERVER", str(tritonserver))
    monkeypatch.setattr(probe_mod.contract, "OPENAI_FRONTEND_MAIN", str(openai))
    monkeypatch.setattr(probe_mod.contract, "NGC_APP_DIR", str(tmp_path / "no-app"))
    monkeypatch.setattr(probe_mod.contract, "BUNDLED_APP_DIR", str(tmp_path / "bundled"))
    monkeypatch.setattr(probe_mod, "TRITON_VERSION_FILE", str(version_file))
    bin_dir = tmp_path / "bin"
    touch(bin_dir / "trtllm-build", executable=True)
    return SimpleNamespace(root=tmp_path, app=app, tritonserver=tritonserver, bin_dir=bin_dir)


def test_probe_reports_files_and_programs_of_the_image(image, monkeypatch):
    ssh = touch(image.bin_dir / "ssh", executable=True)
    sshd = touch(image.root / "usr" / "sbin" / "sshd", executable=True)
    monkeypatch.setattr(probe_mod.group, "SSHD", str(sshd))  # the fixed path the worker execs
    facts = ImageFacts(
        tag="25.01",
        tensorrt_llm="0.17.0",
        tensorrt=None,
        triton="2.54.0",
        workflows=("engine",),
        engine_deprecated=False,
        openai_frontend=True,
        app_dir=image.app,
    )
    report = probe(installation({"PATH": str(image.bin_dir)}, facts))
    assert report["tag"] == "25.01"
    assert report["app_dir"] == str(image.app)
    assert report["templates"] == {"inflight_batcher_llm": True, "llmapi": False}
    assert report["fill_template"] is True
    assert report["programs"] == {
        "tritonserver": str(image.tritonserver),
        "trtllm-build": str(image.bin_dir / "trtllm-build"),
        "mpirun": None,
        "ssh": str(ssh),
        "sshd": str(sshd),
    }
    assert report["openai_frontend"] is True
    assert report["triton"] == "2.54.0"
    assert report["python"] == platform.python_version()
    assert json.loads(json.dumps(report)) == report


def test_versions_come_from_the_install_not_the_matrix(image, monkeypatch):
    installed = {"tensorrt_llm": "0.17.0.post1", "tensorrt_cu12": "10.8.0.43", "huggingface_hub": "0.30.2"}
    monkeypatch.setattr(probe_mod, "installed_version", installed.get)
    monkeypatch.setattr(image_facts, "installed_version", installed.get)
    facts = ImageFacts(
        tag="25.01",
        tensorrt_llm="9.9.9",
        tensorrt="9.9",
        triton="9.9",
        workflows=("engine",),
        engine_deprecated=False,
        openai_frontend=True,
        app_dir=image.app,
    )
    report = probe(installation({"PATH": "", "TRITON_SERVER_VERSION": "2.54.0"}, facts))
    assert (report["tensorrt_llm"], report["tensorrt"], report["huggingface_hub"]) == (
        "0.17.0.post1",
        "10.8.0.43",
        "0.30.2",
    )
    assert report["triton"] == "2.54.0"


def test_probe_without_matrix_tag_or_image_files(image, monkeypatch):
    monkeypatch.setattr(probe_mod, "installed_version", lambda name: None)
    monkeypatch.setattr(image_facts, "installed_version", lambda name: None)
    monkeypatch.setattr(probe_mod.contract, "TRITONSERVER", str(image.root / "missing"))
    monkeypatch.setattr(probe_mod.contract, "OPENAI_FRONTEND_MAIN", str(image.root / "missing"))
    monkeypatch.setattr(probe_mod, "TRITON_VERSION_FILE", str(image.root / "missing"))
    monkeypatch.setattr(probe_mod.group, "SSHD", str(image.root / "missing"))
    report = probe(installation({"PATH": ""}, None))
    assert report["tag"] is None
    assert report["app_dir"] == str(image.root / "bundled")
    assert report["templates"] == {"inflight_batcher_llm": False, "llmapi": False}
    assert report["fill_template"] is False
    assert report["programs"] == dict.fromkeys(("tritonserver", "trtllm-build", "mpirun", "ssh", "sshd"))
    assert (report["tensorrt_llm"], report["tensorrt"], report["triton"], report["openai_frontend"]) == (
        None,
        None,
        None,
        False,
    )


def test_app_dir_without_facts(image, monkeypatch):
    given = {"TRTLLM_APP_DIR": str(image.app), "MATRIX_TAG": "25.01"}
    assert probe(installation(given, None))["app_dir"] == str(image.app)
    assert probe(installation({"MATRIX_TAG": "25.01"}, None))["tag"] == "25.01"
    monkeypatch.setattr(probe_mod.contract, "NGC_APP_DIR", str(image.app))
    assert probe(installation({}, None))["app_dir"] == str(image.app)


def test_programs_are_found_where_launch_looks_for_them(image, monkeypatch):
    # launch execs contract.TRITONSERVER and `mpirun` from PATH: a tritonserver elsewhere on PATH does not count.
    touch(image.bin_dir / "tritonserver", executable=True)
    on_path = touch(image.bin_dir / "mpirun", executable=True)
    monkeypatch.setattr(probe_mod.contract, "TRITONSERVER", str(image.root / "missing"))
    programs = probe(installation({"PATH": str(image.bin_dir)}, None))["programs"]
    assert programs["tritonserver"] is None and programs["mpirun"] == str(on_path)
