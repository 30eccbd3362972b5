"""GitHub Actions workflows: pinned actions, least privilege, pushes only from main/release tags, real CLI options."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from trtllm_images import capabilities, matrix

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))
PINNED = re.compile(r"^\s*(?:-\s+)?uses:\s+[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+\s*$")
SHELL_OPERATORS = {">", ">>", "|", "||", "&&", ";", "2>&1"}


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def steps(workflow: dict):
    for job_name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_name, job, step


def commands(run: str) -> list[str]:
    """Shell lines of a `run:` block, with backslash continuations joined."""
    return [line.strip() for line in run.replace("\\\n", " ").splitlines() if line.strip()]


def cli_invocations(workflow: dict) -> list[list[str]]:
    """Arguments after `build.py` in every run line that calls our CLI, up to the first shell operator."""
    found = []
    for _, _, step in steps(workflow):
        for line in commands(step.get("run", "")):
            words = shlex.split(line)
            if "build.py" in words:
                args = words[words.index("build.py") + 1 :]
                cut = next((i for i, word in enumerate(args) if word in SHELL_OPERATORS), len(args))
                found.append(args[:cut])
    return found


def test_workflows_exist_and_load():
    assert {p.name for p in FILES} >= {"ci.yml", "images.yml"}
    for path in FILES:
        workflow = load(path)
        triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
        assert triggers and workflow["jobs"], path.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_commit_with_its_version(path):
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if re.match(r"^\s*(-\s+)?uses:", line)]
    assert lines
    assert [line for line in lines if not PINNED.match(line)] == []


# Write permissions beyond reading the repository, each allowed only in a job that needs it (the step that uses it).
WRITES = {
    ("packages", "write"): lambda step: _pushes(step),
    ("id-token", "write"): lambda step: "cosign sign" in step.get("run", ""),
    ("attestations", "write"): lambda step: step.get("uses", "").startswith("actions/attest-"),
    ("contents", "write"): lambda step: "git push" in step.get("run", ""),
    ("pull-requests", "write"): lambda step: "gh pr create" in step.get("run", ""),
}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_least_privilege(path):
    workflow = load(path)
    assert workflow["permissions"] in ({"contents": "read"}, {})
    assert "concurrency" in workflow
    for job_name, job in workflow["jobs"].items():
        permissions = job.get("permissions", {})
        assert set(permissions.items()) <= {("contents", "read"), *WRITES}, job_name
        for grant in set(permissions.items()) & set(WRITES):
            assert any(WRITES[grant](step) for step in job["steps"]), f"{job_name} has {grant} but never uses it"
    for job_name, _, step in steps(workflow):
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step.get("with", {}).get("persist-credentials") is False, job_name


def _pushes(step: dict) -> bool:
    return "--push" in step.get("run", "") or step.get("uses", "").startswith("docker/login-action@")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_only_main_and_release_tags_push(path):
    workflow = load(path)
    for job_name, job, step in steps(workflow):
        if not _pushes(step):
            continue
        assert job.get("permissions", {}).get("packages") == "write", job_name
        condition = step.get("if", "")
        if "env.PUSH" in condition:
            condition = job["env"]["PUSH"]
        assert "github.event_name == 'push'" in condition, (job_name, step.get("name"))
        assert "refs/heads/main" in condition and "startsWith(github.ref, 'refs/tags/v')" in condition


def test_every_pushed_image_is_scanned_before_it_is_signed_and_attested_and_releases_take_only_pinned_sources():
    workflow = load(WORKFLOWS / "images.yml")
    build = workflow["jobs"]["build"]
    names = [step.get("name", step.get("uses", "")) for step in build["steps"]]
    for kind in ("server", "builder", "group"):  # the group image: `--multinode` in every build step
        order = [names.index(f"{what} ({kind})") for what in ("SBOM", "Vulnerability scan", "Provenance")]
        assert order == sorted(order) and names.index("Sign") > order[1], kind
        assert f"Attest SBOM ({kind})" in names
    scans = [step for step in build["steps"] if step.get("uses", "").startswith("anchore/scan-action@")]
    assert {(s["with"]["severity-cutoff"], s["with"].get("fail-build", True)) for s in scans} == {("critical", True)}
    pushing = [step for step in build["steps"] if "--push" in step.get("run", "")]
    release = [
        step for step in pushing if "startsWith(github.ref, 'refs/tags/v')" in step["if"] and "!" not in step["if"]
    ]
    assert len(release) == 1 and "--require-pinned" in release[0]["run"]
    builds = [step["run"] for step in build["steps"] if step.get("run", "").startswith("python build.py --tag")]
    assert len(builds) == 3 and all("--multinode" in run for run in builds)
    assert all("--require-pinned" not in step["run"] for step in pushing if step not in release)


def test_ci_checks_the_workflows_with_actionlint_and_zizmor():
    lint = load(WORKFLOWS / "ci.yml")["jobs"]["lint"]
    run = "\n".join(step.get("run", "") for step in lint["steps"])
    ci_run = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    for tool in ("actionlint", "zizmor --offline"):
        assert tool in run and tool in ci_run


def test_image_matrix_comes_from_build_py_list():
    workflow = load(WORKFLOWS / "images.yml")
    build = workflow["jobs"]["build"]
    producer = build["needs"]
    assert build["strategy"]["fail-fast"] is False
    assert build["strategy"]["matrix"] == f"${{{{ fromJSON(needs.{producer}.outputs.matrix) }}}}"
    assert ["list", "--json"] in cli_invocations({"jobs": {producer: workflow["jobs"][producer]}})
    assert any("--tag" in args and "--registry" in args for args in cli_invocations({"jobs": {"build": build}}))


@pytest.mark.process
def test_matrix_script_emits_the_supported_tags(tmp_path):
    """Run the workflow's own snippet on what `build.py list --json` prints (matrix.image_matrix_json)."""
    workflow = load(WORKFLOWS / "images.yml")
    run = next(step["run"] for _, _, step in steps(workflow) if step.get("id") == "tags")
    script = textwrap.dedent(run.split("<<'PY'\n", 1)[1].rsplit("PY", 1)[0])
    the_matrix = matrix.load()
    listing = tmp_path / "matrix.json"
    listing.write_text(matrix.image_matrix_json(the_matrix, capabilities.load_capabilities()), encoding="utf-8")
    result = subprocess.run([sys.executable, "-", str(listing)], input=script, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    key, _, value = result.stdout.strip().partition("=")
    assert key == "matrix" and json.loads(value) == {"tag": [e.tag for e in the_matrix.supported()]}


def test_referenced_scripts_exist():
    referenced = {
        word
        for path in FILES
        for _, _, step in steps(load(path))
        for line in commands(step.get("run", ""))
        for word in shlex.split(line)
        if word.startswith(".ci/")
    }
    assert ".ci/run" in referenced
    for script in referenced:
        assert (REPO / script).is_file(), f"{script} is referenced by a workflow but missing"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_cli_invocations_use_existing_options(path):
    import click

    from trtllm_images.cli import cli

    invocations = cli_invocations(load(path))
    for args in invocations:
        command, rest = cli, args
        if args and args[0] in cli.commands:
            command, rest = cli.commands[args[0]], args[1:]
        try:
            command.make_context("build.py", list(rest), resilient_parsing=False)
        except click.UsageError as exc:
            pytest.fail(f"{path.name}: `build.py {' '.join(args)}`: {exc.format_message()}")
