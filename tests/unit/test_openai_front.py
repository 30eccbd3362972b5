"""The OpenAI front's HTTP side in-process (aiohttp's test server), with no tritonserver behind it: what a client
gets for a wrong route, model or key, and when tritonserver does not answer. Streaming through the real server is
tests/unit/test_real_openai.py's."""

from __future__ import annotations

import asyncio

import pytest

from harness import realtriton
from harness.tiny_checkpoint import tiny_llama

aiohttp = pytest.importorskip("aiohttp")
front_mod = pytest.importorskip("trtllm_entrypoint.openai_front")
api = pytest.importorskip("trtllm_entrypoint.openai_api")
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

KEY = "front-test-key-0123456789"
CONFIG = 'name: "served"\ninput [ { name: "text_input" }, { name: "max_tokens" }, { name: "stream" } ]\n'


def front(tmp_path, restricted=frozenset()):
    tokenizer = tiny_llama(tmp_path / "tiny")
    return front_mod.Front(
        model=api.Model.from_config("served", "engine", CONFIG, "config.pbtxt"),
        template=front_mod.chat_template(tokenizer),
        count_tokens=front_mod.token_counter(tokenizer),
        triton_url=f"http://127.0.0.1:{realtriton.free_port()}",  # nothing listens there
        restricted=frozenset(restricted),
        key=KEY,
        max_seq_len=64,
    )


def ask(served, calls):
    """Run `calls(client)` against the app; what it returns."""

    async def run():
        async with TestClient(TestServer(front_mod.make_app(served))) as client:
            return await calls(client)

    return asyncio.run(run())


async def answer(response) -> tuple[int, dict]:
    return response.status, await response.json()


def test_wrong_routes_models_and_bodies_answer_in_openais_error_shape(tmp_path):
    async def calls(client):
        return [
            await answer(await client.get("/v1/nothing")),
            await answer(await client.post("/v1/completions", json={"model": "other", "prompt": "x"})),
            await answer(await client.post("/v1/completions", data=b"{not json")),
            await answer(await client.get("/v1/completions")),
            await answer(await client.get("/v1/models")),
        ]

    route, model, body, method, listed = ask(front(tmp_path), calls)
    assert route[0] == 404 and set(route[1]["error"]) == {"message", "type", "param", "code"}
    assert (
        model[0] == 404 and model[1]["error"]["code"] == "model_not_found" and "served" in model[1]["error"]["message"]
    )
    assert body[0] == 400 and "not JSON" in body[1]["error"]["message"]
    assert method[0] == 405
    assert listed[0] == 200 and listed[1]["object"] == "list"
    assert [(m["id"], m["object"]) for m in listed[1]["data"]] == [("served", "model")]


def test_a_tritonserver_that_does_not_answer_is_a_503_and_the_front_is_not_ready(tmp_path):
    async def calls(client):
        whole = await answer(await client.post("/v1/completions", json={"model": "served", "prompt": "x"}))
        streamed = await client.post("/v1/completions", json={"model": "served", "prompt": "x", "stream": True})
        ready = await client.get("/health/ready")
        return whole, (streamed.status, await streamed.text()), ready.status, (await client.get("/health/live")).status

    whole, (status, events), ready, live = ask(front(tmp_path), calls)
    assert whole[0] == 503 and whole[1]["error"]["code"] == "backend_unavailable"
    # A stream has sent its status already: the error is an event of it, then [DONE], as OpenAI's streams end.
    assert status == 200 and '"backend_unavailable"' in events and events.rstrip().endswith("data: [DONE]")
    assert (ready, live) == (503, 200)


def test_restricted_routes_want_the_admin_key_as_the_api_key(tmp_path):
    async def calls(client):
        body = {"model": "served", "prompt": "x"}
        return [
            (await client.post("/v1/completions", json=body)).status,
            (await client.post("/v1/completions", json=body, headers={"Authorization": "Bearer wrong"})).status,
            (await client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})).status,
            (await client.post("/v1/completions", json=body, headers={"admin-key": KEY})).status,
            (await client.get("/v1/models")).status,
            (await client.get("/health/live")).status,
        ]

    # With the key the request passes the front and reaches (here: misses) tritonserver.
    assert ask(front(tmp_path, {"inference"}), calls) == [401, 401, 503, 503, 200, 200]


def test_every_route_of_a_restricted_group_wants_the_key_however_its_path_is_spelt(tmp_path):
    """`metadata` closes the list and each model's card; `inference` closes both completions routes, also when the
    path is spelt otherwise (percent-encoded); health stays open."""

    async def calls(client):
        body = {"model": "served", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}
        with_key = {"admin-key": KEY}
        return [
            (await client.get("/v1/models")).status,
            (await client.get("/v1/models/served")).status,
            (await client.get("/v1/models/served", headers=with_key)).status,
            (await client.get("/v1/%6Dodels/served")).status,
            (await client.post("/v1/chat/completions", json=body)).status,
            (await client.post("/v1/%63hat/completions", json=body)).status,
            (await client.post("/v1/completions", json=body)).status,
            (await client.get("/health/ready")).status,
        ]

    assert ask(front(tmp_path, {"metadata", "inference"}), calls) == [401, 401, 200, 401, 401, 401, 401, 503]
