"""Regenerate the golden Dockerfiles under tests/golden/<tag>/, one directory per supported tag of matrix.yaml.

Run `python tests/update_golden.py` after an intended template or matrix change, then review `git diff tests/golden`.
It also removes the directories of tags that are no longer supported. tests/unit/test_render.py compares the same
renders with these files byte for byte.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOLDEN_DIR = REPO / "tests" / "golden"
REGENERATE = "python tests/update_golden.py"


def golden_tags() -> list[str]:
    from trtllm_images import matrix

    return [entry.tag for entry in matrix.load().supported()]


def render_tag(tag: str) -> dict[str, bytes]:
    """Dockerfile name -> the exact bytes the golden file must hold."""
    from trtllm_images import matrix, plan, render

    # out_dir only decides where a context would go; it does not appear in the Dockerfiles.
    texts = render.render(plan.make_plan(matrix.load().get(tag), out_dir=Path(tempfile.gettempdir())))
    return {name: text.encode("utf-8") for name, text in texts.items()}


def main() -> None:
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
