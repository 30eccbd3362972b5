"""Every test has exactly one layer (tests/layers.py), and a pure test that starts a program fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import layers

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__)
SAMPLE = """
import subprocess

import pytest

def test_in_process():
    assert sum([1, 2]) == 3

def test_starts_a_program():
    subprocess.run(["true"], check=True)

@pytest.mark.process
def test_marked_process_starts_a_program():
    subprocess.run(["true"], check=True)

def test_hides_the_start():
    try:
        subprocess.run(["true"], check=True)
    except Exception:
        pass
"""


@pytest.mark.parametrize(
    "marked, fixtures, path, layer",
    [
        ((), (), HERE, "pure"),
        (("process",), ("tmp_path",), HERE, "process"),
        ((), ("tmp_path", "real_triton"), HERE, "real_server"),
        (("real_server",), ("real_triton",), HERE, "real_server"),
        ((), (), REPO / "tests" / "docker" / "test_e2e.py", "docker"),
        (("skipif", "parametrize"), (), HERE, "pure"),
    ],
)
def test_each_test_gets_one_layer(marked, fixtures, path, layer):
    assert layers.layer_of(marked, fixtures, path) == layer


@pytest.mark.parametrize(
    "marked, fixtures, path, message",
    [
        (("pure", "process"), (), HERE, "marked with 2 layers (process, pure)"),
        (("process",), ("real_triton",), HERE, "marked process, but its fixtures make it real_server"),
        (("pure",), (), REPO / "tests" / "docker" / "test_e2e.py", "marked pure, but its folder makes it docker"),
    ],
)
def test_layers_that_disagree_are_refused(marked, fixtures, path, message):
    with pytest.raises(pytest.UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layers.layer_of(marked, fixtures, path)


@pytest.mark.process
def test_a_pure_test_that_starts_a_program_fails_even_when_it_catches_the_refusal(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rA",
            "-p",
            "tests.layers",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
        ]
        + ["-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path / "test_sample.py")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("PASSED") and line.endswith("::test_in_process") for line in lines)
    assert any(line.startswith("PASSED") and line.endswith("::test_marked_process_starts_a_program") for line in lines)
    for name in ("test_starts_a_program", "test_hides_the_start"):
        assert any(f"::{name} - " in line and line.startswith(("FAILED", "ERROR")) for line in lines), name
    assert "mark it @pytest.mark.process" in result.stdout


@pytest.mark.process
def test_every_test_of_the_suite_has_exactly_one_layer():
    """Collection refuses two layers on one test (a UsageError, exit 4); no test is left without one."""
    layers_expression = " or ".join(layers.LAYERS)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-m", f"not ({layers_expression})", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, result.stdout + result.stderr
    assert "deselected" in result.stdout.splitlines()[-1]
