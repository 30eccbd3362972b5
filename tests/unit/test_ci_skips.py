"""CI fails on a skip that .ci/run does not allow (tests/ci_skips.py), and .ci/run's list names real tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ci_skips

REPO = Path(__file__).resolve().parents[2]
SAMPLE = """
import pytest

def test_runs():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_needs_a_tool(n):
    pytest.skip("the tool is missing")
"""


def run_sample(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", ci_skips.VARIABLE)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.ci_skips", "-c", os.devnull, "--rootdir", str(tmp_path)]
        + [str(tmp_path / "test_sample.py")],
        cwd=REPO,
        env={**environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.process
def test_an_unlisted_skip_fails_the_run_under_ci_and_names_the_test(tmp_path):
    result = run_sample(tmp_path, CI="true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "test_sample.py::test_needs_a_tool[1]: Skipped: the tool is missing" in result.stdout


@pytest.mark.process
def test_a_listed_skip_passes_and_outside_ci_nothing_changes(tmp_path):
    allowed = "test_sample.py::test_needs_a_tool | no such tool on CI"
    assert run_sample(tmp_path, CI="true", CI_ALLOWED_SKIPS=allowed).returncode == 0
    assert run_sample(tmp_path).returncode == 0


def test_a_listed_skip_needs_its_reason():
    with pytest.raises(pytest.UsageError, match="is not `<test node id> | <reason>`"):
        ci_skips.allowed_skips("tests/unit/test_x.py::test_y")


def test_every_skip_ci_run_allows_names_an_existing_test_and_says_why():
    script = (REPO / ".ci" / "run").read_text()
    block = re.search(r'export CI_ALLOWED_SKIPS="(.*?)"', script, re.S)
    assert block, ".ci/run exports CI_ALLOWED_SKIPS"
    for node, reason in ci_skips.allowed_skips(block.group(1)).items():
        path, _, name = node.partition("::")
        assert re.search(rf"^def {re.escape(name.split('[')[0])}\(", (REPO / path).read_text(), re.M), node
        assert len(reason) > 20, node
