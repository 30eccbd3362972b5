"""Version thresholds live in the data (matrix.yaml, capabilities.yaml, models.yaml) and in the modules that load it;
the rest of both packages branches on named capabilities."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (REPO / "trtllm_images", REPO / "entrypoints" / "trtllm_entrypoint")
# The modules that load the data and turn versions into names.
LOADERS = {REPO / "trtllm_images" / "matrix.py", REPO / "trtllm_images" / "capabilities.py"}
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
VERSION_CALLS = {"version_tuple", "Version", "parse_version", "LooseVersion", "StrictVersion"}
VERSION_TEXT = re.compile(r"^\d+\.\d+(\.\d+)*")


def _is_version(node: ast.expr) -> bool:
    """A version on one side of a comparison: version_tuple(...)/Version(...) (also subscripted), a literal tuple of
    integers such as (0, 20), or a string literal such as "0.20.0" or "25.01"."""
    if isinstance(node, ast.Subscript):
        return _is_version(node.value)
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in VERSION_CALLS
    if isinstance(node, ast.Tuple):
        return bool(node.elts) and all(isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(VERSION_TEXT.match(node.value))


def version_comparisons(source: str) -> list[int]:
    """Line numbers of <, <=, >, >= comparisons with a version on either side."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, (left, right) in zip(node.ops, zip(operands, operands[1:], strict=False), strict=True):
                if isinstance(op, ORDERING) and (_is_version(left) or _is_version(right)):
                    lines.append(node.lineno)
    return lines


def test_the_detector_finds_each_kind_of_threshold():
    samples = [
        "version_tuple(v) >= (0, 20)",
        "release < (0, 11)",
        "Version(v) < Version('1.0')",
        "version_tuple(tag)[:2] > (24, 12)",
        "tag >= '25.01'",
        "packaging.version.Version(a) <= b",
        "(1, 0) <= release",
    ]
    for sample in samples:
        assert version_comparisons(sample) == [1], sample
    for allowed in [
        "version_tuple(a) == version_tuple(b)",
        "len(x) < 3",
        "count >= world_size",
        "version_tuple(v)[:2] in allowed",
        "'llmapi' in workflows",
    ]:
        assert version_comparisons(allowed) == [], allowed


def test_no_version_threshold_outside_the_data_loaders():
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for package in PACKAGES
        for path in sorted(package.rglob("*.py"))
        if path not in LOADERS
        for line in version_comparisons(path.read_text())
    ]
    assert found == [], (
        "compare versions only in the data loaders (matrix.py, capabilities.py); elsewhere branch on a "
        f"named capability from capabilities.yaml: {found}"
    )
