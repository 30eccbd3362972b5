"""What to build for one matrix entry: base image, image refs, labels, context location. Pure: no I/O.

The plan holds every value the Dockerfiles show: render.py only fills the templates with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_entrypoint.errors import UsageError

if TYPE_CHECKING:
    from trtllm_images.matrix import MatrixEntry

LICENSE = "Apache-2.0"
REVISION_LABEL = "org.opencontainers.image.revision"
BASE_NAME_LABEL = "org.opencontainers.image.base.name"
# Expanded by Docker from the build arg, so the label names the image actually used when BASE_IMAGE is overridden.
BASE_NAME_FROM_BUILD_ARG = "${BASE_IMAGE}"

# kind -> (repository name, Dockerfile name, one-line description)
IMAGE_KINDS = {
    "server": (
        "trtllm-serve",
        "server.Dockerfile",
        "Triton Inference Server with TensorRT-LLM: fetches a model, builds or reuses an engine, serves it",
    ),
    "builder": (
        "trtllm-builder",
        "builder.Dockerfile",
        "TensorRT-LLM engine builder: fetches a model and builds its engine into the cache",
    ),
    "group": (
        "trtllm-serve-group",
        "group.Dockerfile",
        "The server image plus OpenSSH: a pod of a multi-node group, whose ranks start over ssh",
    ),
}
MULTINODE_KINDS = ("group",)  # built with --multinode only, FROM the server image
# What the group image adds: ssh for the leader's mpirun, sshd for each worker (docs/kserve.md, multi-node).
GROUP_PACKAGES = ("openssh-client", "openssh-server")

# Stand-ins of the NGC images (harness/build_standin.py: a real tritonserver with test doubles for the GPU
# programs) are named trtllm-standin… and label themselves with STANDIN_LABEL_PREFIX, which what is built FROM them
# inherits. Images built FROM one say so in their tag, verification takes the Python the stand-in declares, and
# `--push` refuses them: a stand-in can never pass for a real image.
STANDIN_NAME = "trtllm-standin"
STANDIN_LABEL_PREFIX = "io.trtllm-images.standin."
STANDIN_PYTHON_LABEL = STANDIN_LABEL_PREFIX + "python"
STANDIN_TAG_SUFFIX = "-standin"

# Docker reference grammar, simplified: lowercase registry/path components, and a tag of at most 128 characters.
_REGISTRY = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")
_IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_LABEL_VALUE_FORBIDDEN = re.compile(r'["\\\n\r$]')


@dataclass(frozen=True)
class ImageSpec:
    kind: str  # "server" | "builder"
    ref: str  # [<registry>/]trtllm-serve:<tag>-trtllm-<version>
    dockerfile: str  # file name inside the build context; its template is images/<dockerfile>.j2
    labels: dict[str, str]  # the first LABEL instruction, in this order
    revision_labels: dict[str, str]  # the last LABEL instruction (empty without a revision): see _revision_labels


@dataclass(frozen=True)
class BuildPlan:
    entry: MatrixEntry
    base_image: str
    images: tuple[ImageSpec, ...]
    needs_backend_assets: bool  # the base image lacks /app, so the context bundles the backend's files
    context_dir: Path
    group_packages: tuple[str, ...] = GROUP_PACKAGES
    standin: bool = False  # built FROM a stand-in of the NGC image: tagged so, never pushed

    @property
    def buildargs(self) -> dict[str, str]:
        return {"BASE_IMAGE": self.base_image}

    def image(self, kind: str) -> ImageSpec:
        return next(spec for spec in self.images if spec.kind == kind)


def make_build_plan(
    entry: MatrixEntry,
    *,
    base_image: str | None = None,
    registry: str | None = None,
    out_dir: Path,
    revision: str | None = None,
    multinode: bool = False,
) -> BuildPlan:
    """`multinode`: also the group image (the server plus OpenSSH), for `build.py kserve --nodes N`."""
    if not entry.supported:
        raise UsageError(
            f"tag {entry.tag} is not supported: {entry.note}", "`python build.py list` shows the supported tags"
        )
    if not entry.tensorrt_llm:
        raise UsageError(
            f"tag {entry.tag} has no TensorRT-LLM version in the matrix",
            "image names and engine caches depend on it; fill it in matrix.yaml",
        )
    base = entry.base_image if base_image is None else base_image.strip()
    if not base or any(ch.isspace() for ch in base) or _LABEL_VALUE_FORBIDDEN.search(base):
        raise UsageError(
            f"--base-image {base_image!r} is not an image reference",
            "pass something like registry/name:tag, without spaces, quotes or '$'",
        )
    standin = is_standin(base)
    version = f"{entry.tag}-trtllm-{entry.tensorrt_llm}" + (STANDIN_TAG_SUFFIX if standin else "")
    if not _IMAGE_TAG.match(version):
        raise UsageError(f"{version!r} is not a valid Docker tag", "check the tag and tensorrt_llm of this entry")
    kinds = [kind for kind in IMAGE_KINDS if multinode or kind not in MULTINODE_KINDS]
    images = _image_specs(
        kinds, _registry_prefix(registry), version, _labels(entry, version), _revision_labels(revision)
    )
    return BuildPlan(
        entry=entry,
        base_image=base,
        images=images,
        needs_backend_assets=not entry.backend.in_image,
        context_dir=Path(out_dir) / "context" / entry.tag,
        standin=standin,
    )


def is_standin(image: str) -> bool:
    """Whether an image reference names a stand-in of the NGC image: its repository's last part says so."""
    repository = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    return repository.startswith(STANDIN_NAME)


