"""The client to tritonserver's own HTTP endpoint on this host: one streamed `generate_stream` request per choice,
its events as they come, its errors (and a tritonserver that does not answer) as ApiError, and the entry model's
readiness."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp
import msgspec

from trtllm_entrypoint.openai.protocol import ApiError


class Backend:
    def __init__(self, triton_url: str, entry_model: str, headers: Mapping[str, str]) -> None:
        base = f"{triton_url.rstrip('/')}/v2/models/{entry_model}"
        self.stream_url, self.ready_url = f"{base}/generate_stream", f"{base}/ready"
        self.headers = dict(headers)  # the admin key, where tritonserver closes inference without it
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def events(self, body: Mapping[str, object]) -> AsyncGenerator[dict[str, Any], None]:
        """The backend's streamed responses, one dict each. Closing the generator closes the connection, which ends
        the generation in tritonserver."""
        assert self.session is not None
        try:
            async with self.session.post(
                self.stream_url, data=msgspec.json.encode(body), headers=self.headers
            ) as reply:
                if reply.status != 200:
                    raise backend_error(reply.status, await reply.read())
                async for line in reply.content:
                    if not line.startswith(b"data: "):
                        continue
                    event = msgspec.json.decode(line[6:])
                    if "error" in event:
                        raise backend_error(400, line[6:])
                    yield event
        except aiohttp.ClientError as exc:
            raise ApiError(503, f"tritonserver did not answer: {exc}", code="backend_unavailable") from None

    async def ready(self) -> bool:
        """Whether tritonserver serves the entry model now."""
        assert self.session is not None
        try:
            async with self.session.get(self.ready_url) as reply:
                return reply.status == 200
        except aiohttp.ClientError:
            return False


def backend_error(status: int, raw: bytes) -> ApiError:
    try:
        message = str(msgspec.json.decode(raw).get("error", raw.decode(errors="replace")))
    except (msgspec.DecodeError, AttributeError):
        message = raw.decode(errors="replace")
    return ApiError(400 if status == 400 else 502, f"the model answered: {message}", code="backend_error")


def first_float(value: object) -> float | None:
    """A tensor output's first value (tritonserver's JSON nests a tensor's values in lists)."""
    while isinstance(value, list) and value:
        value = value[0]
    return float(value) if isinstance(value, (int, float)) else None
