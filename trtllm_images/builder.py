"""The only module that talks to Docker for builds: connect, make sure the base image is there, build, push.

Builds go through the docker SDK's low-level API (the classic builder, no BuildKit), so the Dockerfiles in images/
must not use BuildKit-only syntax. Output is streamed line by line to a callback so users see the failing step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound
from docker.utils import parse_repository_tag

from trtllm_entrypoint.errors import Error

OnLine = Callable[[str], None]

# Lines of build output kept for the error message when a build fails.
TAIL_LINES = 12
# Ordinary API calls (inspect, push chunks, probe containers).
CLIENT_TIMEOUT_S = 600
# A build step may print nothing for a long time (large pip installs); only silence this long means "stuck".
BUILD_READ_TIMEOUT_S = 3600


def docker_client() -> docker.DockerClient:
    """A client for the engine named by DOCKER_HOST (or the local socket), after checking that it answers."""
    try:
        client = docker.from_env(timeout=CLIENT_TIMEOUT_S)
        client.ping()
    except (DockerException, OSError) as exc:
        raise Error(
            f"no Docker engine answered: {exc}",
            hint="start the Docker daemon (e.g. `sudo systemctl start docker`) or set DOCKER_HOST to a running engine",
        ) from exc
    return client


def ensure_base_image(client, base_image: str, on_line: OnLine) -> None:
    """Use the local copy of `base_image`, or pull it; a base image we cannot get is one clear error."""
    try:
        client.api.inspect_image(base_image)
        return
    except ImageNotFound:
        pass
    except (DockerException, OSError) as exc:
        raise _engine_error(f"inspecting {base_image}", exc) from exc
    on_line(f"pulling {base_image}")
    try:
        _follow(client.api.pull(base_image, stream=True, decode=True), on_line)
    except _StreamError as exc:
        raise _missing_base_image(base_image, exc.message) from exc
    except APIError as exc:
        raise _missing_base_image(base_image, exc.explanation or str(exc)) from exc
    except (DockerException, OSError) as exc:
        raise _engine_error(f"pulling {base_image}", exc) from exc


def build_image(client, context: Path, dockerfile: str, ref: str, buildargs: Mapping[str, str], on_line: OnLine) -> str:
    """Build `dockerfile` in `context`, tagged `ref`; returns the image id. Streams every output line to `on_line`."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)

    def keep(line: str) -> None:
        tail.append(line)
        on_line(line)

    try:
        stream = client.api.build(
            path=str(context),
            dockerfile=dockerfile,
            tag=ref,
            buildargs=dict(buildargs),
            decode=True,
            rm=True,
            forcerm=True,
            pull=False,
            timeout=BUILD_READ_TIMEOUT_S,
        )
        _follow(stream, keep)
        return client.api.inspect_image(ref)["Id"]
    except _StreamError as exc:
        raise _build_failed(ref, exc.message, tail) from exc
    except APIError as exc:
        raise _build_failed(ref, exc.explanation or str(exc), tail) from exc
    except (DockerException, OSError) as exc:
        raise _engine_error(f"building {ref}", exc) from exc


def push(client, ref: str, on_line: OnLine) -> None:
    """Push `ref` to its registry with the credentials of `docker login`."""
    repository, tag = parse_repository_tag(ref)
    hint = f"run `docker login {registry_of(repository)}` with an account allowed to push {repository}"
    try:
        _follow(client.api.push(repository, tag=tag, stream=True, decode=True), on_line)
    except _StreamError as exc:
        raise Error(f"pushing {ref} failed: {exc.message}", hint=hint) from exc
    except APIError as exc:
        raise Error(f"pushing {ref} failed: {exc.explanation or exc}", hint=hint) from exc
    except (DockerException, OSError) as exc:
        raise _engine_error(f"pushing {ref}", exc) from exc


def untag(client, ref: str) -> None:
    """Remove the name `ref` (the image itself stays while other names or containers use it)."""
    try:
        client.api.remove_image(ref, noprune=True)
    except APIError as exc:
        if exc.status_code != 404:
            raise _engine_error(f"removing the tag {ref}", exc) from exc


def registry_of(repository: str) -> str:
    """The registry host of a repository name, by Docker's rule (a first part with '.' or ':', or localhost)."""
    first, _, rest = repository.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


class _StreamError(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _follow(chunks: Iterable[Mapping], on_line: OnLine) -> None:
    """Send a build/pull/push JSON stream to `on_line`; an error chunk raises `_StreamError`."""
    for chunk in chunks:
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail") or {}
            raise _StreamError(str(detail.get("message") or chunk.get("error") or "unknown error").strip())
        for line in str(chunk.get("stream", "")).splitlines():
            if line.strip():
                on_line(line.rstrip())
        # Per-layer progress bars would flood a log; the status changes ("Pull complete", "Pushed") are enough.
        if "status" in chunk and not chunk.get("progressDetail"):
            on_line(" ".join(str(part) for part in (chunk.get("id"), chunk["status"]) if part))


def _build_failed(ref: str, reason: str, tail: Iterable[str]) -> Error:
    lines = "\n".join(f"  | {line}" for line in tail)
    return Error(
        f"docker build of {ref} failed: {reason}" + (f"\nlast output:\n{lines}" if lines else ""),
        hint="the full build output is above; fix the failing step and build again (finished layers are cached)",
    )


def _missing_base_image(base_image: str, reason: str) -> Error:
    return Error(
        f"base image {base_image} is not available locally and cannot be pulled: {reason}",
        hint=f"check that {registry_of(parse_repository_tag(base_image)[0])} is reachable and you ran `docker login` "
        "for it, or pass --base-image with an image you have locally",
    )


def _engine_error(doing: str, exc: Exception) -> Error:
    return Error(
        f"the Docker engine failed while {doing}: {exc}",
        hint="check that the daemon is still running (`docker info`) and has free disk space",
    )
