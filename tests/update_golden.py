"""Regenerate the golden Dockerfiles under tests/golden/<tag>/ from matrix.yaml and images/*.j2.

Run `python tests/update_golden.py` after an intended template or matrix change, then review `git diff tests/golden`.
tests/unit/test_render.py compares the same renders with these files byte for byte.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOLDEN_DIR = REPO / "tests" / "golden"
# One of each kind: no /app in the base (24.08), /app (25.01), backend inside TensorRT-LLM (25.06),
# engine workflow deprecated (26.07).
GOLDEN_TAGS = ("24.08", "25.01", "25.06", "26.07")


def render_tag(tag: str) -> dict[str, str]:
    from trtllm_images import matrix, plan, render

    # out_dir only decides where a context would go; it does not appear in the Dockerfiles.
    return render.render(plan.make_plan(matrix.load().get(tag), out_dir=Path(tempfile.gettempdir())))


def main() -> None:
    for tag in GOLDEN_TAGS:
        for name, text in render_tag(tag).items():
            path = GOLDEN_DIR / tag / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8", newline="\n")
            print(path.relative_to(REPO))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