def _image_specs(
    kinds: list[str], prefix: str, version: str, shared: dict[str, str], revision: dict[str, str]
) -> tuple[ImageSpec, ...]:
    specs = []
    for kind in kinds:  # in IMAGE_KINDS' order: the group image is built FROM the server image
        name, dockerfile, description = IMAGE_KINDS[kind]
        labels = {"org.opencontainers.image.title": name, "org.opencontainers.image.description": description, **shared}
        specs.append(ImageSpec(kind, f"{prefix}{name}:{version}", dockerfile, labels, revision))
    return tuple(specs)


def _registry_prefix(registry: str | None) -> str:
    if not registry:
        return ""
    registry = registry.rstrip("/")
    if not _REGISTRY.match(registry):
        raise UsageError(
            f"--registry {registry!r} is not a registry/namespace",
            "use lowercase host[:port][/namespace], e.g. ghcr.io/my-org",
        )
    return registry + "/"


def _labels(entry: MatrixEntry, version: str) -> dict[str, str]:
    """The labels both images share, after their own title and description."""

    def known(value: str | None) -> str:
        return value if value else "unknown"

    labels = {
        "org.opencontainers.image.version": version,
        BASE_NAME_LABEL: BASE_NAME_FROM_BUILD_ARG,
        "org.opencontainers.image.licenses": LICENSE,
        "io.trtllm-images.ngc-tag": entry.tag,
        "io.trtllm-images.triton": known(entry.triton),
        "io.trtllm-images.tensorrt-llm": known(entry.tensorrt_llm),
        "io.trtllm-images.tensorrt": known(entry.tensorrt),
        "io.trtllm-images.cuda": known(entry.cuda),
        "io.trtllm-images.python": known(entry.python),
        "io.trtllm-images.pytorch": known(entry.pytorch),
        "io.trtllm-images.ubuntu": known(entry.ubuntu),
        "io.trtllm-images.backend-repo": entry.backend.repo,
        "io.trtllm-images.backend-ref": entry.backend.ref,
        "io.trtllm-images.workflows": ",".join(entry.workflows),
    }
    _refuse_unquotable(labels, but=BASE_NAME_LABEL)
    return labels


def _revision_labels(revision: str | None) -> dict[str, str]:
    # Its own, last instruction: a new commit then changes only that layer and every earlier one stays cached.
    labels = {REVISION_LABEL: revision} if revision else {}
    _refuse_unquotable(labels)
    return labels


def _refuse_unquotable(labels: dict[str, str], but: str | None = None) -> None:
    """Values go between double quotes in a LABEL instruction, where these characters would break or expand."""
    for key, value in labels.items():
        if key != but and _LABEL_VALUE_FORBIDDEN.search(value):
            raise UsageError(
                f"label {key}={value!r} contains a quote, backslash, '$' or newline",
                "matrix values and --revision must be plain strings",
            )
