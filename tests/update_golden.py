"""Regenerate the golden Dockerfiles under tests/golden/<tag>/, one directory per supported tag of matrix.yaml, and
docs/environment.md's tables from the variable table (entrypoints/trtllm_entrypoint/config/variables.py).

Run `python tests/update_golden.py` after an intended template, matrix or variable change, then review `git diff`.
It also removes the directories of tags that are no longer supported. tests/unit/test_render.py compares the same
renders with these files byte for byte; tests/unit/test_docs.py compares the tables.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOLDEN_DIR = REPO / "tests" / "golden"
REGENERATE = "python tests/update_golden.py"
ENVIRONMENT_DOC = REPO / "docs" / "environment.md"
ENVIRONMENT_START = "<!-- environment:start"
ENVIRONMENT_END = "<!-- environment:end -->"


def golden_tags() -> list[str]:
    from trtllm_images import matrix

    return [entry.tag for entry in matrix.load().supported()]


def render_tag(tag: str) -> dict[str, bytes]:
    """Dockerfile name -> the exact bytes the golden file must hold."""
    from trtllm_images import matrix, plan, render

    # out_dir only decides where a context would go; it does not appear in the Dockerfiles.
    texts = render.render_dockerfiles(
        plan.make_build_plan(matrix.load().get(tag), out_dir=Path(tempfile.gettempdir()), multinode=True)
    )
    return {name: text.encode("utf-8") for name, text in texts.items()}


def split_environment_doc(text: str) -> tuple[str, str, str]:
    """(before, the generated environment tables, after): the tables start on the line after the start marker."""
    head, _, rest = text.partition(ENVIRONMENT_START)
    marker, _, rest = rest.partition("\n")
    tables, _, tail = rest.partition(ENVIRONMENT_END)
    return head + ENVIRONMENT_START + marker + "\n", tables, ENVIRONMENT_END + tail


def environment_tables() -> str:
    from trtllm_entrypoint.config import variables

    return variables.markdown()


def main() -> None:
    head, _, tail = split_environment_doc(ENVIRONMENT_DOC.read_text())
    ENVIRONMENT_DOC.write_text(head + environment_tables() + tail)
    print(ENVIRONMENT_DOC.relative_to(REPO))
    tags = golden_tags()
    for stale in sorted(p for p in GOLDEN_DIR.iterdir() if p.is_dir() and p.name not in tags):
        shutil.rmtree(stale)
        print(f"removed {stale.relative_to(REPO)}")
    for tag in tags:
        for name, data in render_tag(tag).items():
            path = GOLDEN_DIR / tag / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            print(path.relative_to(REPO))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
