"""A cached repository is reused only when every file is what the image's templates and the fill plan write."""

import os
from pathlib import Path

import pytest

from trtllm_entrypoint.repository import fill, served_code
from trtllm_entrypoint.repository import write as repository

PLAN = fill.FillPlan(
    "engine",
    (
        fill.ModelFill(
            "inflight_batcher_llm/preprocessing", "preprocessing", {"config.pbtxt": 'name: "preprocessing"\n'}
        ),
        fill.ModelFill("inflight_batcher_llm/ensemble", "chat", {"config.pbtxt": 'name: "chat"\n'}),
    ),
)


@pytest.fixture
def templates(tmp_path) -> Path:
    root = tmp_path / "all_models"
    pre = root / "inflight_batcher_llm" / "preprocessing"
    (pre / "1" / "lib").mkdir(parents=True)
    (pre / "config.pbtxt").write_text('name: "${unfilled}"\n')
    (pre / "1" / "model.py").write_text("print('image code')\n")
    (pre / "1" / "lib" / "helpers.py").write_text("HELP = 1\n")
    (pre / "1" / "__pycache__").mkdir()
    (pre / "1" / "__pycache__" / "model.cpython-312.pyc").write_bytes(b"image bytecode is never copied")
    (root / "inflight_batcher_llm" / "ensemble" / "1").mkdir(parents=True)
    (root / "inflight_batcher_llm" / "ensemble" / "1" / ".gitkeep").write_text("")
    return root


def write_plan(templates: Path, dest: Path) -> Path:
    """What write_repository writes (without validation, which the plan's tiny configs would not pass)."""
    dest.mkdir(parents=True)
    for model in PLAN.models:
        repository._copy_tree(templates / model.source, dest / model.name)
        for relative, text in model.files.items():
            (dest / model.name / relative).write_text(text)
    return dest


@pytest.fixture
def cached(tmp_path, templates) -> Path:
    return write_plan(templates, tmp_path / "repositories" / "abc")


def test_an_untouched_repository_has_no_differences(templates, cached):
    assert served_code.changed_files(PLAN, templates, cached) == []


def test_the_serving_python_writes_its_bytecode_beside_the_model_and_that_is_no_difference(templates, cached):
    (cached / "preprocessing" / "1" / "__pycache__").mkdir()
    (cached / "preprocessing" / "1" / "__pycache__" / "model.cpython-312.pyc").write_bytes(b"\x00")
    assert served_code.changed_files(PLAN, templates, cached) == []


@pytest.mark.parametrize(
    "change,named",
    [
        (
            lambda r: (r / "preprocessing/1/model.py").write_text("import os; os.system('x')\n"),
            "preprocessing/1/model.py",
        ),
        (lambda r: (r / "preprocessing/1/lib/helpers.py").unlink(), "preprocessing/1/lib/helpers.py"),
        (lambda r: (r / "preprocessing/1/json.py").write_text("shadow = 1\n"), "preprocessing/1/json.py"),
        (lambda r: (r / "chat/config.pbtxt").write_text('name: "chat"\nbackend: "python"\n'), "chat/config.pbtxt"),
        (lambda r: (r / "evil").mkdir() or (r / "evil" / "config.pbtxt").write_text(""), "evil/config.pbtxt"),
    ],
)
def test_any_changed_missing_or_added_file_is_named(templates, cached, change, named):
    change(cached)
    assert served_code.changed_files(PLAN, templates, cached) == [named]


def test_links_in_the_templates_count_as_what_the_copy_makes_of_them(tmp_path, templates):
    lib = templates / "inflight_batcher_llm" / "preprocessing" / "1" / "lib"
    os.rename(lib, tmp_path / "shared-lib")
    lib.symlink_to(tmp_path / "shared-lib")
    assert served_code.changed_files(PLAN, templates, write_plan(templates, tmp_path / "fresh")) == []


def test_symlinks_never_pass_even_to_identical_content(templates, cached, tmp_path):
    model_py = cached / "preprocessing" / "1" / "model.py"
    copy = tmp_path / "elsewhere.py"
    copy.write_bytes(model_py.read_bytes())
    model_py.unlink()
    model_py.symlink_to(copy)
    lib = cached / "preprocessing" / "1" / "lib"
    os.rename(lib, tmp_path / "lib")
    lib.symlink_to(tmp_path / "lib")
    # The linked directory is not entered: its files count as missing.
    assert served_code.changed_files(PLAN, templates, cached) == [
        "preprocessing/1/lib",
        "preprocessing/1/lib/helpers.py",
        "preprocessing/1/model.py",
    ]


def test_drop_bytecode_removes_every_pycache_and_nothing_else(templates, cached):
    planted = cached / "preprocessing" / "1" / "__pycache__" / "model.cpython-312.pyc"
    planted.parent.mkdir()
    planted.write_bytes(b"planted")
    (cached / "preprocessing" / "1" / "lib" / "__pycache__").mkdir()
    served_code.drop_bytecode(cached)
    assert not list(cached.rglob("__pycache__"))
    assert served_code.changed_files(PLAN, templates, cached) == []


def test_differences_compare_content_both_ways():
    assert served_code.differences({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == ["b", "c"]
    assert served_code.differences({"a": "1"}, {"a": served_code.NOT_A_FILE}) == ["a"]
