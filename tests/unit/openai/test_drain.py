"""openai/drain.py: the drain says when it starts and what it cut, and a stream it cuts ends with OpenAI's error
event and [DONE] (a finished body), not a broken transfer. In-process aiohttp server and client."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading

import aiohttp
import pytest
from aiohttp import web

from trtllm_entrypoint.openai.drain import ERROR_CODE, Drain


def _app(drain: Drain, tokens: int, step_s: float, chunk=lambda i: {"token": i}) -> web.Application:
    """A streaming route written as the front's answer() is: events, then [DONE]; a cut ends the same way."""

    async def route(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        with drain.stream() as live:
            try:
                for i in range(tokens):
                    await asyncio.sleep(step_s)
                    await response.write(f"data: {json.dumps(chunk(i))}\n\n".encode())
            except asyncio.CancelledError:
                if not drain.was_cut(live):
                    raise
                error = {"message": drain.cut_message, "type": "server_error", "param": None, "code": ERROR_CODE}
                await response.write(f"data: {json.dumps({'error': error})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/stream", route)
    app.router.add_post("/v1/completions", route)
    app.on_shutdown.append(drain.shutdown)
    return app


async def _serve_and_stop(tokens: int, step_s: float, grace_s: float, clients: int = 2):
    said: list[tuple[str, dict]] = []
    drain = Drain(grace_s, lambda message, **fields: said.append((message, fields)), margin_s=0.3)
    runner = web.AppRunner(_app(drain, tokens, step_s), shutdown_timeout=grace_s)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]

    async def read() -> list[str]:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/stream") as answer:
            return [line.decode().strip() async for line in answer.content if line.strip()]

    reads = [asyncio.ensure_future(read()) for _ in range(clients)]
    await asyncio.sleep(0.3)  # the streams are in flight
    await runner.cleanup()  # what SIGTERM does under web.run_app
    results = await asyncio.gather(*reads, return_exceptions=True)
    return said, results


def test_a_stream_that_outlasts_the_grace_ends_with_an_openai_error_event_and_done():
    said, results = asyncio.run(_serve_and_stop(tokens=100, step_s=0.05, grace_s=1.0))
    for events in results:
        assert not isinstance(events, BaseException), f"a broken transfer: {events!r}"
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert error["code"] == ERROR_CODE and error["type"] == "server_error" and "shutting down" in error["message"]
        assert len(events) - 2 >= 5, "the tokens before the cut reached the client"
    assert [message for message, _ in said] == ["draining the OpenAI front", "drain done"]
    assert said[0][1]["streams_in_flight"] == 2 and said[0][1]["grace_s"] == 0.7
    assert said[1][1]["cut"] == 2 and said[1][1]["finished"] == 0 and said[1][1]["seconds"] < 2.0


def test_streams_that_finish_within_the_grace_are_not_cut_and_the_drain_says_so():
    said, results = asyncio.run(_serve_and_stop(tokens=10, step_s=0.05, grace_s=5.0))
    for events in results:
        assert not isinstance(events, BaseException), events
        assert events[-1] == "data: [DONE]" and len(events) == 11 and "error" not in events[-2]
    assert said[1][0] == "drain done" and said[1][1]["cut"] == 0 and said[1][1]["finished"] == 2
    assert said[1][1]["seconds"] < 4.0, "the drain ends when the last stream does (0.5 s), not at the grace (4.7 s)"


def test_with_nothing_in_flight_the_drain_ends_at_once():
    said, _ = asyncio.run(_serve_and_stop(tokens=1, step_s=0.0, grace_s=5.0, clients=0))
    assert said[0][1]["streams_in_flight"] == 0 and said[1][1]["finished"] == said[1][1]["cut"] == 0
    assert said[1][1]["seconds"] < 1.0


@pytest.mark.process  # the client asks `uname -p` for its headers
def test_the_official_client_reads_a_cut_stream_as_an_api_error_not_a_broken_connection():
    openai = pytest.importorskip("openai")
    drain = Drain(1.0, lambda message, **fields: None, margin_s=0.3)
    app = _app(
        drain,
        tokens=200,
        step_s=0.05,
        chunk=lambda i: {
            "id": "c",
            "object": "text_completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}],
        },
    )
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)
    texts, stopping = [], []
    try:
        with pytest.raises(openai.APIError) as raised:
            for i, chunk in enumerate(client.completions.create(model="m", prompt="p", stream=True)):
                texts.append(chunk.choices[0].text)
                if i == 3:
                    stopping.append(asyncio.run_coroutine_threadsafe(runner.cleanup(), loop))
        stopping[0].result(timeout=10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    assert not isinstance(raised.value, openai.APIConnectionError), raised.value
    assert "shutting down" in str(raised.value) and len(texts) >= 4


def test_the_fronts_own_stream_is_cut_with_the_error_event_and_the_backends_stream_closed(kit):
    """The worker as server.build makes it, in front of the fake tritonserver: SIGTERM's shutdown (runner.cleanup)
    while a stream runs past the grace ends that stream with the error event and [DONE]; the backend's stream is
    closed (generation ends), and the two drain lines are said."""
    from aiohttp import ClientSession

    from harness.fake_triton import FakeTriton, Reply
    from trtllm_entrypoint.openai import server

    fake = FakeTriton(lambda body: Reply(pieces=[f" w{i}" for i in range(200)], delay_s=0.05), encode=kit.encode)
    said: list[tuple[str, dict]] = []

    async def run():
        async with fake.serve() as url:
            plan = dataclasses.replace(kit.plan, triton_url=url, shutdown_timeout=1.0)
            built = server.build(plan, kit.key)
            front = dataclasses.replace(built, drain=Drain(1.0, lambda m, **f: said.append((m, f)), margin_s=0.3))
            runner = web.AppRunner(server.make_app(front), shutdown_timeout=1.0)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            port = runner.addresses[0][1]
            body = {"model": "ensemble", "prompt": "What is TensorRT-LLM?", "max_tokens": 50, "stream": True}

            async def read():
                async with (
                    ClientSession() as session,
                    session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as answer,
                ):
                    return [line.decode().strip() async for line in answer.content if line.strip()]

            reading = asyncio.ensure_future(read())
            await asyncio.sleep(0.4)
            await runner.cleanup()
            return await reading

    events = asyncio.run(run())
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == ERROR_CODE and error["type"] == "server_error"
    texts = [json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-2]]
    assert "".join(texts).startswith(" w0 w1")  # the answer streamed (in the tokenizer's pieces) until the cut
    assert fake.seen[0].closed_by_client and not fake.seen[0].finished, "the backend's stream was closed"
    assert [m for m, _ in said] == ["draining the OpenAI front", "drain done"] and said[1][1]["cut"] == 1
