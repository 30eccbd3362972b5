"""The client to tritonserver (openai/backend.py) against the FAKE tritonserver: events as they come, tritonserver's
error answers and error events as ApiError (400 stays 400, anything else is a 502), a server that does not answer as
a 503, readiness, and the admin key carried where inference is closed."""

from __future__ import annotations

import asyncio

import pytest

from harness.fake_triton import FakeTriton, Reply
from harness.realtriton import free_port

pytest.importorskip("aiohttp")

from trtllm_entrypoint.openai import backend  # noqa: E402
from trtllm_entrypoint.openai.backend import Backend  # noqa: E402
from trtllm_entrypoint.openai.protocol import ApiError  # noqa: E402


def run(fake: FakeTriton, calls, entry_model="ensemble", headers=None):
    async def main():
        async with fake.serve() as url:
            backend = Backend(url + "/", entry_model, headers or {})
            await backend.open()
            try:
                return await calls(backend)
            finally:
                await backend.close()

    return asyncio.run(main())


async def collect(backend: Backend, body) -> list[dict] | ApiError:
    try:
        return [event async for event in backend.events(body)]
    except ApiError as exc:
        return exc


def test_events_come_as_tritonserver_sends_them_with_the_headers_given():
    fake = FakeTriton(lambda body: Reply(pieces=["a", "b"], logprobs=[-1.0, -2.0]))

    async def calls(backend):
        return await collect(backend, {"text_input": "x", "max_tokens": 5, "return_log_probs": True})

    events = run(fake, calls, headers={"admin-key": "k"})
    assert [(e["text_output"], e["output_log_probs"]) for e in events] == [("a", [[-1.0]]), ("b", [[-2.0]])]
    assert fake.seen[0].body["text_input"] == "x" and fake.seen[0].headers["admin-key"] == "k"


def test_tritonservers_errors_become_openai_errors():
    replies = {"bad": Reply(status=400, error="bad"), "crash": Reply(status=500, error="crash"),
               "late": Reply(pieces=["a"], error="late")}  # fmt: skip
    fake = FakeTriton(lambda body: replies[body["text_input"]])

    async def calls(backend):
        return {prompt: await collect(backend, {"text_input": prompt}) for prompt in replies}

    found = run(fake, calls)
    assert found["bad"].status == 400 and found["bad"].message.startswith("the model refused the request: bad (ref ")
    assert (found["crash"].status, found["crash"].code) == (502, "backend_error")
    assert "crash" not in found["crash"].message  # only named: the log has tritonserver's words
    # An error event's text, parsed from its SSE event: never the `data:` framing or the JSON around it.
    assert found["late"].status == 400 and found["late"].message.startswith("the model refused the request: late (")
    unknown = run(fake, lambda backend: collect(backend, {"text_input": "bad"}), entry_model="other")
    assert unknown.status == 400 and "unknown model: 'other'" in unknown.message


def test_a_tritonserver_that_does_not_answer_is_a_503_and_not_ready():
    async def calls():
        backend = Backend(f"http://127.0.0.1:{free_port()}", "ensemble", {})
        await backend.open()
        try:
            return await collect(backend, {"text_input": "x"}), await backend.ready()
        finally:
            await backend.close()

    error, ready = asyncio.run(calls())
    assert (error.status, error.code, ready) == (503, "backend_unavailable", False)
    # No internal address or library message reaches the client: the log has them, under the same reference.
    assert "127.0.0.1" not in error.message and "Cannot connect" not in error.message and "(ref " in error.message


@pytest.mark.parametrize(
    "message",
    [
        "Cannot connect to host 127.0.0.1:8000 ssl:default [Connect call failed ('127.0.0.1', 8000)]",
        "in ensemble 'ensemble', Failed to open http://10.1.2.3:8001/v2 from /opt/tritonserver/backends/python/m.py",
        "Cannot connect to host localhost:8000 ssl:default [Connect call failed ('::1', 8000, 0, 0)]",
        'error at [::1]:8000\nTraceback (most recent call last):\n  File "/opt/x/model.py", line 3',
    ],
)
def test_a_backend_refusal_keeps_its_first_line_without_addresses_or_paths(message):
    shown = backend.public(message)
    for internal in ("127.0.0.1", "10.1.2.3", "localhost:8000", "::1", "/opt/", "Traceback", "model.py"):
        assert internal not in shown, shown


def test_ready_follows_the_entry_models_readiness():
    fake = FakeTriton(lambda body: Reply())

    async def calls(backend):
        first = await backend.ready()
        fake.ready = False
        return first, await backend.ready()

    assert run(fake, calls) == (True, False)
    assert run(fake, lambda backend: backend.ready(), entry_model="other") is False


def test_events_read_together_are_yielded_before_the_stream_waits_again():
    """Several events in one read come one after another with no wait between them; `idle` (the Sink's flush) runs
    only before the stream waits for more. An event split across reads is put back together, and the last one may
    end without its line's end."""
    from aiohttp import web

    burst = b"".join(b'data: {"output_ids": %d}\n\n' % i for i in range(5))

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(burst + b'data: {"output_')
        await asyncio.sleep(0.2)
        await response.write(b'ids": 5}\n\ndata: {"output_ids": 6}')
        return response

    async def main() -> list[object]:
        app = web.Application()
        app.router.add_post("/v2/models/tensorrt_llm/generate_stream", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        seen: list[object] = []

        async def idle() -> None:
            seen.append("idle")

        client = Backend(f"http://127.0.0.1:{port}", "tensorrt_llm", {})
        await client.open()
        try:
            async for event in client.events({"input_ids": [1]}, idle):
                seen.append(event["output_ids"])
        finally:
            await client.close()
            await runner.cleanup()
        return seen

    seen = asyncio.run(main())
    assert [x for x in seen if x != "idle"] == [0, 1, 2, 3, 4, 5, 6]
    assert seen[seen.index(0) : seen.index(4) + 1] == [0, 1, 2, 3, 4]  # one read: no wait between them
    assert "idle" in seen[seen.index(4) : seen.index(5)]  # the split event: the stream waited for its rest
