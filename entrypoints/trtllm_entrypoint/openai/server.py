"""One worker process of the OpenAI front (`python3 -m trtllm_entrypoint.openai`; the supervisor starts
OPENAI_WORKERS of them on OPENAI_PORT, each binding it with SO_REUSEPORT so the kernel spreads connections): the
routes, the admin key's check, OpenAI's error shape for every failure, and the start, which reads the FrontPlan
(contract.FRONT_PLAN_VARIABLE) and the admin key (contract.FRONT_KEY_VARIABLE) from the environment and drops both.

Routes and the RESTRICTED_APIS group that closes them: inference (completions, chat), metadata (/v1/models);
/health/ready, /health/live and /metrics stay open, as Triton's health routes and metrics port do (counts and
timings, never a prompt or an answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from trtllm_entrypoint import contract
from trtllm_entrypoint.errors import Error
from trtllm_entrypoint.log import Log
from trtllm_entrypoint.openai import (
    chat,
    chat_template,
    completions,
    limits,
    listen,
    liveness,
    readiness,
    serving,
    special_tokens,
    structured,
    tokenizer,
)
from trtllm_entrypoint.openai.backend import Backend, log_detail
from trtllm_entrypoint.openai.chat_template import ChatTemplateError
from trtllm_entrypoint.openai.drain import ERROR_CODE, Drain
from trtllm_entrypoint.openai.metrics import Metrics
from trtllm_entrypoint.openai.plan import FrontPlan
from trtllm_entrypoint.openai.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    Request,
    decode,
)
from trtllm_entrypoint.openai.sampling import Model, with_adapter

ADMIN_HEADER = contract.ADMIN_KEY_HEADER
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"
OWNER = "trtllm-images"
# How the worker's aiohttp server runs (main, and the tests' server): a client that leaves cancels its handler, which
# closes its backend streams; aiohttp stopped doing so by default in 3.9.
HANDLER_CANCELLATION = True
_encode = msgspec.json.encode


@dataclass(frozen=True)
class Front:
    served: serving.Served
    restricted: frozenset[str]  # the RESTRICTED_APIS groups that want the admin key
    key: str = field(repr=False)
    # What SIGTERM does to the streams in flight (EXIT_TIMEOUT_SECS, the plan's shutdown_timeout), said in the log.
    drain: Drain = field(default_factory=lambda: Drain(30.0, Log().info))

    @property
    def model(self) -> Model:
        return self.served.model

    def authorize(self, request: web.Request, group: str) -> None:
        """Each handler names its RESTRICTED_APIS group itself: no path spelling can reach a route unchecked."""
        if group not in self.restricted:
            return
        given = request.headers.get(ADMIN_HEADER, "")
        bearer = request.headers.get("Authorization", "")
        if not given and bearer.lower().startswith("bearer "):
            given = bearer[7:].strip()
        # Compared as the bytes that came: a header that is not UTF-8 is a wrong key (401), never a 500.
        wanted, sent = self.key.encode(), given.encode("utf-8", "surrogateescape")
        if not (self.key and given and hmac.compare_digest(sent, wanted)):
            raise ApiError(
                401, f"RESTRICTED_APIS closes {group}: send the admin key as the API key", code="invalid_api_key"
            )

    def check_model(self, name: str) -> serving.Target:
        """The base model or the LoRA adapter a request names; anything else is OpenAI's 404."""
        target = self.served.target(name)
        if target is None:
            adapters = f" and its adapters {', '.join(sorted(self.served.adapters))}" if self.served.adapters else ""
            raise ApiError(
                404,
                f"the model {name!r} does not exist; this server serves {self.model.name!r}{adapters}",
                "model",
                "model_not_found",
            )
        return target


FRONT = web.AppKey("front", Front)


class Gate(readiness.Gate):
    """readiness.Gate over the backend, asked again at once while it says no."""

    async def require(self) -> None:
        if not self.ready and not await self.check():
            raise ApiError(503, readiness.LOADING_MESSAGE, code="model_not_ready")


GATE = web.AppKey("gate", Gate)


def _json(body: msgspec.Struct, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=_encode(body), status=status, headers=headers, content_type="application/json")


def _event(body: msgspec.Struct) -> bytes:
    return b"data: " + _encode(body) + b"\n\n"


