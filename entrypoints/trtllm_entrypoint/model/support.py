"""Which models this image serves: a checkpoint's config.json looked up in models.json, before anything is built.

models.json is `python build.py models --json` (from models.yaml), next to matrix.json in the image. For each
Hugging Face model_type it lists the tags that serve it per workflow, the converter folder per examples layout and
the converter arguments per tag, so nothing here compares versions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_entrypoint.errors import UsageError

if TYPE_CHECKING:
    from trtllm_entrypoint.config.image_facts import ImageFacts


@dataclass(frozen=True)
class ModelTable:
    models: tuple[dict[str, Any], ...]
    tags: tuple[str, ...]  # every tag the table was made for, oldest first

    def lookup(self, hf_config: Mapping[str, Any]) -> dict[str, Any] | None:
        """The record for config.json's model_type (or an alias), else for its first known architecture."""
        model_type = str(hf_config.get("model_type") or "")
        for record in self.models:
            if model_type and model_type in (record["model_type"], *record["aliases"]):
                return record
        for arch in hf_config.get("architectures") or []:
            for record in self.models:
                if arch in record["architectures"]:
                    return record
        return None


@dataclass(frozen=True)
class Converter:
    folder: str  # under the app dir's examples/, for this image's layout
    args: tuple[str, ...]  # what this model's converter needs at this tag besides our usual arguments

    def script(self, app_dir: Path) -> Path:
        return app_dir / "examples" / self.folder / "convert_checkpoint.py"

    @classmethod
    def for_record(cls, record: Mapping[str, Any], facts: ImageFacts) -> Converter:
        """A model's converter in this image's examples layout, with the arguments this tag needs."""
        engine = record["engine"]
        folder = engine["folder"][facts.examples_layout]
        if facts.examples_layout == "models":
            folder = f"models/{folder}"
        return cls(folder, tuple(arg for rule in engine["args"] if facts.tag in rule["tags"] for arg in rule["args"]))


def load(path: Path) -> ModelTable:
    """The model list at `path` (ImageFacts.models_file)."""
    try:
        data = json.loads(path.read_text())
        return ModelTable(tuple(data["models"]), tuple(data["tags"]))
    except FileNotFoundError:
        raise UsageError(
            f"model list {path} does not exist",
            "images built by build.py carry it; elsewhere put `python build.py models --json` there",
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"model list {path} is not what `python build.py models --json` writes: {exc}") from None


def describe(hf_config: Mapping[str, Any]) -> str:
    """How the checkpoint names itself: 'Phi3ForCausalLM (model_type phi3)'."""
    archs = ", ".join(hf_config.get("architectures") or []) or "no architectures"
    return f"{archs} (model_type {hf_config.get('model_type') or 'unset'})"


def _tag_span(tags: list[str], all_tags: tuple[str, ...]) -> str:
    if tags[0] in all_tags and list(all_tags[all_tags.index(tags[0]) :]) == tags:
        return f"tags {tags[0]} and later"
    return "tags " + ", ".join(tags)


def unsupported_reason(table: ModelTable, hf_config: Mapping[str, Any], facts: ImageFacts, workflow: str) -> str | None:
    """None when this image serves the checkpoint with `workflow`; else one line saying what would."""
    record = table.lookup(hf_config)
    support = record[workflow] if record is not None else None
    if support is not None and facts.tag in support["tags"]:
        return None
    if workflow == "llmapi" and support is None:
        return None  # not documented for the LLM API, which registers more architectures than any list names
    name = describe(hf_config)
    here = f"this image ({facts.tag}) has TensorRT-LLM {facts.tensorrt_llm}"
    if record is None:
        return f"{name} has no TensorRT-LLM engine converter in the model list of this image ({facts.tag})"
    other = "llmapi" if workflow == "engine" else "engine"
    if support is None:
        reason = f"{name} has no TensorRT-LLM engine converter in any release; {here}"
    elif not support["tags"]:
        reason = (
            f"{name} needs TensorRT-LLM {support['since']} or later for WORKFLOW={workflow}, which no tag in "
            f"the matrix ships; {here}"
        )
    else:
        reason = (
            f"{name} needs TensorRT-LLM {support['since']} or later for WORKFLOW={workflow} "
            f"({_tag_span(support['tags'], table.tags)}); {here}"
        )
    if record[other] is not None and facts.tag in record[other]["tags"] and other in facts.workflows:
        reason += f"; this image serves it with WORKFLOW={other}"
    return reason


# Where a refused model's way out is found.
SUPPORT_HINT = (
    "`python build.py models NAME` lists the tags that serve a model; or build the engine elsewhere and set ENGINE_DIR"
)


def require_support(table: ModelTable, hf_config: Mapping[str, Any], facts: ImageFacts, workflow: str) -> None:
    reason = unsupported_reason(table, hf_config, facts, workflow)
    if reason is not None:
        raise UsageError(reason, SUPPORT_HINT)


def required(found: Converter | str) -> Converter:
    """`engine_converter`'s answer where an engine must be built: the converter, or the reason as the one error."""
    if isinstance(found, str):
        raise UsageError(found, SUPPORT_HINT)
    return found


def engine_converter(table: ModelTable, hf_config: Mapping[str, Any], facts: ImageFacts) -> Converter | str:
    """The converter of this checkpoint in this image, or why the image has none (one line)."""
    reason = unsupported_reason(table, hf_config, facts, "engine")
    record = table.lookup(hf_config)
    if reason is not None or record is None:  # a record is there when there is no reason; this keeps the types honest
        return reason or f"no converter for {describe(hf_config)} in image {facts.tag}"
    return Converter.for_record(record, facts)
