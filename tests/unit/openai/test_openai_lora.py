"""LoRA adapters in the front (FrontPlan.adapters): `/v1/models` lists the base and each adapter (vLLM's `parent`),
`model` set to an adapter's name sends its task id as the model's `lora_task_id`, and an unknown name is OpenAI's 404.
The front runs in-process before the FAKE tritonserver, asked by the official `openai` client."""

from __future__ import annotations

import pytest

from harness.fake_triton import FakeTriton, words

openai = pytest.importorskip("openai")

# The official client asks the platform for its headers once (`uname -p`): a program, so this layer.
pytestmark = pytest.mark.process

ADAPTERS = {"sql-expert": 1823467311, "support": 42}
# The ensemble of tensorrtllm_backend v0.15.0 on declares lora_task_id (UINT64 [1]) and passes it to tensorrt_llm.
LORA_CONFIG = """name: "ensemble"
input [
  { name: "text_input" }, { name: "max_tokens" }, { name: "stream" }, { name: "bad_words" }, { name: "stop_words" },
  { name: "lora_task_id" }
]
output [ { name: "text_output" } ]
"""


@pytest.fixture
def lora_kit(kit, tmp_path):
    config = tmp_path / "lora" / "ensemble" / "config.pbtxt"
    config.parent.mkdir(parents=True)
    config.write_text(LORA_CONFIG)
    return kit, {"config": str(config), "adapters": ADAPTERS}


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_the_models_list_names_the_base_and_each_adapter_with_its_parent(lora_kit):
    kit, plan = lora_kit

    async def calls(url):
        api = client(url)
        listed = await api.models.list()
        one = await api.models.retrieve("support")
        with pytest.raises(openai.NotFoundError) as missing:
            await api.models.retrieve("nope")
        return listed, one, missing.value

    listed, one, missing = kit.ask(FakeTriton(lambda body: words("x")), calls, **plan)
    cards = {m.id: m.model_extra for m in listed.data}
    assert list(cards) == ["ensemble", "sql-expert", "support"]
    assert cards["ensemble"]["parent"] is None and cards["sql-expert"]["parent"] == "ensemble"
    assert all(extra["root"] == "ensemble" for extra in cards.values())
    assert one.id == "support" and one.model_extra["parent"] == "ensemble"
    assert missing.response.json()["error"]["code"] == "model_not_found"


def test_an_adapters_name_sends_its_task_id_and_the_base_sends_none(lora_kit):
    kit, plan = lora_kit
    fake = FakeTriton(lambda body: words("an answer"))

    async def calls(url):
        api = client(url)
        adapted = await api.completions.create(model="sql-expert", prompt="p", max_tokens=4)
        streamed = [c async for c in await api.chat.completions.create(
            model="support", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True)]  # fmt: skip
        base = await api.completions.create(model="ensemble", prompt="p", max_tokens=4)
        return adapted, streamed, base

    adapted, streamed, base = kit.ask(fake, calls, **plan)
    assert [seen.body.get("lora_task_id") for seen in fake.seen] == [1823467311, 42, None]
    assert adapted.model == "sql-expert" and {c.model for c in streamed} == {"support"} and base.model == "ensemble"
    assert adapted.choices[0].text == "an answer"


def test_an_unknown_model_is_openais_404_naming_what_is_served(lora_kit):
    kit, plan = lora_kit
    fake = FakeTriton(lambda body: words("x"))

    async def calls(url):
        with pytest.raises(openai.NotFoundError) as missing:
            await client(url).completions.create(model="sql_expert", prompt="p", max_tokens=2)
        return missing.value.response.json()["error"]

    error = kit.ask(fake, calls, **plan)
    assert error["code"] == "model_not_found" and error["param"] == "model" and error["type"] == "not_found_error"
    assert "'sql_expert' does not exist" in error["message"] and "adapters sql-expert, support" in error["message"]
    assert fake.seen == []  # nothing reached the model


def test_a_model_without_the_lora_input_refuses_an_adapter_rather_than_serving_the_base(kit):
    fake = FakeTriton(lambda body: words("x"))

    async def calls(url):
        with pytest.raises(openai.BadRequestError) as refused:
            await client(url).completions.create(model="sql-expert", prompt="p", max_tokens=2)
        return refused.value.response.json()["error"]

    error = kit.ask(fake, calls, adapters=ADAPTERS)  # the conftest's ensemble declares no lora_task_id
    assert "takes no LoRA adapter" in error["message"] and fake.seen == []
