"""Everything that can be checked from the settings, the model source and the file system, in one pass before the
first write or the first expensive step (download, engine build). Each failure is a UsageError: one line, exit 2.

`check` is the pass; each rule is a small function of values, so tests can exercise them one by one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_entrypoint.config.environment import bad
from trtllm_entrypoint.engine import config as engine_config
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.launch import supervise
from trtllm_entrypoint.model import chat_templates
from trtllm_entrypoint.model import files as model_files
from trtllm_entrypoint.model.locate import TOKENIZER_FILES
from trtllm_entrypoint.repository import fill
from trtllm_entrypoint.repository import write as repository
from trtllm_entrypoint.storage import publish
from trtllm_entrypoint.storage.paths import CacheLayout

if TYPE_CHECKING:
    from trtllm_entrypoint.config.image_facts import ImageFacts
    from trtllm_entrypoint.config.settings import Settings
    from trtllm_entrypoint.engine.config import BuiltEngine
    from trtllm_entrypoint.launch.plan import Located
    from trtllm_entrypoint.model.locate import ModelSource

# Read by the tokenizer next to TOKENIZER_FILES when present.
TOKENIZER_JSON = ("special_tokens_map.json", "added_tokens.json", "generation_config.json", "chat_template.json")


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def overlaps(a: Path, b: Path) -> bool:
    """Equal, or one inside the other (after resolving symbolic links)."""
    a, b = _real(a), _real(b)
    return a == b or a in b.parents or b in a.parents


def named_paths(settings: Settings, source: ModelSource, model_dir: Path | None = None) -> dict[str, Path]:
    """The directories the user named (or that default), by the variable that names them; read-only inputs last.
    `model_dir`: MODEL_ID's own directory (Located.model_dir)."""
    paths = {
        "REPOSITORY_DIR": settings.repository_dir,
        "CACHE_DIR": settings.cache_dir,
        "ENGINE_DIR": settings.engine_dir,
        "TEMPLATES_DIR": settings.templates_dir,
    }
    model = source.path if settings.engine_dir is None and source.repo_id is None else None
    if settings.engine_dir is not None and model_dir is not None:
        model = model_dir
    paths["MODEL_ID"] = model
    return {name: path for name, path in paths.items() if path is not None}


def _published_by_cache(path: Path, cache_dir: Path) -> bool:
    return any(_real(sub) in _real(path).parents for sub in CacheLayout(cache_dir).published())


def check_overlaps(paths: dict[str, Path]) -> None:
    """What we write (the repository, the cache) shares no directory with anything else: writing or replacing it
    must never touch a model, an engine or templates. Read-only inputs may overlap each other."""
    names = list(paths)  # REPOSITORY_DIR and CACHE_DIR first: each pair is checked once, from its written side
    for i, name in enumerate(n for n in names if n in ("REPOSITORY_DIR", "CACHE_DIR")):
        for other in names[i + 1 :]:
            path = paths[other]
            if not overlaps(paths[name], path):
                continue
            if name == "CACHE_DIR" and _published_by_cache(path, paths[name]):
                continue  # e.g. ENGINE_DIR=<CACHE_DIR>/engines/<key>, printed by build-engine
            raise bad(
                name,
                paths[name],
                f"a directory apart from {other}={str(path)!r} (not the same, not inside "
                "it, not containing it): it is written, and must never touch what it is "
                "given",
            )


def check_repository_dir(path: Path | None) -> None:
    """An explicit REPOSITORY_DIR is absent, empty, or a repository we wrote: anything else is the user's."""
    if path is None or not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        kind = "a symbolic link" if path.is_symlink() else "not a directory"
        raise bad("REPOSITORY_DIR", path, f"an absent or empty directory (this is {kind})")
    if os.path.ismount(path):  # a new copy is renamed into place, which a mount point refuses
        raise bad(
            "REPOSITORY_DIR",
            path,
            "a directory that is not itself a mount point (mount the volume at its "
            "parent and name a directory inside it)",
        )
    if publish.is_ours(path, repository.STAMP):
        repository.refuse_user_files(path)
    elif not publish.is_empty_dir(path):
        raise UsageError(
            f"REPOSITORY_DIR={str(path)!r} is not allowed: it is not empty and was not written by "
            "trtllm-entrypoint, so it is never replaced",
            "point REPOSITORY_DIR at an absent or empty directory, or leave it unset",
        )


