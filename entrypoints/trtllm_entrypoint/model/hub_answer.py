"""The Hugging Face hub's answers, checked before any value in them reaches a path or a log line.

The hub (or whatever HF_ENDPOINT names) is outside our control: a commit that is not 40 hex digits could name a
path outside the cache (`../..`) or forge a log line (a newline), a file name could climb out of the snapshot, and an
answer of the wrong shape made the hub client fail with a traceback. Each of these is one error line instead.
"""

from __future__ import annotations

import traceback
from pathlib import PurePath, PurePosixPath

from trtllm_entrypoint.errors import EntrypointError
from trtllm_entrypoint.log import CONTROL

# Lower case only, as the hub client's own test of a commit: it then uses the value as a folder name without asking
# the hub again (an upper-case one would make it resolve, and trust, the hub's next answer).
HEX = frozenset("0123456789abcdef")
COMMIT_LENGTH = 40
MAX_NAME = 1024
# Where a failure on an answer the client could not read is raised; anything raised elsewhere is our own bug and
# keeps its traceback.
CLIENT_PACKAGES = ("huggingface_hub", "httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3", "h11")
HINT = (
    "the answer is not what the Hugging Face hub's API gives: check HF_ENDPOINT (a mirror or proxy in between?), "
    "or try again"
)


def _bad(repo_id: str, what: str) -> EntrypointError:
    return EntrypointError(f"the Hugging Face hub's answer about {repo_id} is malformed: {what}", HINT)


def commit(value: object, repo_id: str) -> str:
    """The commit the hub says it serves: 40 lower-case hex digits."""
    if value is None:  # the weights must be named by their commit in the engine cache key
        raise EntrypointError(
            f"the Hugging Face hub did not say which commit of {repo_id} it serves",
            "try again, or set MODEL_REVISION to a commit",
        )
    if not isinstance(value, str) or len(value) != COMMIT_LENGTH or not set(value) <= HEX:
        raise _bad(repo_id, f"its commit is not {COMMIT_LENGTH} hexadecimal digits")
    return value


def file_name(value: object) -> bool:
    """A file of the repository: a relative path of plain parts, no '..', no backslash, no control character."""
    if not isinstance(value, str) or not value or len(value) > MAX_NAME or "\\" in value or CONTROL.search(value):
        return False
    parts = value.split("/")
    return not PurePosixPath(value).is_absolute() and all(part not in ("", ".", "..") for part in parts)


def files(siblings: object, repo_id: str) -> dict[str, int | None]:
    """The repository's files and their sizes (None where the hub gives none), from the `siblings` of a model's
    info: a list of objects, each with a file name and an optional whole size."""
    if siblings is None:
        return {}
    if not isinstance(siblings, (list, tuple)):
        raise _bad(repo_id, "its file list is not a list")
    out: dict[str, int | None] = {}
    for sibling in siblings:
        name = sibling.get("rfilename") if isinstance(sibling, dict) else getattr(sibling, "rfilename", None)
        size = sibling.get("size") if isinstance(sibling, dict) else getattr(sibling, "size", None)
        if not file_name(name):
            raise _bad(repo_id, "a file name is not a relative path of plain parts (no '..', no control characters)")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
            raise _bad(repo_id, "a file size is not a whole number of bytes")
        out[str(name)] = size
    return out


def _raised_in_client(exc: BaseException) -> bool:
    """The innermost frame is in one of the client's packages (its directory is named after it)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and bool(set(PurePath(frames[-1].filename).parts[:-1]) & set(CLIENT_PACKAGES))


def client_failure(exc: BaseException, repo_id: str | None) -> EntrypointError | None:
    """One error line for an exception the hub client (or its HTTP library) raised on an answer it could not read:
    a redirect without a Location, a list where an object belongs, a number where a name belongs. None for
    anything raised elsewhere."""
    if isinstance(exc, EntrypointError) or not _raised_in_client(exc):
        return None
    if isinstance(exc, OSError) and exc.filename:  # the disk, not the answer: main names the file
        return None
    return EntrypointError(
        f"the Hugging Face hub's answer about {repo_id} could not be read ({type(exc).__name__})", HINT
    )
