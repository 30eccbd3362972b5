"""Dockerfile text for a BuildPlan, from the Jinja2 templates in images/. Pure: reads templates only."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from trtllm_images.plan import BuildPlan

IMAGES_DIR = Path(__file__).resolve().parents[1] / "images"

# The container side's contract (entrypoints/trtllm_entrypoint/contract.py) as the Dockerfiles need it; the two
# packages never import each other, so tests compare these values with that module.
CONTAINER_PATHS = {
    "matrix_file": "/etc/trtllm-images/matrix.json",
    "models_file": "/etc/trtllm-images/models.json",
    "bundled_app_dir": "/opt/trtllm-images/app",
    "cache_dir": "/var/cache/trtllm",
    "http_port": 8000,
    "grpc_port": 8001,
    "metrics_port": 8002,
}

REVISION_LABEL = "org.opencontainers.image.revision"
BASE_NAME_LABEL = "org.opencontainers.image.base.name"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(IMAGES_DIR)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def render(plan: BuildPlan) -> dict[str, str]:
    """Dockerfile name -> text, one per image of the plan."""
    env = environment()
    out = {}
    for spec in plan.images:
        labels = plan.image_labels(spec.kind)
        # Expanded by Docker, so the label names the image actually used even when BASE_IMAGE is overridden.
        labels[BASE_NAME_LABEL] = "${BASE_IMAGE}"
        revision = {REVISION_LABEL: labels.pop(REVISION_LABEL)} if REVISION_LABEL in labels else {}
        template = env.get_template(spec.dockerfile + ".j2")
        out[spec.dockerfile] = template.render(plan=plan, spec=spec, labels=labels, revision_labels=revision,
                                               paths=CONTAINER_PATHS)
    return out
