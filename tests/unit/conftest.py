"""Fixtures several test files of tests/unit share: `image`, the image directory (harness.image) a 25.01 image's
entrypoint runs in as its own process."""

from __future__ import annotations

import pytest

from harness.image import Image, templates_for


@pytest.fixture
def image(tmp_path):
    return Image(tmp_path, "25.01", templates_for("v0.17.0"))
