"""Every test belongs to exactly one layer, a pytest marker, so a run can pick the layers it has time for.

  pure         in-process only: starts no program (the fast layer, `python -m pytest -m pure`)
  process      starts programs: the entrypoint as its own process, build.py, git, hadolint, a nested pytest, …
  real_server  runs the real tritonserver (the real_triton fixture), with our OpenAI front where it is tested
  docker       needs a Docker engine: everything under tests/docker

A test with no layer marker is pure unless it uses a real-server fixture; `process` is written on the test (or as
its module's pytestmark). A pure test that starts a program fails, naming the program: mark it `process`. Two layers
on one test, or a layer that contradicts the fixtures it uses, stop the run at collection. Loaded by tests/conftest.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

LAYERS = ("pure", "process", "real_server", "docker")  # described in pyproject.toml [tool.pytest.ini_options]
REAL_SERVER_FIXTURES = frozenset({"real_triton"})
DOCKER_DIR = Path(__file__).parent / "docker"


def layer_of(marked: Iterable[str], fixtures: Iterable[str], path: Path) -> str:
    """The one layer of a test with these layer markers and fixtures, in this file; UsageError when they disagree."""
    marked = sorted(set(marked) & set(LAYERS))
    implied = (
        "docker" if DOCKER_DIR in path.parents else "real_server" if REAL_SERVER_FIXTURES & set(fixtures) else None
    )
    if len(marked) > 1:
        raise pytest.UsageError(f"marked with {len(marked)} layers ({', '.join(marked)}); a test has one")
    if marked and implied and marked[0] != implied:
        raise pytest.UsageError(
            f"marked {marked[0]}, but its {'folder makes' if implied == 'docker' else 'fixtures make'} it {implied}"
        )
    return marked[0] if marked else implied or "pure"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Before `-m` selects (conftest hooks run before pytest's own)."""
    problems = []
    for item in items:
        marked = [name for name in LAYERS if item.get_closest_marker(name)]
        try:
            layer = layer_of(marked, getattr(item, "fixturenames", ()), Path(item.path))
        except pytest.UsageError as exc:
            problems.append(f"{item.nodeid}: {exc}")
            continue
        if layer not in marked:
            item.add_marker(layer)
    if problems:
        raise pytest.UsageError("test layers (tests/layers.py):\n  " + "\n  ".join(problems))


class _Spawned(BaseException):
    """Raised where a pure test starts a program; a BaseException so that `except Exception` cannot hide it."""


@pytest.fixture(autouse=True)
def _pure_tests_start_no_program(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    if request.node.get_closest_marker("pure") is None:
        yield
        return
    started: list[str] = []

    def refuse(self, args, *rest, **kwargs):
        program = args if isinstance(args, str) else " ".join(map(str, list(args)[:3]))
        started.append(program)
        raise _Spawned(f"a pure test started {program!r}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
    if started:
        pytest.fail(f"this test starts programs ({'; '.join(started)}): mark it @pytest.mark.process", pytrace=False)
