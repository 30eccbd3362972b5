"""Our OpenAI-compatible front: one worker process of several on OPENAI_PORT (each binds it with SO_REUSEPORT, the
kernel spreads connections), each translating OpenAI requests into streamed `generate_stream` requests to
tritonserver's own HTTP endpoint on this host, and streaming the answers back. Non-streamed requests aggregate the
stream; the entry model is decoupled whenever this front serves it (settings.py).

    python3 -m trtllm_entrypoint.openai_front --port 9000 --triton-url http://127.0.0.1:8000 --model-name ensemble \\
        --workflow engine --config /repo/ensemble/config.pbtxt --tokenizer /models/x

The admin key comes in the environment (contract.FRONT_KEY_VARIABLE, dropped from it at start), never in argv.
Routes and the RESTRICTED_APIS group that closes them: inference (completions, chat), metadata (/v1/models);
/health/ready and /health/live stay open, as Triton's health routes do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import os
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from trtllm_entrypoint import contract
from trtllm_entrypoint import openai_api as api
from trtllm_entrypoint.errors import Error
from trtllm_entrypoint.openai import listen, liveness

ADMIN_HEADER = "admin-key"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"
_encode = msgspec.json.encode


def token_counter(tokenizer_dir: Path) -> Callable[[str], int]:
    """How many tokens the backend's tokenizer makes of a prompt (for `usage`): Hugging Face's tokenizers over
    tokenizer.json, else transformers for tokenizers without one."""
    path = tokenizer_dir / "tokenizer.json"
    if path.is_file():
        import tokenizers  # noqa: PLC0415

        fast = tokenizers.Tokenizer.from_file(str(path))
        return lambda text: len(fast.encode(text, add_special_tokens=True).ids)
    import transformers  # type: ignore[import-not-found]  # noqa: PLC0415

    slow = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    return lambda text: len(slow.encode(text))


def chat_template(tokenizer_dir: Path) -> api.ChatTemplate:
    config_path = tokenizer_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    beside = tokenizer_dir / "chat_template.jinja"
    source = api.template_source(config, beside.read_text() if beside.is_file() else None)
    return api.ChatTemplate(source, api.special_tokens(config))


@dataclass
class Choice:
    """One generated answer as it streams: what was shown, how many tokens came, whether a stop sequence ended it."""

    index: int
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    stopped: bool = False
    logprobs: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class Front:
    model: api.Model
    template: api.ChatTemplate
    count_tokens: Callable[[str], int]
    triton_url: str
    restricted: frozenset[str]
    max_seq_len: int  # the served model's (MAX_SEQ_LEN, or the engine's own): a chat answer's default room
    key: str = field(repr=False)
    session: aiohttp.ClientSession | None = None

    @property
    def stream_url(self) -> str:
        return f"{self.triton_url}/v2/models/{self.model.name}/generate_stream"

    def upstream_headers(self) -> dict[str, str]:
        # Triton closes inference to clients without the key when RESTRICTED_APIS has it; we carry it then.
        return {ADMIN_HEADER: self.key} if "inference" in self.restricted and self.key else {}

    def authorize(self, request: web.Request, group: str) -> None:
        """Each handler names its RESTRICTED_APIS group itself: no path spelling can reach a route unchecked."""
        if group not in self.restricted:
            return
        given = request.headers.get(ADMIN_HEADER, "")
        bearer = request.headers.get("Authorization", "")
        if not given and bearer.lower().startswith("bearer "):
            given = bearer[7:].strip()
        if not (self.key and given and hmac.compare_digest(given.encode(), self.key.encode())):
            raise api.ApiError(
                401, f"RESTRICTED_APIS closes {group}: send the admin key as the API key", code="invalid_api_key"
            )

    async def events(self, body: dict[str, object]) -> AsyncGenerator[dict[str, Any], None]:
        """The backend's streamed responses, one dict each; its errors, and a tritonserver that does not answer, as
        ApiError."""
        assert self.session is not None
        try:
            async with self.session.post(self.stream_url, data=_encode(body), headers=self.upstream_headers()) as reply:
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
            raise api.ApiError(503, f"tritonserver did not answer: {exc}", code="backend_unavailable") from None

    async def generate(self, prompt: str, s: api.Sampling, choice: Choice) -> AsyncIterator[tuple[str, float | None]]:
        """One choice's text as it comes (stop sequences cut, held back while they may be starting)."""
        scanner = api.StopScanner(s.stops)
        body = api.backend_body(self.model, prompt, s, choice.index)
        logprob_output = self.model.logprob_output if s.logprobs else None
        async with contextlib.aclosing(self.events(body)) as events:
            async for event in events:
                choice.tokens += 1
                piece = event.get("text_output", "")
                shown, stopped = scanner.feed(piece if isinstance(piece, str) else str(piece))
                logprob = _first_float(event.get(logprob_output)) if logprob_output else None
                if logprob is not None:
                    choice.logprobs.append((piece, logprob))
                if shown:
                    choice.text.append(shown)
                    yield shown, logprob
                if stopped:
                    choice.stopped = True
                    return  # leaving the block closes the connection: Triton stops generating
        rest = scanner.flush()
        if rest:
            choice.text.append(rest)
            yield rest, None