def tokenizer_dir(
    settings: Settings, source: ModelSource, engine_dir: Path | None = None, model_dir: Path | None = None
) -> Path:
    """Where the pre/postprocessing models find the Hugging Face tokenizer: the model, the engine, or (the seeds'
    layout: ENGINE_DIR plus MODEL_ID) the checkpoint the engine was built from, MODEL_ID's own directory."""
    candidates: list[Path] = []
    for path in (source.path, engine_dir, model_dir):
        if path is not None and path not in candidates:
            candidates.append(path)
    for path in candidates:
        if any(os.path.lexists(path / name) for name in TOKENIZER_FILES):
            check_tokenizer_files(path)
            return path
    where = "beside the engine" if settings.engine_dir else "into the checkpoint directory"
    hint = (
        f"copy the tokenizer files {where}"
        if settings.model_id
        else f"set MODEL_ID to the Hugging Face checkpoint, or copy the tokenizer files {where}"
    )
    raise UsageError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {', '.join(map(str, candidates))}", hint)


def check_tokenizer_files(path: Path) -> None:
    """The tokenizer files the pre/postprocessing models load: regular, bounded, and JSON objects where JSON."""
    for name in TOKENIZER_FILES + TOKENIZER_JSON:
        file = path / name
        if not os.path.lexists(file):
            continue
        if name.endswith(".json"):
            model_files.read_json_object(file)
        else:
            model_files.read_bytes(file)


def has_chat_template(tokenizer: Path) -> bool:
    """Whether the front finds a chat template beside the tokenizer (chat_templates: as transformers looks)."""
    return bool(chat_templates.discover(tokenizer).templates)


def check_chat_template(tokenizer: Path, env: Mapping[str, str]) -> str:
    """FRONTEND=openai: the model's chat templates compile in the front's environment, checked by the front's own code
    with the front's Python and path (chat_templates.check_with); one line and exit 2 when they do not."""
    return chat_templates.check_with(tokenizer, sys.executable or "python3", supervise.front_path_environ(env))


def check_prebuilt_engine(settings: Settings, engine: BuiltEngine, installed: str) -> None:
    """All ranks present; built by this TensorRT-LLM, unless MODEL_ID names the checkpoint to rebuild it from (its
    limits against the settings: serve_plan.decide_serve_plan, which takes them)."""
    missing = engine.missing_ranks()
    if missing:
        raise UsageError(
            f"the engine in {engine.path} was built for {engine.world_size} ranks but has no {', '.join(missing)}",
            "copy every rank<N>.engine file that trtllm-build wrote",
        )
    try:
        engine_config.check_engine_version(engine, installed)
    except EntrypointError:
        if settings.model_id:
            return  # rebuilt from the checkpoint, with the settings' own limits
        raise


def check(settings: Settings, facts: ImageFacts, located: Located) -> None:
    """The one pass, before anything is written or downloaded."""
    source = located.source
    check_overlaps(named_paths(settings, source, located.model_dir))
    check_repository_dir(settings.repository_dir)
    if source.kind != "repository":  # a prebuilt engine is served by the engine workflow whatever the default
        fill.workflow_templates(settings.templates_dir, "engine" if source.kind == "engine" else settings.workflow)
    if located.built is not None:
        check_prebuilt_engine(settings, located.built, facts.tensorrt_llm)
    rebuilt_from_hub = source.kind == "engine" and settings.model_id and located.model_dir is None
    if source.path is not None and source.kind != "repository" and not rebuilt_from_hub:
        tokenizer_dir(settings, source, model_dir=located.model_dir)
