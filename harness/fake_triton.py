"""A FAKE tritonserver for the OpenAI front's fast tests and benchmarks: not the real server (that is
harness/realtriton.py), only the part of its HTTP API the front uses, answering by a script.

    POST /v2/models/<model>/generate_stream   server-sent events, one `data: {...}` per token with the model's
                                               outputs (text_output, output_log_probs where asked for); an error as a
                                               `data: {"error": ...}` event, or before streaming as a non-200 answer
                                               with tritonserver's body `{"error": ...}`
    GET  /v2/models/<model>/ready              200 when ready, else 400 (as tritonserver answers an unready model)

Each generate request is answered by `script(body)`, a `Reply`; as a model does, the fake sends at most the
request's max tokens. It records what it was asked and how each stream ended (finished, or closed by the client).
As the real models answer:
- the engine workflow's tensorrt_llm model (a request with `input_ids`): the reply's text as token ids, one
  `output_ids` per event, made by `encode` (the served tokenizer's, without special tokens), or the reply's own
  `ids`, one step each (a step of several ids is a list, as the generate endpoint writes a longer tensor); the
  request's limit counts tokens;
- the llmapi model (a request with `sampling_param_max_tokens`): each event's text_output is the whole text so far,
  as TensorRT-LLM's LLM API writes `output.text`, a stop it is sent handled as the LLM API does (_llmapi_texts);
- the ensemble: one piece per event.

    fake = FakeTriton(lambda body: Reply(pieces=["a", "b"]))
    async with fake.serve() as url: ...        # in the test's event loop
    with fake.running() as url: ...            # on a thread of its own (for a front in another process)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

# What the models call the answer's limit (the ensemble; the llmapi model; the engine workflow's tensorrt_llm).
MAX_TOKENS_INPUTS = ("max_tokens", "sampling_param_max_tokens", "request_output_len")
LOGPROB_REQUEST, LOGPROB_OUTPUT = "return_log_probs", "output_log_probs"


@dataclass(frozen=True)
class Reply:
    """One generate_stream answer: `pieces` (one event each) or, for a request with token ids, `ids` (one step of
    token ids each, sent as given: no tokenizing of long replies), their log-probabilities (sent when the request
    asks for them: one per event, or one per id of a step as the tensorrt_llm model's output_log_probs), an `error`
    event after the pieces, or `status` other than 200 (the error before any event), and
    a delay before each event."""

    pieces: Sequence[str] = ()
    ids: Sequence[Sequence[int]] = ()  # the tensorrt_llm model's steps, when not the encoded pieces
    logprobs: Sequence[float] = ()
    error: str | None = None
    status: int = 200
    delay_s: float = 0.0


def words(text: str, **kwargs: Any) -> Reply:
    """A reply of `text`'s words, each with the space before it (as a byte-level tokenizer streams them)."""
    parts = text.split(" ")
    return Reply(pieces=[parts[0], *(" " + p for p in parts[1:])], **kwargs)


def _id_events(steps: Iterable[Sequence[int]], limit: int | None) -> Iterator[dict[str, Any]]:
    """One `output_ids` per step, up to `limit` tokens in all."""
    left = limit
    for step in steps:
        if left is not None:
            if left <= 0:
                return
            step, left = step[:left], left - len(step)
        yield {"output_ids": step[0] if len(step) == 1 else list(step)}


def _llmapi_texts(pieces: Sequence[str], stops: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The llmapi model's responses, each the whole text so far (the LLM API's `output.text`, a piece a token). A
    stop it was sent ends generation where a token completes it, as the LLM API matches a stop string's token ids;
    it then trims those ids, and the last response decodes the empty rest: its text is the text before that last
    token, the stop's earlier tokens included (TensorRT-LLM's executor/result.py and decode_incrementally)."""
    text = ""
    for piece in pieces:
        if any((text + piece).endswith(stop) for stop in stops):
            yield {"text_output": text}
            return
        text += piece
        yield {"text_output": text}


@dataclass
class Seen:
    """One generate_stream request as the fake saw it."""

    model: str
    body: dict[str, Any]
    headers: Mapping[str, str]
    sent: int = 0  # events written
    finished: bool = False  # every event of the reply was written
    closed_by_client: bool = False  # the client closed the stream before its end


@dataclass
class FakeTriton:
    script: Callable[[dict[str, Any]], Reply]
    models: Sequence[str] = ("ensemble", "tensorrt_llm")
    encode: Callable[[str], list[int]] | None = None  # text to token ids, for requests that send ids
    ready: bool = True
    seen: list[Seen] = field(default_factory=list)
    # Set once a stream the client closed has been noticed (tests wait on it instead of sleeping).
    client_closed: asyncio.Event | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v2/models/{model}/generate_stream", self._generate_stream)
        app.router.add_get("/v2/models/{model}/ready", self._ready)
        return app

    def _unknown(self, model: str) -> web.Response | None:
        if model in self.models:
            return None
        return web.json_response({"error": f"Request for unknown model: '{model}' is not found"}, status=400)

    async def _ready(self, request: web.Request) -> web.Response:
        unknown = self._unknown(request.match_info["model"])
        if unknown is not None:
            return unknown
        return web.Response(status=200 if self.ready else 400)

    async def _generate_stream(self, request: web.Request) -> web.StreamResponse:
        model = request.match_info["model"]
        unknown = self._unknown(model)
        if unknown is not None:
            return unknown
        body = msgspec.json.decode(await request.read())
        seen = Seen(model, body, dict(request.headers))
        self.seen.append(seen)
        reply = self.script(body)
        if reply.status != 200:
            return web.json_response({"error": reply.error or "refused"}, status=reply.status)
        limit = next((int(body[name]) for name in MAX_TOKENS_INPUTS if name in body), None)
        events = self._events(body, reply, limit)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            at = 0  # the next token's log-probability: the engine sends one per id of its step, else one per event
            for output in events:
                event: dict[str, Any] = {"model_name": model, "model_version": "1", **output}
                count = len(output["output_ids"]) if isinstance(output.get("output_ids"), list) else 1
                if body.get(LOGPROB_REQUEST) and at < len(reply.logprobs):
                    event[LOGPROB_OUTPUT] = [list(reply.logprobs[at : at + count])]
                at += count
                await self._send(response, event, reply.delay_s)
                seen.sent += 1
            if reply.error is not None:
                await self._send(response, {"error": reply.error}, reply.delay_s)
            await response.write_eof()
            seen.finished = True
        except (
            ConnectionError,
            asyncio.CancelledError,
        ):  # aiohttp raises ConnectionError("Connection lost") in a blocked write
            seen.closed_by_client = True
            if self.client_closed is not None:
                self.client_closed.set()
            raise
        return response

    def _events(self, body: dict[str, Any], reply: Reply, limit: int | None) -> Iterator[dict[str, Any]]:
        """Each event's outputs, as the model asked answers (see the module's docstring), made as they are sent."""
        if "input_ids" in body:
            if reply.ids:
                steps: Iterable[Sequence[int]] = reply.ids
            elif self.encode is None:
                raise RuntimeError("the fake was asked with token ids but given no tokenizer (encode)")
            else:
                steps = ([i] for i in self.encode("".join(reply.pieces)))
            return _id_events(steps, limit)
        if "sampling_param_max_tokens" in body:
            return itertools.islice(_llmapi_texts(reply.pieces, body.get("sampling_param_stop") or ()), limit)
        return itertools.islice(({"text_output": piece} for piece in reply.pieces), limit)

    @staticmethod
    async def _send(response: web.StreamResponse, event: dict[str, Any], delay_s: float) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        await response.write(b"data: " + msgspec.json.encode(event) + b"\n\n")

    @contextlib.asynccontextmanager
    async def serve(self) -> AsyncIterator[str]:
        """Serve on a free loopback port in the running event loop; its URL."""
        self.client_closed = asyncio.Event()
        runner = web.AppRunner(self.app(), handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        """Serve on a thread of its own until the block ends; its URL."""
        loop = asyncio.new_event_loop()
        urls: list[str] = []
        up = threading.Event()
        stop = asyncio.Event()

        async def main() -> None:
            async with self.serve() as url:
                urls.append(url)
                up.set()
                await stop.wait()

        thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
        thread.start()
        try:
            if not up.wait(timeout=30):
                raise RuntimeError("the fake tritonserver did not start")
            yield urls[0]
        finally:
            loop.call_soon_threadsafe(stop.set)
            thread.join(timeout=30)
            loop.close()