def _first_float(value: object) -> float | None:
    while isinstance(value, list) and value:
        value = value[0]
    return float(value) if isinstance(value, (int, float)) else None


def backend_error(status: int, raw: bytes) -> api.ApiError:
    try:
        message = str(msgspec.json.decode(raw).get("error", raw.decode(errors="replace")))
    except (msgspec.DecodeError, AttributeError):
        message = raw.decode(errors="replace")
    return api.ApiError(400 if status == 400 else 502, f"the model answered: {message}", code="backend_error")


FRONT = web.AppKey("front", Front)


@web.middleware
async def openai_errors(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except api.ApiError as exc:
        return web.json_response(exc.body(), status=exc.status, dumps=lambda o: _encode(o).decode())
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = api.ApiError(exc.status, f"{request.method} {request.path}: {exc.reason}")
        return web.json_response(error.body(), status=exc.status, headers={"Allow": exc.headers.get("Allow", "")})


def _check_model(front: Front, name: str) -> None:
    if name != front.model.name:
        raise api.ApiError(
            404,
            f"the model {name!r} does not exist; this server serves {front.model.name!r}",
            "model",
            "model_not_found",
        )


async def models(request: web.Request) -> web.Response:
    front = request.app[FRONT]
    front.authorize(request, "metadata")
    return web.Response(body=_encode(api.models_list(front.model)), content_type="application/json")


async def model(request: web.Request) -> web.Response:
    front = request.app[FRONT]
    front.authorize(request, "metadata")
    _check_model(front, request.match_info["name"])
    return web.Response(body=_encode(api.model_card(front.model)), content_type="application/json")


async def ready(request: web.Request) -> web.Response:
    """Ready when tritonserver is (and so its model): the container's readiness is both processes'."""
    front = request.app[FRONT]
    assert front.session is not None
    try:
        async with front.session.get(f"{front.triton_url}/v2/models/{front.model.name}/ready") as reply:
            ok = reply.status == 200
    except aiohttp.ClientError:
        ok = False
    return web.Response(status=200 if ok else 503, text="ready" if ok else "tritonserver is not ready")


async def live(_: web.Request) -> web.Response:
    return web.Response(text="live")


def _chunk(kind: str, rid: str, created: int, model: str, choices: Sequence[Mapping[str, object]]) -> bytes:
    return (
        b"data: "
        + _encode({"id": rid, "object": kind, "created": created, "model": model, "choices": choices})
        + b"\n\n"
    )


async def _read(request: web.Request, kind: type[Any]) -> tuple[Front, Any]:
    """The front and the request's body as `kind`, once the key (where asked for) and the model name are right."""
    front = request.app[FRONT]
    front.authorize(request, "inference")
    req = api.decode(await request.read(), kind)
    _check_model(front, req.model)
    return front, req


async def completions(request: web.Request) -> web.StreamResponse:
    front, req = await _read(request, api.CompletionRequest)
    api.check_completion(req)
    s = api.sampling(req, front.model, req.max_tokens, logprobs=False)
    jobs = [(prompt, Choice(p * req.n + k)) for p, prompt in enumerate(api.prompts_of(req)) for k in range(req.n)]
    return await answer(request, front, req, s, jobs, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    front, req = await _read(request, api.ChatRequest)
    api.check_chat(req)
    prompt = front.template.render(api.messages_of(req))
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if max_tokens is None:  # as OpenAI's chat: up to the end of the context
        max_tokens = api.room_left(front.count_tokens(prompt), front.max_seq_len)
    s = api.sampling(req, front.model, max_tokens, logprobs=req.logprobs)
    return await answer(request, front, req, s, [(prompt, Choice(k)) for k in range(req.n)], chat=True)


async def answer(
    request: web.Request,
    front: Front,
    req: api.CompletionRequest | api.ChatRequest,
    s: api.Sampling,
    jobs: list[tuple[str, Choice]],
    *,
    chat: bool,
) -> web.StreamResponse:
    rid, created = api.new_id("chatcmpl" if chat else "cmpl"), int(time.time())
    echo = not chat and getattr(req, "echo", False)
    if not req.stream:
        await asyncio.gather(*(_drain(front.generate(prompt, s, choice)) for prompt, choice in jobs))
        prompt_tokens = sum(front.count_tokens(prompt) for prompt in dict.fromkeys(p for p, _ in jobs))
        body = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": front.model.name,
            "choices": [_whole_choice(c, p, s, chat, echo) for p, c in jobs],
            "usage": api.usage(prompt_tokens, sum(c.tokens for _, c in jobs)),
        }
        return web.Response(body=_encode(body), content_type="application/json")
    kind = "chat.completion.chunk" if chat else "text_completion"
    name = front.model.name
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    if chat:
        first = [{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None} for _, c in jobs]  # fmt: skip
        await response.write(_chunk(kind, rid, created, name, first))
    elif echo:
        echoed = [{"index": c.index, "text": p, "logprobs": None, "finish_reason": None} for p, c in jobs]
        await response.write(_chunk(kind, rid, created, name, echoed))

    def piece(choice: Choice, text: str, logprob: float | None) -> bytes:
        if chat:
            entry: dict[str, object] = {"index": choice.index, "delta": {"content": text}, "finish_reason": None}
            entry["logprobs"] = api.chat_logprobs([(text, logprob)]) if logprob is not None else None
        else:
            entry = {"index": choice.index, "text": text, "logprobs": None, "finish_reason": None}
        return _chunk(kind, rid, created, name, [entry])

    def last(choice: Choice) -> bytes:
        reason = api.finish_reason(choice.stopped, choice.tokens, s.max_tokens)
        entry: dict[str, object] = {"index": choice.index, "finish_reason": reason, "logprobs": None}
        entry["delta" if chat else "text"] = {} if chat else ""
        return _chunk(kind, rid, created, name, [entry])

    try:
        if len(jobs) == 1:
            prompt, choice = jobs[0]
            async for text, logprob in front.generate(prompt, s, choice):
                await response.write(piece(choice, text, logprob))
            await response.write(last(choice))
        else:
            await _interleave(response, front, s, jobs, piece, last)
        if req.stream_options is not None and req.stream_options.include_usage:
            prompt_tokens = sum(front.count_tokens(prompt) for prompt in dict.fromkeys(p for p, _ in jobs))
            final = {"id": rid, "object": kind, "created": created, "model": name, "choices": [],
                     "usage": api.usage(prompt_tokens, sum(c.tokens for _, c in jobs))}  # fmt: skip
            await response.write(b"data: " + _encode(final) + b"\n\n")
    except api.ApiError as exc:  # the status is sent already: the error goes into the stream, as OpenAI's does
        await response.write(b"data: " + _encode(exc.body()) + b"\n\n")
    except ConnectionResetError:  # the client left: leaving closed the backend's stream, which ends generation
        return response
    await response.write(DONE)
    await response.write_eof()
    return response


async def _drain(pieces: AsyncIterator[tuple[str, float | None]]) -> None:
    async for _ in pieces:
        pass


async def _interleave(
    response: web.StreamResponse,
    front: Front,
    s: api.Sampling,
    jobs: list[tuple[str, Choice]],
    piece: Callable[[Choice, str, float | None], bytes],
    last: Callable[[Choice], bytes],
) -> None:
    """Several choices streamed at once, each chunk as it comes."""
    queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()

    async def run(prompt: str, choice: Choice) -> None:
        try:
            async for text, logprob in front.generate(prompt, s, choice):
                queue.put_nowait(piece(choice, text, logprob))
            queue.put_nowait(last(choice))
        except BaseException as exc:  # noqa: BLE001  (handed to the writer, which raises it)
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.ensure_future(run(prompt, choice)) for prompt, choice in jobs]
    try:
        done = 0
        while done < len(tasks):
            item = await queue.get()
            if item is None:
                done += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                await response.write(item)
    finally:
        for task in tasks:
            task.cancel()


