"""Tools and structured output through one worker of the front, asked by the official `openai` client (its own
assembly of streamed tool calls, and `beta.chat.completions.parse` with a pydantic model), in front of the FAKE
tritonserver scripted with model answers written as each family writes calls: what the client ends with, what the
backend was sent (the guide inputs), and the 400s that leave the backend untouched."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pydantic
import pytest

from harness.fake_triton import FakeTriton, Reply

openai = pytest.importorskip("openai")
# The client reads platform.platform() (which runs `uname -p` once per process) at its first request: read here, at
# collection, so that it is not counted as a program these in-process tests start.
platform.platform()

# The ensemble's inputs from tensorrtllm_backend v0.19.0 on: the sampling ones and the two guide inputs.
GUIDED_CONFIG = """name: "ensemble"
input [
  { name: "text_input" }, { name: "max_tokens" }, { name: "stream" }, { name: "bad_words" }, { name: "stop_words" },
  { name: "temperature" }, { name: "top_p" }, { name: "top_k" }, { name: "random_seed" }, { name: "return_log_probs" },
  { name: "guided_decoding_guide_type" }, { name: "guided_decoding_guide" }
]
output [ { name: "text_output" }, { name: "output_log_probs" } ]
"""
# Small templates in each family's manner: the tools rendered into the prompt, the family's call marker in the text.
TEMPLATES = {
    "hermes": "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools> Call with <tool_call>"
    "{% endif %}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% for c in m.tool_calls or [] %}"
    "<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}\n{% endfor %}assistant:",
    "mistral": "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}[INST]{{ m['content'] }}[/INST]{% if m.tool_calls %}[TOOL_CALLS]{% endif %}{% endfor %}",
    "llama3_json": "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>{{ m['content'] }}"
    "{% endfor %}{% if tools %}Answer with a JSON call of {{ tools | tojson }} (parameters), or <|python_tag|>"
    "{% endif %}<|start_header_id|>assistant<|end_header_id|>",
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# The model's answer, as the backend streams it (token-sized pieces).
ANSWERS = {
    "hermes": [
        "Let me ",
        "look.",
        "\n<tool",
        "_call>\n",
        '{"name": ',
        '"get_weather", ',
        '"arguments": {"ci',
        'ty": "Pa',
        'ris"}}\n',
        "</tool_call>",
    ],  # fmt: skip
    "mistral": ["[TOOL_CALLS]", "get_", "weather", "[ARGS]", '{"city"', ': "Pa', 'ris"}'],
    "llama3_json": ['{"name": "get_', 'weather", "parameters": ', '{"city": ', '"Paris"}}'],
}


class Forecast(pydantic.BaseModel):
    city: str
    celsius: float


def with_template(kit, tmp_path: Path, family: str, config: str = GUIDED_CONFIG):
    (Path(kit.plan.tokenizer) / "chat_template.jinja").write_text(TEMPLATES[family])
    path = tmp_path / "guided" / "config.pbtxt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(config)
    return {"config": str(path), "max_seq_len": 4096}


def client(url: str):
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.mark.parametrize("family", sorted(ANSWERS))
def test_the_client_gets_tool_calls_whole_and_assembles_them_streamed(kit, tmp_path, family):
    plan = with_template(kit, tmp_path, family)
    fake = FakeTriton(lambda body: Reply(pieces=ANSWERS[family]))
    messages = [{"role": "user", "content": "Weather in Paris?"}]

    async def calls(url):
        api = client(url)
        whole = await api.chat.completions.create(model="ensemble", messages=messages, tools=[WEATHER])
        async with api.chat.completions.stream(model="ensemble", messages=messages, tools=[WEATHER]) as stream:
            chunks = [event async for event in stream if event.type == "chunk"]
            streamed = await stream.get_final_completion()
        # The conversation goes on: the call and its result rendered into the next prompt.
        call = whole.choices[0].message.tool_calls[0]
        follow = [*messages, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'}]  # fmt: skip
        await api.chat.completions.create(model="ensemble", messages=follow, tools=[WEATHER])
        return whole, chunks, streamed

    whole, chunks, streamed = kit.ask(fake, calls, **plan)
    for answer in (whole, streamed):
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls
        assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
            "function", "get_weather", {"city": "Paris"})  # fmt: skip
        assert (choice.message.content or None) == ("Let me look.\n" if family == "hermes" else None)
    if family == "mistral":
        assert len(whole.choices[0].message.tool_calls[0].id) == 9  # what Mistral's templates accept back
    # Streamed as OpenAI does: the call's first delta names it, later ones carry its arguments in pieces.
    deltas = [
        c.chunk.choices[0].delta.tool_calls[0]
        for c in chunks
        if c.chunk.choices and c.chunk.choices[0].delta.tool_calls
    ]  # noqa: E501
    assert deltas[0].id and deltas[0].function.name == "get_weather" and len(deltas) > 2
    # the rendered prompt, as the engine workflow sends it (token ids to the tensorrt_llm model)
    sent = [kit.tokenizer.decode(seen.body["input_ids"], skip_special_tokens=False) for seen in fake.seen]
    assert "tools" in sent[0] or "get_weather" in sent[0]
    assert '{"celsius": 21}' in sent[2]
    if family == "hermes":  # the call rendered back with its arguments as an object, as templates expect
        assert '"arguments": {"city": "Paris"}' in sent[2]
    assert all("guided_decoding_guide_type" not in seen.body for seen in fake.seen)  # auto: no guide


def test_parse_with_a_pydantic_model_sends_its_schema_as_the_guide_and_parses_the_answer(kit, tmp_path):
    plan = with_template(kit, tmp_path, "hermes")
    fake = FakeTriton(lambda body: Reply(pieces=['{"city": ', '"Paris", ', '"celsius": 21.5}']))

    async def calls(url):
        api = client(url)
        return await api.beta.chat.completions.parse(
            model="ensemble", messages=[{"role": "user", "content": "Weather?"}], response_format=Forecast
        )

    parsed = kit.ask(fake, calls, **plan)
    assert parsed.choices[0].message.parsed == Forecast(city="Paris", celsius=21.5)
    body = fake.seen[0].body
    assert body["guided_decoding_guide_type"] == "json_schema"
    assert json.loads(body["guided_decoding_guide"]) == Forecast.model_json_schema() | {"additionalProperties": False}


def test_a_named_tool_choice_is_guided_by_its_parameters_and_read_as_that_call(kit, tmp_path):
    plan = with_template(kit, tmp_path, "hermes")
    fake = FakeTriton(lambda body: Reply(pieces=['{"city"', ': "Oslo"}']))
    choice = {"type": "function", "function": {"name": "get_weather"}}

    async def calls(url):
        api = client(url)
        messages = [{"role": "user", "content": "Weather?"}]
        whole = await api.chat.completions.create(
            model="ensemble", messages=messages, tools=[WEATHER], tool_choice=choice
        )  # noqa: E501
        required = await api.chat.completions.create(
            model="ensemble", messages=messages, tools=[WEATHER], tool_choice="required"
        )  # noqa: E501
        return whole, required

    fake_required = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    fake.script = lambda body: Reply(
        pieces=[fake_required] if "array" in body.get("guided_decoding_guide", "") else ['{"city"', ': "Oslo"}']
    )  # noqa: E501
    whole, required = kit.ask(fake, calls, **plan)
    for answer in (whole, required):
        [call] = answer.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Oslo"})
    assert json.loads(fake.seen[0].body["guided_decoding_guide"]) == WEATHER["function"]["parameters"]
    assert json.loads(fake.seen[1].body["guided_decoding_guide"])["type"] == "array"


def test_where_guided_decoding_is_off_response_format_is_a_400_and_the_backend_sees_nothing(kit, tmp_path):
    plan = with_template(kit, tmp_path, "hermes")
    off = "tag 25.01's backend takes no guide; the first tag that serves response_format is 25.05"
    fake = FakeTriton(lambda body: Reply(pieces=["x"]))

    async def calls(url):
        api = client(url)
        errors = []
        for response_format in (
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "f", "schema": {"type": "object"}}},
        ):  # noqa: E501
            try:
                await api.chat.completions.create(model="ensemble", messages=[{"role": "user", "content": "x"}],
                                                  response_format=response_format)  # fmt: skip
            except openai.BadRequestError as exc:
                errors.append(exc.response.json()["error"])
        return errors

    errors = kit.ask(fake, calls, **plan, guided_off=off)
    assert len(errors) == 2 and all(e["param"] == "response_format" and "25.05" in e["message"] for e in errors)
    assert fake.seen == []


def test_a_template_that_renders_no_tools_refuses_them_naming_the_variable(kit):
    fake = FakeTriton(lambda body: Reply(pieces=["x"]))

    async def calls(url):
        try:
            await client(url).chat.completions.create(
                model="ensemble", messages=[{"role": "user", "content": "x"}], tools=[WEATHER]
            )
        except openai.BadRequestError as exc:
            return exc.response.json()["error"]

    error = kit.ask(fake, calls)  # the kit's template writes the messages only
    assert error["param"] == "tools" and "TOOL_CALL_PARSER" in error["message"] and fake.seen == []


def test_a_guide_the_engine_refuses_is_a_400_naming_response_format_not_a_502(kit, tmp_path):
    """The grammar compiler is the engine's: what the front's checks let through and xgrammar still refuses comes
    back as the backend's error response (in the stream, or as tritonserver's 400), which the client gets as a 400."""
    plan = with_template(kit, tmp_path, "hermes")
    refusals = iter(
        [Reply(error="[TensorRT-LLM][ERROR] xgrammar: unsupported keyword"), Reply(status=400, error="bad guide")]
    )  # noqa: E501
    fake = FakeTriton(lambda body: next(refusals))
    schema = {"type": "json_schema", "json_schema": {"name": "f", "schema": {"type": "object", "format": "duration"}}}

    async def calls(url):
        errors = []
        for _ in range(2):
            try:
                await client(url).chat.completions.create(
                    model="ensemble", messages=[{"role": "user", "content": "x"}], response_format=schema
                )
            except openai.APIStatusError as exc:
                errors.append((exc.status_code, exc.response.json()["error"]))
        return errors

    errors = kit.ask(fake, calls, **plan)
    assert [status for status, _ in errors] == [400, 400]
    assert all(error["code"] == "backend_error" and error["param"] == "response_format" for _, error in errors)
