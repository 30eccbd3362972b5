"""Fixtures shared by the test suites."""

from __future__ import annotations

import os

import pytest

from harness import realtriton
from tests.ci_skips import pytest_runtest_logreport, pytest_sessionfinish  # noqa: F401  (hooks: CI's allowed skips)
from tests.layers import _pure_tests_start_no_program, pytest_collection_modifyitems  # noqa: F401  (test layers)


@pytest.fixture(scope="session")
def real_triton() -> realtriton.Layout:
    """The real tritonserver 2.51.0 from PyPI's nvidia-pytriton wheel, unpacked on this host (harness/realtriton.py).
    Skips with one line when it cannot run here; under CI=true that is a failure instead."""
    try:
        return realtriton.host_layout()
    except realtriton.RealTritonUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, so the real tritonserver must run: {exc}")
        pytest.skip(f"real tritonserver {realtriton.TRITON_VERSION} unavailable: {exc}")
