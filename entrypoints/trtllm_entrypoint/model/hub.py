"""Fetching a hub model: the one place that talks to the Hugging Face hub, and the only place that imports
huggingface_hub (lazily). What gets downloaded, the hub's errors as one line, progress read from the cache on disk.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.log import Log
from trtllm_entrypoint.model import files as model_files
from trtllm_entrypoint.model import hub_answer, hub_reach
from trtllm_entrypoint.model.chat_templates import NAMED_DIR
from trtllm_entrypoint.model.locate import TOKENIZER_FILES, ModelSource, classify_dir

if TYPE_CHECKING:
    from trtllm_entrypoint.config.settings import Settings

# Small files a checkpoint needs besides weights: configs, tokenizers, and remote-code modules some of them import.
METADATA_FILES = (
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin")
# A check of a hub model's snapshot once its small files are there (the tokenizer's chat template, for the front).
BeforeWeights = Callable[[Path], None]
METADATA_GLOBS = ("tokenizer*", "vocab*", "*.model", "*.tiktoken", "*.py")


def hub_allow_patterns(files: list[str]) -> list[str]:
    """The top-level files of a hub repo to download: configs, tokenizer, and one copy of the weights.

    safetensors win over *.bin; Mistral-style `consolidated*.safetensors` duplicates are skipped when sharded
    safetensors exist. Subfolders (original/, onnx/ …) and other formats (*.pth, *.gguf, *.h5 …) are never taken, but
    for the named chat templates (additional_chat_templates/*.jinja).
    Names are glob-escaped so that each pattern matches exactly its file.
    """
    top = [f for f in files if "/" not in f]
    safetensors = [f for f in top if f.endswith(".safetensors")]
    sharded = [f for f in safetensors if not f.startswith("consolidated")]
    if safetensors:
        weights = sharded or safetensors
        weights += [f for f in top if f.endswith(".safetensors.index.json")]
    else:
        weights = [f for f in top if f.endswith((".bin", ".bin.index.json")) and f != "training_args.bin"]
    metadata = [f for f in top if f in METADATA_FILES or any(fnmatch.fnmatchcase(f, g) for g in METADATA_GLOBS)]
    # The one subfolder taken: the named chat templates transformers keeps beside chat_template.jinja.
    metadata += [f for f in files if f.count("/") == 1 and f.startswith(f"{NAMED_DIR}/") and f.endswith(".jinja")]
    return sorted(glob.escape(f) for f in set(weights) | set(metadata))


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _hub_error(exc: Exception, source: ModelSource) -> EntrypointError | None:
    """One-line error for a failure of the hub client, or None when it is not one."""
    # huggingface_hub.utils exports these in every release since 0.x; huggingface_hub.errors is newer.
    from huggingface_hub import utils as errors

    repo, rev = source.repo_id, source.revision or "main"
    offline_hint = (
        "without network, mount the model and set MODEL_ID to its path, or fill the cache under "
        "CACHE_DIR/models/hub and set HF_HUB_OFFLINE=1"
    )
    names = {cls.__name__ for cls in type(exc).__mro__}
    # Exit codes: what the settings name does not exist or may not be read is a usage error (2: fix MODEL_ID,
    # MODEL_REVISION or HF_TOKEN); a network or hub failure is a runtime failure (1: the same start may work later).
    if isinstance(exc, errors.GatedRepoError):
        return UsageError(
            f"{repo} is a gated model and this token has no access to it",
            f"request access on https://huggingface.co/{repo} and set HF_TOKEN",
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return UsageError(
            f"model {repo} was not found on the Hugging Face hub", "check MODEL_ID; a private model also needs HF_TOKEN"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return UsageError(f"revision {rev!r} of {repo} was not found", "check MODEL_REVISION")
    if isinstance(exc, errors.LocalEntryNotFoundError):
        # Older clients wrap the hub's own failure in this one; that failure says more.
        cause = exc.__cause__ or exc.__context__
        inner = _hub_error(cause, source) if isinstance(cause, Exception) else None
        if inner is not None:
            return inner
        return EntrypointError(f"{repo}@{rev} is not in the local cache and the hub cannot be reached", offline_hint)
    # requests (older hub clients) and httpx (newer) name their network failures like this.
    if isinstance(exc, (ConnectionError, TimeoutError)) or names & {
        "ConnectionError",
        "ConnectError",
        "TransportError",
        "Timeout",
        "TimeoutException",
    }:
        return EntrypointError(f"the Hugging Face hub cannot be reached to fetch {repo}", offline_hint)
    if isinstance(exc, ValueError) and "JSONDecodeError" in names:  # e.g. a proxy's HTML page instead of the API
        return EntrypointError(
            f"the Hugging Face hub's answer about {repo} is not JSON",
            "check the network path to the hub (a proxy or captive portal in between?) and HF_ENDPOINT if set",
        )
    # The hub client's HTTP error, or the HTTP library's own (older clients raise it when a retried status stays).
    status = getattr(getattr(exc, "response", None), "status_code", "unknown")
    if isinstance(exc, errors.HfHubHTTPError) or isinstance(status, int):
        # Only the status: the client's message may quote request details.
        if not isinstance(status, int) or status >= 500 or status == 429:  # the hub's trouble, not the request's
            return EntrypointError(
                f"the Hugging Face hub failed to answer about {repo}: HTTP status {status}",
                "the hub (or a proxy in between) is failing or limiting requests: start again later",
            )
        return UsageError(
            f"the Hugging Face hub refused to serve {repo}: HTTP status {status}",
            "check MODEL_ID, MODEL_REVISION and HF_TOKEN",
        )
    return None


def _repo_id(source: ModelSource) -> str:
    if source.repo_id is None:
        raise ValueError(f"the {source.kind} at {source.path} is not a hub model")
    return source.repo_id


def _quiet_hub() -> None:
    """The hub client's own progress bars and warnings off: carriage-return bars are noise in a log, ours are log
    lines, and its warnings repeat each failed try; a failure reaches the user as our one line."""
    from huggingface_hub import utils

    disable = getattr(utils, "disable_progress_bars", None)  # since huggingface_hub 0.14
    if disable is not None:
        disable()
    utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000:
            return f"{count:.0f}{unit}" if unit == "B" else f"{count:.1f}{unit}"
        count /= 1000
    return f"{count:.1f}TB"


class DownloadProgress:
    """What a hub download has put on disk so far, read from the hub cache's layout (so any client version will
    do): a finished file is linked into `snapshots/<commit>/`, a file in flight grows as `blobs/*.incomplete`.
    Sizes come from the hub's file list; when it leaves one out there is no total, percent or ETA."""

    def __init__(self, repo_dir: Path, commit: str, sizes: dict[str, int | None]):
        self.snapshot = repo_dir / "snapshots" / commit
        self.blobs = repo_dir / "blobs"
        self.names = tuple(sizes)
        self.total = sum(size or 0 for size in sizes.values()) if all(v is not None for v in sizes.values()) else None
        self.already = self.measure()[1]  # files a previous run downloaded do not count toward the rate

    def measure(self) -> tuple[int, int]:
        """(files done, bytes done)."""
        files = done = 0
        for name in self.names:
            with contextlib.suppress(OSError):  # not there yet
                done += (self.snapshot / name).stat().st_size
                files += 1
        for partial in self.blobs.glob("*.incomplete") if self.blobs.is_dir() else ():
            with contextlib.suppress(FileNotFoundError):  # finished (renamed) while we looked
                done += partial.stat().st_size
        return files, done if self.total is None else min(done, self.total)

    def fields(self, elapsed: float) -> dict[str, object]:
        files, done = self.measure()
        rate = (done - self.already) / elapsed if elapsed > 0 else 0.0
        out: dict[str, object] = {"files": f"{files}/{len(self.names)}"}
        if self.total is None:
            return {**out, "bytes": _size(done), "rate": f"{_size(rate)}/s"}
        out["bytes"] = f"{_size(done)}/{_size(self.total)}"
        out["percent"] = round(100 * done / self.total, 1) if self.total else 100.0
        out["rate"] = f"{_size(rate)}/s"
        if rate > 0:  # none before the first byte
            out["eta_s"] = round((self.total - done) / rate)
        return out


def _repo_dir(cache_dir: Path, repo_id: str) -> Path:
    """Where the hub client caches a model repository (its documented cache layout)."""
    return cache_dir / ("models--" + repo_id.replace("/", "--"))


def _fetch(
    source: ModelSource, settings: Settings, cache_dir: Path, log: Log, before_weights: BeforeWeights | None = None
) -> tuple[str, str]:
    """(snapshot directory, resolved commit) from the hub, or from the local cache when HF_HUB_OFFLINE is set.
    `before_weights` gets the snapshot directory once its small files (configs, tokenizer) are there, before any
    weight is downloaded."""
    import huggingface_hub

    _quiet_hub()

    repo_id = _repo_id(source)
    common: dict[str, Any] = {
        "repo_id": repo_id,
        "revision": source.revision,
        "token": settings.hf_token,
        "cache_dir": str(cache_dir),
    }
    if _offline():
        # The file list needs the network; a cached snapshot is served as is, and its folder name is the commit.
        path = huggingface_hub.snapshot_download(**common)
        commit = hub_answer.commit(Path(path).name, repo_id)
        if before_weights is not None:
            before_weights(Path(path))
        return str(path), commit
    hub_reach.check(repo_id, source.revision, settings.hub_endpoint)
    info = huggingface_hub.HfApi().model_info(
        repo_id, revision=source.revision, token=settings.hf_token, files_metadata=True
    )
    # Checked before any of it names a path or reaches a log line.
    commit = hub_answer.commit(getattr(info, "sha", None), repo_id)
    listed = hub_answer.files(getattr(info, "siblings", None), repo_id)
    patterns = hub_allow_patterns(list(listed))
    if not any(p.endswith((".safetensors", ".bin")) for p in patterns):
        raise UsageError(
            f"{source.repo_id} has no *.safetensors or *.bin weights at its top level",
            "choose a repository with Hugging Face weights (GGUF and ONNX files cannot be built)",
        )
    if not set(TOKENIZER_FILES) & set(listed):
        raise UsageError(
            f"{source.repo_id} has no tokenizer files ({', '.join(TOKENIZER_FILES)}) at its top level",
            "choose a repository with the Hugging Face tokenizer; the pre/postprocessing models need it",
        )
    sizes = {name: size for name, size in listed.items() if glob.escape(name) in patterns}
    progress = DownloadProgress(_repo_dir(cache_dir, repo_id), commit, sizes)
    total = {} if progress.total is None else {"total": _size(progress.total)}
    log.info("downloading", repo_id=repo_id, commit=commit, files=len(sizes), **total)
    started = time.monotonic()
    with log.heartbeat("downloading", progress.fields, repo_id=repo_id):
        if before_weights is not None:
            small = [p for p in patterns if not p.endswith(WEIGHT_SUFFIXES)]
            before_weights(
                Path(huggingface_hub.snapshot_download(**{**common, "revision": commit}, allow_patterns=small))
            )
        path = huggingface_hub.snapshot_download(**{**common, "revision": commit}, allow_patterns=patterns)
    seconds = time.monotonic() - started
    fetched = progress.measure()[1] - progress.already
    log.info(
        "download done",
        repo_id=repo_id,
        files=len(sizes),
        bytes=_size(fetched),
        seconds=round(seconds, 1),
        rate=f"{_size(fetched / seconds if seconds > 0 else 0)}/s",
        **({"already_cached": _size(progress.already)} if progress.already else {}),
    )
    return str(path), commit


def read_config(source: ModelSource, settings: Settings) -> dict[str, Any]:
    """config.json of a checkpoint: read from disk, or for a hub model fetched alone (into the same cache the full
    download uses), so that the model can be checked before its weights are downloaded."""
    if source.kind != "hub" and source.path is not None:
        path: Path | str = source.path / "config.json"
    else:
        import huggingface_hub

        _quiet_hub()
        try:
            if not _offline():
                hub_reach.check(_repo_id(source), source.revision, settings.hub_endpoint)
            path = huggingface_hub.hf_hub_download(
                _repo_id(source),
                "config.json",
                revision=source.revision,
                token=settings.hf_token,
                cache_dir=str(settings.cache.hub),
            )
        except Exception as exc:
            error = _hub_error(exc, source) or hub_answer.client_failure(exc, source.repo_id)
            if error is None:
                raise
            raise error from None  # as in download(): the chained traceback could show the token
    config = model_files.read_json_object(Path(path))
    if config is None:
        raise UsageError(f"the config.json of {source.repo_id or source.path} does not exist")
    return model_files.check_names(Path(path), config)


def download(
    source: ModelSource, settings: Settings, log: Log, before_weights: BeforeWeights | None = None
) -> ModelSource:
    """Fetch a hub model into CACHE_DIR/models/hub. The result is local (normally a checkpoint) and keeps repo_id,
    with the resolved commit as revision, so that identity() names the exact weights. `before_weights` checks the
    snapshot's small files before the weights come (what it raises stops the download)."""
    if source.kind != "hub":
        return source
    try:
        path, commit = _fetch(source, settings, settings.cache.hub, log, before_weights)
    except Exception as exc:
        error = _hub_error(exc, source) or hub_answer.client_failure(exc, source.repo_id)
        if error is None:
            raise
        # `from None`: the chained traceback would show request headers, and with them the token.
        raise error from None
    log.info("model fetched", repo_id=source.repo_id, commit=commit, path=path)
    return replace(source, kind=classify_dir(Path(path)), path=Path(path), revision=commit, read_only=True)