@web.middleware
async def openai_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return _json(exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = ApiError(exc.status, f"{request.method} {request.path}: {exc.reason}")
        return _json(error.body(), exc.status, {"Allow": exc.headers.get("Allow", "")})
    except Exception as exc:  # a bug: one log line, and OpenAI's shape (never a traceback per request)
        ref = log_detail("unexpected error", f"{request.method} {request.path}: {type(exc).__name__}: {exc}")
        return _json(ApiError(500, f"internal error (ref {ref})", code="internal_error").body(), 500)


def _card(model: Model, target: serving.Target) -> ModelCard:
    """vLLM's card: an adapter names the base model as its parent."""
    return ModelCard(
        target.name, model.created, OWNER, root=model.name, parent=model.name if target.lora_name else None
    )


async def _open(request: web.Request, group: str) -> Front:
    """The front, once the key (where `group` asks for it) is right and the model is ready: every /v1/* route
    answers 503 'the model is loading' until tritonserver reports it ready."""
    front = request.app[FRONT]
    front.authorize(request, group)
    await request.app[GATE].require()
    return front


async def models(request: web.Request) -> web.Response:
    front = await _open(request, "metadata")
    names = [front.model.name, *sorted(front.served.adapters)]
    return _json(ModelList([_card(front.model, front.check_model(name)) for name in names]))


async def model(request: web.Request) -> web.Response:
    front = await _open(request, "metadata")
    return _json(_card(front.model, front.check_model(request.match_info["name"])))


async def metrics(request: web.Request) -> web.Response:
    """Prometheus' text: every worker's values summed (metrics.py)."""
    measured = request.app[FRONT].served.metrics
    return web.Response(body=measured.exposition(), headers={"Content-Type": measured.content_type})


async def ready(request: web.Request) -> web.Response:
    """Ready when tritonserver is (and so its model): the container's readiness is both processes'."""
    ok = await request.app[FRONT].served.backend.ready()
    return web.Response(status=200 if ok else 503, text="ready" if ok else "tritonserver is not ready")


async def live(_: web.Request) -> web.Response:
    return web.Response(text="live")


async def _read(request: web.Request, kind: type[Request]) -> tuple[Front, Request, serving.Target]:
    """The front, the request's body as `kind` and the model it names, once the key (where asked for) and the model
    name are right, and the model is ready."""
    front = await _open(request, "inference")
    req = decode(await request.read(), kind)
    return front, req, front.check_model(req.model)


def _targeted(served: serving.Served, work: serving.Work, target: serving.Target) -> serving.Work:
    """The work for the model the request named (an adapter's task id in its sampling), measured from here on."""
    return dataclasses.replace(
        work,
        sampling=with_adapter(served.model, work.sampling, target.task_id),
        target=target,
        measure=served.metrics.request(served.model.name, target.lora_name),
    )


async def completions_route(request: web.Request) -> web.StreamResponse:
    front, req, target = await _read(request, CompletionRequest)
    work = await front.served.cpu.run(completions.work, front.served, req)  # decoding, counting: off the loop
    return await answer(request, front.served, _targeted(front.served, work, target))


async def chat_route(request: web.Request) -> web.StreamResponse:
    front, req, target = await _read(request, ChatRequest)
    work = await front.served.cpu.run(chat.work, front.served, req)  # rendering, counting: off the loop
    return await answer(request, front.served, _targeted(front.served, work, target))


async def answer(request: web.Request, served: serving.Served, work: serving.Work) -> web.StreamResponse:
    if not work.stream:
        return _json(await serving.whole(served, work))
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    drain = request.app[FRONT].drain
    sink = limits.Sink(response, request.transport)
    try:
        with drain.stream() as live:
            try:
                async with contextlib.aclosing(serving.stream(served, work, sink.flush)) as chunks:
                    async for chunk in chunks:
                        if sink.add(_event(chunk)):
                            await sink.flush()
            except ApiError as exc:  # the status is sent already: the error goes into the stream, as OpenAI's does
                sink.add(_event(exc.body()))
            except asyncio.CancelledError:  # the drain's grace ran out: the answer ends with why, never broken off
                if not drain.was_cut(live):
                    raise
                sink.add(_event(ApiError(503, drain.cut_message, code=ERROR_CODE).body()))
        sink.add(DONE)
        await sink.flush()
    except limits.ClientGone:  # left, or read nothing for WRITE_TIMEOUT_S: closing the chunks ended the generations
        if request.transport is not None:
            request.transport.abort()  # nothing more is written to it, not even the end
        return response
    await response.write_eof()
    return response


def make_app(front: Front) -> web.Application:
    app = web.Application(middlewares=[openai_errors], client_max_size=16 << 20)
    app[FRONT] = front

    gate = app[GATE] = Gate(front.served.backend.ready)

    async def session(_: web.Application) -> AsyncIterator[None]:
        await front.served.backend.open()
        async with gate.watching():
            yield
        await front.served.backend.close()
        front.served.cpu.close()

    app.cleanup_ctx.append(session)
    app.on_shutdown.append(front.drain.shutdown)  # after the listener closed, before aiohttp cancels the handlers
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{name}", model)
    app.router.add_post("/v1/completions", completions_route)
    app.router.add_post("/v1/chat/completions", chat_route)
    app.router.add_get("/health/ready", ready)
    app.router.add_get("/health/live", live)
    app.router.add_get("/metrics", metrics)
    return app


def build(plan: FrontPlan, key: str, metrics_dir: str | None = None) -> Front:
    """The worker's state from its plan: the served model's declared inputs, its tokenizer, the backend, and its
    metrics (`metrics_dir`: where every worker's values are summed; None: this process's alone)."""
    tokenizer_dir = Path(plan.tokenizer)
    served_model = Model.from_config(plan.served_name, plan.workflow, Path(plan.config).read_text(), plan.config)
    # Triton closes inference to clients without the key when RESTRICTED_APIS has it; we carry it then.
    upstream = {ADMIN_HEADER: key} if "inference" in plan.restricted and key else {}
    template = chat_template.load(tokenizer_dir)
    served = serving.Served(
        model=served_model,
        backend=Backend(plan.triton_url, plan.entry_model, upstream),
        template=template,
        tokenizer=tokenizer.load(
            tokenizer_dir,
            skip_special_tokens=plan.skip_special_tokens,
            add_special_tokens=plan.add_special_tokens,
        ),
        max_seq_len=plan.max_seq_len,
        special=special_tokens.Guard(special_tokens.of_tokenizer(tokenizer_dir)),
        max_generations=plan.max_generations,
        metrics=Metrics(plan.max_seq_len, metrics_dir),
        adapters=dict(plan.adapters),
        support=tool_support(plan, template, tokenizer_dir),
    )
    return Front(served, frozenset(plan.restricted), key, Drain(plan.shutdown_timeout, Log(plan.log_format).info))


def tool_support(plan: FrontPlan, template: chat_template.ChatTemplate, tokenizer: Path) -> structured.Support:
    """Which tool-call family this worker reads (TOOL_CALL_PARSER, else the template's), checked against what the
    template renders when handed a tool; and whether guided decoding is on (the entrypoint's word)."""
    try:
        model_type = json.loads((tokenizer / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None

    def renders(offered: list[dict[str, Any]]) -> str:
        return template.render([{"role": "user", "content": "hi"}], tools=offered)

    try:  # the template transformers renders when the request has tools (a `tool_use` one where there is one)
        source: str | None = template.found.select(tools=[])
    except ChatTemplateError:  # no template: chat answers 400 anyway
        source = None
    return structured.support(source, model_type, plan.tool_parser, renders if source else None, plan.guided_off)


def take_start(environ: MutableMapping[str, str]) -> tuple[FrontPlan, str]:
    """The plan and the admin key, dropped from the environment so nothing this process starts inherits them."""
    text = environ.pop(contract.FRONT_PLAN_VARIABLE, None)
    key = environ.pop(contract.FRONT_KEY_VARIABLE, "")
    if text is None:
        raise SystemExit(
            f"{contract.FRONT_PLAN_VARIABLE} is not set: the entrypoint starts the OpenAI front with its plan"
        )
    try:
        return FrontPlan.from_json(text), key
    except (ValueError, TypeError) as exc:  # written by the entrypoint of another version, or by hand
        raise SystemExit(f"{contract.FRONT_PLAN_VARIABLE} is not a front plan of this version: {exc}") from None


def main() -> None:
    plan, key = take_start(os.environ)
    beats = liveness.heartbeat_fd(os.environ.pop(contract.FRONT_HEARTBEAT_VARIABLE, None))
    logging.basicConfig(format="openai front %(process)d: %(levelname)s: %(message)s", level=logging.INFO)
    try:
        app = make_app(build(plan, key, os.environ.get(contract.FRONT_METRICS_VARIABLE)))
    except (ChatTemplateError, Error) as exc:  # one line (the entrypoint checked the template at start)
        raise SystemExit(f"error: {exc}") from None
    app.on_startup.append(liveness.beating(beats))  # the supervisor replaces a worker whose loop stops beating
    web.run_app(
        app,
        sock=listen.listening_socket(plan.host, plan.port),  # dual-stack: no other UID can take the port's IPv6 side
        shutdown_timeout=plan.shutdown_timeout,
        handler_cancellation=HANDLER_CANCELLATION,
        access_log=None,
        print=None,
    )
