"""One worker of the OpenAI front (openai/server.py): routes, OpenAI's error shape for every failure, the admin key
(RESTRICTED_APIS groups, however a path is spelt), readiness, and the start, which takes its plan and key from the
environment and drops both. In-process with aiohttp's client in front of the FAKE tritonserver (or none); the last
test runs `python3 -m trtllm_entrypoint.openai` as its own process with the plan in its environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from harness.fake_triton import FakeTriton, Reply, words
from harness.realtriton import free_port

aiohttp = pytest.importorskip("aiohttp")

from trtllm_entrypoint import contract  # noqa: E402
from trtllm_entrypoint.openai import server  # noqa: E402
from trtllm_entrypoint.openai.plan import FrontPlan  # noqa: E402

ENTRYPOINTS = Path(__file__).resolve().parents[3] / "entrypoints"


async def answer(response) -> tuple[int, dict]:
    return response.status, await response.json()


def asking(*requests):
    """calls(url): each (method, path, json, headers) asked in turn; their (status, JSON body or text)."""

    async def calls(url):
        out = []
        async with aiohttp.ClientSession() as session:
            for method, path, body, headers in requests:
                async with session.request(method, url + path, json=body, headers=headers) as reply:
                    is_json = reply.content_type == "application/json"
                    out.append((reply.status, await reply.json() if is_json else await reply.text()))
        return out

    return calls


def test_wrong_routes_models_and_bodies_answer_in_openais_error_shape(kit):
    async def calls(url):
        async with aiohttp.ClientSession() as client:
            return [
                await answer(await client.get(f"{url}/v1/nothing")),
                await answer(await client.post(f"{url}/v1/completions", json={"model": "other", "prompt": "x"})),
                await answer(await client.post(f"{url}/v1/completions", data=b"{not json")),
                await answer(await client.get(f"{url}/v1/completions")),
                await answer(await client.get(f"{url}/v1/models")),
                await answer(await client.get(f"{url}/v1/models/ensemble")),
                await answer(await client.get(f"{url}/v1/models/other")),
            ]

    route, model, body, method, listed, card, other = kit.ask(FakeTriton(lambda body: Reply()), calls)
    assert route[0] == 404 and set(route[1]["error"]) == {"message", "type", "param", "code"}
    assert model[0] == 404 and model[1]["error"]["code"] == "model_not_found"
    assert model[1]["error"]["message"] == "the model 'other' does not exist; this server serves 'ensemble'"
    assert body[0] == 400 and "not JSON" in body[1]["error"]["message"]
    assert method[0] == 405 and method[1]["error"]["message"].startswith("GET /v1/completions")
    assert listed == (200, {"object": "list", "data": [card[1]]})
    assert card[0] == 200 and (card[1]["id"], card[1]["object"], card[1]["owned_by"]) == (
        "ensemble",
        "model",
        "trtllm-images",
    )
    assert other[0] == 404


def test_a_tritonserver_that_does_not_answer_is_a_503_and_the_front_is_not_ready(kit):
    """Honest readiness: until tritonserver reports the model ready, every /v1/* route is a 503 in OpenAI's shape
    saying the model is loading (before a stream starts), naming no internal address."""

    async def calls(url):
        async with aiohttp.ClientSession() as client:
            whole = await answer(await client.post(f"{url}/v1/completions", json={"model": "ensemble", "prompt": "x"}))
            body = {"model": "ensemble", "prompt": "x", "stream": True}
            streamed = await answer(await client.post(f"{url}/v1/completions", json=body))
            listed = await answer(await client.get(f"{url}/v1/models"))
            ready = (await client.get(f"{url}/health/ready")).status
            return whole, streamed, listed, ready, (await client.get(f"{url}/health/live")).status

    fake = FakeTriton(lambda body: Reply(), models=())  # answers, but serves no model: tritonserver still loading
    for triton_url in (f"http://127.0.0.1:{free_port()}", None):  # nothing listens yet; it listens, still loading
        *answers, ready, live = kit.ask(fake, calls, **({"triton_url": triton_url} if triton_url else {}))
        for status, body in answers:
            assert status == 503 and body["error"]["code"] == "model_not_ready", body
            assert "loading" in body["error"]["message"] and "127.0.0.1" not in body["error"]["message"]
        assert (ready, live) == (503, 200)


def test_the_front_serves_once_the_model_is_ready(kit):
    fake = FakeTriton(lambda body: Reply(pieces=["a"]), ready=False)

    async def calls(url):
        async with aiohttp.ClientSession() as client:
            before = (await client.get(f"{url}/v1/models")).status
            fake.ready = True
            after = (await client.get(f"{url}/v1/models")).status
            return before, after

    assert kit.ask(fake, calls) == (503, 200)


def test_restricted_routes_want_the_admin_key_as_the_api_key_and_tritonserver_gets_it(kit):
    key = kit.key
    body = {"model": "ensemble", "prompt": "x", "max_tokens": 1}
    fake = FakeTriton(lambda body: words("a"))
    found = kit.ask(
        fake,
        asking(
            ("POST", "/v1/completions", body, None),
            ("POST", "/v1/completions", body, {"Authorization": "Bearer wrong"}),
            ("POST", "/v1/completions", body, {"Authorization": f"Bearer {key}"}),
            ("POST", "/v1/completions", body, {"admin-key": key}),
            ("GET", "/v1/models", None, None),
            ("GET", "/health/live", None, None),
        ),
        restricted=("inference",),
    )
    assert [status for status, _ in found] == [401, 401, 200, 200, 200, 200]
    assert found[0][1]["error"]["code"] == "invalid_api_key" and found[0][1]["error"]["type"] == "authentication_error"
    assert [seen.headers.get("admin-key") for seen in fake.seen] == [key, key]  # Triton closes inference too
    open_fake = FakeTriton(lambda body: words("a"))
    kit.ask(open_fake, asking(("POST", "/v1/completions", body, None)))
    assert "admin-key" not in open_fake.seen[0].headers  # the key leaves the front only where it must


def test_every_route_of_a_restricted_group_wants_the_key_however_its_path_is_spelt(kit):
    """`metadata` closes the list and each model's card; `inference` closes both completions routes, also when the
    path is spelt otherwise (percent-encoded); health stays open. The key is checked before readiness: a client
    without it learns nothing, one with it hears that the model is loading."""
    key = kit.key
    body = {"model": "ensemble", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}
    found = kit.ask(
        FakeTriton(lambda body: Reply(), ready=False),
        asking(
            ("GET", "/v1/models", None, None),
            ("GET", "/v1/models/ensemble", None, None),
            ("GET", "/v1/models/ensemble", None, {"admin-key": key}),
            ("GET", "/v1/%6Dodels/ensemble", None, None),
            ("POST", "/v1/chat/completions", body, None),
            ("POST", "/v1/%63hat/completions", body, None),
            ("POST", "/v1/completions", body, None),
            ("GET", "/health/ready", None, None),
        ),
        restricted=("metadata", "inference"),
    )
    assert [status for status, _ in found] == [401, 401, 503, 401, 401, 401, 401, 503]
    assert found[2][1]["error"]["code"] == "model_not_ready"


def test_the_start_takes_the_plan_and_the_key_from_the_environment_and_drops_both(kit):
    environ = {contract.FRONT_PLAN_VARIABLE: kit.plan.to_json(), contract.FRONT_KEY_VARIABLE: "k", "OTHER": "x"}
    assert server.take_start(environ) == (kit.plan, "k") and environ == {"OTHER": "x"}
    with pytest.raises(SystemExit, match=f"{contract.FRONT_PLAN_VARIABLE} is not set"):
        server.take_start({contract.FRONT_KEY_VARIABLE: "k"})
    with pytest.raises(SystemExit, match="not a front plan of this version: front plan fields differ"):
        server.take_start({contract.FRONT_PLAN_VARIABLE: '{"host": "x"}'})
    with pytest.raises(SystemExit, match="not a front plan of this version"):
        server.take_start({contract.FRONT_PLAN_VARIABLE: "not json"})


def test_a_worker_started_by_hand_with_a_broken_chat_template_stops_with_one_line(kit, monkeypatch):
    """The entrypoint refuses it at start; a worker started some other way says why in one line, no traceback."""
    (Path(kit.plan.tokenizer) / "chat_template.jinja").write_text("{% for m in messages %}")
    monkeypatch.setenv(contract.FRONT_PLAN_VARIABLE, kit.plan.to_json())
    with pytest.raises(SystemExit, match=r"^error: the chat template in .*chat_template.jinja does not compile"):
        server.main()


@pytest.mark.process
def test_the_worker_runs_as_its_own_process_from_the_plan_in_its_environment(kit, tmp_path):
    key = kit.key
    fake = FakeTriton(lambda body: words("from the fake"))
    with fake.running() as url:
        plan = FrontPlan(**{**kit.plan.__dict__, "triton_url": url, "port": free_port(), "restricted": ("inference",)})
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ENTRYPOINTS), os.environ.get("PYTHONPATH", "")) if p),
            contract.FRONT_PLAN_VARIABLE: plan.to_json(),
            contract.FRONT_KEY_VARIABLE: key,
        }
        log = tmp_path / "worker.log"
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "trtllm_entrypoint.openai"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            base = f"http://127.0.0.1:{plan.port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    ready = urllib.request.urlopen(f"{base}/health/ready", timeout=5).status  # noqa: S310
                    break
                except OSError:
                    assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
                    time.sleep(0.1)
            request = urllib.request.Request(
                f"{base}/v1/completions",
                data=b'{"model": "ensemble", "prompt": "p", "max_tokens": 5}',
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            answer = json.loads(urllib.request.urlopen(request, timeout=10).read())  # noqa: S310
        finally:
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(timeout=30)
    assert ready == 200 and answer["choices"][0]["text"] == "from the fake"
    assert fake.seen[0].headers["admin-key"] == key  # the key from the environment reached the backend
    assert code == 0 and key not in log.read_text()
