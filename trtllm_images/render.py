"""Dockerfile text for a BuildPlan, from the Jinja2 templates in images/. Pure: reads templates only."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from trtllm_entrypoint import contract
from trtllm_images.plan import BuildPlan

IMAGES_DIR = Path(__file__).resolve().parents[1] / "images"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(IMAGES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_dockerfiles(plan: BuildPlan) -> dict[str, str]:
    """Dockerfile name -> text, one per image of the plan."""
    env = environment()
    out = {}
    for spec in plan.images:
        template = env.get_template(spec.dockerfile + ".j2")
        out[spec.dockerfile] = template.render(plan=plan, spec=spec, contract=contract)
    return out
