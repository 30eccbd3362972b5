"""The client to tritonserver's own HTTP endpoint on this host: one streamed `generate_stream` request per choice,
its events as they come, its errors (and a tritonserver that does not answer) as ApiError, and the entry model's
readiness. A client's error names no internal address and no library's message: the worker's log line has the
detail, under the reference the client's message gives."""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import msgspec

from trtllm_entrypoint.openai import limits
from trtllm_entrypoint.openai.protocol import ApiError

LOG = logging.getLogger("trtllm_entrypoint.openai")


class Backend:
    def __init__(self, triton_url: str, entry_model: str, headers: Mapping[str, str]) -> None:
        base = f"{triton_url.rstrip('/')}/v2/models/{entry_model}"
        self.stream_url, self.ready_url = f"{base}/generate_stream", f"{base}/ready"
        self.headers = dict(headers)  # the admin key, where tritonserver closes inference without it
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        # Bounded: a worker holds at most BACKEND_CONNECTIONS streams to tritonserver; further ones wait for one.
        connector = aiohttp.TCPConnector(limit=limits.BACKEND_CONNECTIONS, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def events(
        self, body: Mapping[str, object], idle: Callable[[], Awaitable[None]] | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The backend's streamed responses, one dict each. Closing the generator closes the connection, which ends
        the generation in tritonserver. `idle` is awaited before waiting for more (nothing read is left): what the
        events made can go to the client together (limits.Sink)."""
        assert self.session is not None
        try:
            async with self.session.post(
                self.stream_url, data=msgspec.json.encode(body), headers=self.headers
            ) as reply:
                if reply.status != 200:
                    raise backend_error(reply.status, await reply.read())
                # Everything read so far at once: under load several events come in one read.
                content, rest = reply.content, b""
                while True:
                    data = content.read_nowait()
                    if not data:
                        if idle is not None:
                            await idle()
                        data = await content.readany()
                        if not data:
                            break
                    *lines, rest = (rest + data).split(b"\n")
                    for line in lines:
                        if line.startswith(b"data: "):
                            yield _event(line[6:])
                if rest.startswith(b"data: "):  # the last event without its line's end
                    yield _event(rest[6:])
        except aiohttp.ClientError as exc:
            ref = log_detail("tritonserver did not answer", f"{self.stream_url}: {type(exc).__name__}: {exc}")
            raise ApiError(503, f"the model server did not answer (ref {ref})", code="backend_unavailable") from None
        except msgspec.DecodeError as exc:
            ref = log_detail("tritonserver sent an event that is not JSON", str(exc))
            raise ApiError(502, f"the model server's answer was malformed (ref {ref})", code="backend_error") from None

    async def ready(self) -> bool:
        """Whether tritonserver serves the entry model now."""
        assert self.session is not None
        try:
            async with self.session.get(self.ready_url) as reply:
                return reply.status == 200
        except aiohttp.ClientError:
            return False


def _event(data: bytes) -> dict[str, Any]:
    event = msgspec.json.decode(data)
    if "error" in event:
        raise backend_error(400, data)
    return event  # type: ignore[no-any-return]


def backend_error(status: int, raw: bytes) -> ApiError:
    """tritonserver's error (its JSON body, or one SSE event's data) as the client's: a refusal keeps the model's
    first line, without addresses or paths; anything else is only named. The log has it whole."""
    try:
        decoded = msgspec.json.decode(raw)
        message = str(decoded.get("error", "")) if isinstance(decoded, dict) else ""
    except msgspec.DecodeError:
        message = ""
    text = message or raw.decode(errors="replace")
    ref = log_detail(f"tritonserver answered {status}", text)
    if status == 400 and message:
        return ApiError(400, f"the model refused the request: {public(message)} (ref {ref})", code="backend_error")
    return ApiError(502, f"the model failed to generate an answer (ref {ref})", code="backend_error")


# What a client never sees of a backend's message: URLs, host:port pairs, IP addresses, file paths.
_INTERNAL = re.compile(
    r"[a-z][a-z0-9+.-]*://\S+|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\[[0-9a-fA-F:]+\](?::\d+)?|"
    r"\b[\w.-]+:\d{2,5}\b|\(\s*'[^']*'\s*,\s*\d+[^)]*\)|(?<![\w.])/[\w.@+-]+(?:/[\w.@+-]+)+"
)


def public(message: str, limit: int = 300) -> str:
    """The first line of a backend's message, addresses and paths replaced by `…`, at most `limit` characters."""
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    return _INTERNAL.sub("…", first)[:limit]


def log_detail(what: str, detail: str) -> str:
    """Log `detail` on one line (control characters escaped, so no value can forge a line); the reference that
    the client's message gives."""
    ref = secrets.token_hex(6)
    LOG.warning("%s (ref %s): %s", what, ref, json.dumps(detail)[1:-1])
    return ref
