"""The stand-in's contents, decided without Docker: which templates, which files, which Dockerfile."""

from __future__ import annotations

import pytest

from tests.standin.build_standin import (OPENAI_MAIN, SCRIPTS_DIR, SHARED_UPSTREAM, TemplatesMissing,
                                         assemble_context, debootstrap_argv, dockerfile_text, spec_for,
                                         upstream_templates)
from trtllm_images.matrix import load

needs_upstream = pytest.mark.skipif(not SHARED_UPSTREAM.is_dir(), reason=f"{SHARED_UPSTREAM} is not on this machine")


@needs_upstream
@pytest.mark.parametrize("version, expected", [
    ("0.17.0.post1", "tensorrtllm_backend/v0.17.0"),
    ("0.18.2", "tensorrtllm_backend/v0.17.0"),      # the newest stored release not newer than the version
    ("0.12.0", "tensorrtllm_backend/v0.12.0"),
    ("1.2.1", "tensorrt_llm/triton_backend/all_models"),
])
def test_upstream_templates_by_version(version, expected):
    assert upstream_templates(version) == SHARED_UPSTREAM / expected


def test_upstream_templates_missing_is_a_skip_reason(tmp_path):
    with pytest.raises(TemplatesMissing):
        upstream_templates("0.17.0", upstream=tmp_path)


@needs_upstream
def test_new_tag_has_app_and_openai_old_tag_has_neither(tmp_path):
    matrix = load()
    new = spec_for(matrix.get("25.01"), tensorrt_llm="0.16.0")
    old = spec_for(matrix.get("24.08"))
    assert (new.tensorrt_llm, new.with_app, new.openai_frontend) == ("0.16.0", True, True)
    assert (old.with_app, old.templates, old.openai_frontend) == (False, None, False)
    new_text = dockerfile_text(new, "/usr/local/lib/python3.11/dist-packages")
    old_text = dockerfile_text(old, "/usr/local/lib/python3.11/dist-packages")
    assert "COPY layout/app/ /app/" in new_text and "/app" not in old_text
    assert OPENAI_MAIN in new_text and OPENAI_MAIN not in old_text
    assert "ENV TRITON_SERVER_VERSION=2.54.0" in new_text and "useradd --uid 1000" in new_text

    context = assemble_context(new, tmp_path, "/usr/local/lib/python3.11/dist-packages")
    assert (context / "layout/app/all_models/inflight_batcher_llm/ensemble/config.pbtxt").is_file()
    assert (context / "layout/site/tensorrt_llm-0.16.0.dist-info/METADATA").is_file()
    assert SCRIPTS_DIR in (context / "layout/bin/trtllm-build").read_text()
    assert not list((context / "doubles").glob("test_*.py"))


def test_debootstrap_is_minimal_with_python_and_pip(tmp_path):
    argv = debootstrap_argv(tmp_path)
    assert argv[:2] == ["debootstrap", "--variant=minbase"] and "bookworm" in argv
    assert "--include=python3,python3-pip,ca-certificates" in argv