def _whole_choice(choice: Choice, prompt: str, s: api.Sampling, chat: bool, echo: bool) -> dict[str, object]:
    text = "".join(choice.text)
    reason = api.finish_reason(choice.stopped, choice.tokens, s.max_tokens)
    if chat:
        logprobs = api.chat_logprobs(choice.logprobs) if s.logprobs else None
        message = {"role": "assistant", "content": text}
        return {"index": choice.index, "message": message, "logprobs": logprobs, "finish_reason": reason}
    return {"index": choice.index, "text": prompt + text if echo else text, "logprobs": None, "finish_reason": reason}


def make_app(front: Front) -> web.Application:
    app = web.Application(middlewares=[openai_errors], client_max_size=16 << 20)
    app[FRONT] = front

    async def session(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        front.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )
        yield
        await front.session.close()

    app.cleanup_ctx.append(session)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{name}", model)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health/ready", ready)
    app.router.add_get("/health/live", live)
    return app


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m trtllm_entrypoint.openai_front")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--triton-url", required=True)
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--workflow", choices=sorted(api.INPUT_NAMES), required=True)
    parser.add_argument("--config", type=Path, required=True, help="the served model's config.pbtxt")
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--restricted", default="", help="RESTRICTED_APIS groups, comma-separated")
    parser.add_argument("--max-seq-len", type=int, required=True, help="prompt plus answer, in tokens")
    parser.add_argument("--shutdown-timeout", type=float, default=30)
    return parser.parse_args(argv)


def build(args: argparse.Namespace, key: str) -> Front:
    config = args.config.read_text()
    return Front(
        model=api.Model.from_config(args.model_name, args.workflow, config, str(args.config)),
        template=chat_template(args.tokenizer),
        count_tokens=token_counter(args.tokenizer),
        triton_url=args.triton_url.rstrip("/"),
        restricted=frozenset(filter(None, args.restricted.split(","))),
        max_seq_len=args.max_seq_len,
        key=key,
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        front = build(args, os.environ.pop(contract.FRONT_KEY_VARIABLE, ""))
    except Error as exc:  # one line, as the entrypoint's own errors
        sys.exit(f"error: {exc}")
    app = make_app(front)
    app.on_startup.append(liveness.on_startup)  # the supervisor replaces a worker whose loop stops beating
    web.run_app(
        app,
        sock=listen.listening_socket(args.host, args.port),  # dual-stack: no other UID can take the port's IPv6 side
        shutdown_timeout=args.shutdown_timeout,
        access_log=None,
        print=None,
    )


if __name__ == "__main__":
    main()
