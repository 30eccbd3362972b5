"""Structured output and guided tool choice for real: `trtllm-entrypoint prepare` with FRONTEND=openai, the real
tritonserver 2.51.0 with upstream's v0.19.0 templates (the first with guided decoding), our front, the official
`openai` client. The engine double records the guide inputs that reached it, after Triton's core checked them
against the declared names and types (a wrong name or type is refused there, so a record means the wire is right),
and checks the tokenizer-info file prepare made as the C++ backend reads it at load. Where there is no guided
decoding (25.01's templates, the llmapi workflow), `response_format` is a 400 before anything reaches tritonserver.
What this cannot prove: that xgrammar keeps the output to the schema (that needs the real engine on a GPU)."""

from __future__ import annotations

import json
import os
import re
import urllib.request

import pydantic
import pytest

from harness import realfront
from harness.image import Image, templates_for
from harness.tiny_checkpoint import PROMPT
from tests.real.test_real_openai import KEY, prepared, with_chat_template
from trtllm_entrypoint.contract import ADMIN_KEY_HEADER

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
MESSAGES = [{"role": "user", "content": PROMPT}]


class Forecast(pydantic.BaseModel):
    city: str
    celsius: float


def records(directory) -> list[dict]:
    path = directory / "tensorrtllm_requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def successes(front: realfront.RunningFront, name: str) -> int:
    """How many inferences tritonserver's own statistics count for the served model."""
    asked = urllib.request.Request(f"{front.triton_url}/v2/models/{name}/stats", headers={ADMIN_KEY_HEADER: KEY})
    with urllib.request.urlopen(asked, timeout=10) as reply:  # noqa: S310
        stats = json.loads(reply.read())
    return sum(s["inference_stats"]["success"]["count"] for s in stats["model_stats"])


def test_every_guided_form_reaches_the_engine_as_the_backends_guide_on_25_05(tmp_path, real_triton):
    img = Image(tmp_path, "25.05", templates_for("v0.19.0"))
    with_chat_template(img)
    out = prepared(img)
    name = out["ready"]["served_model_name"]
    config = (img.repo / "tensorrt_llm" / "config.pbtxt").read_text()
    info_path = re.search(r'key: "xgrammar_tokenizer_info_path"\s*value: \{\s*string_value: "([^"]+)"', config)
    assert 'string_value: "xgrammar"' in config and info_path is not None
    assert str(img.cache) in info_path.group(1)  # made by prepare, inside the cache
    recorded = tmp_path / "engine-records"
    recorded.mkdir()
    compact = json.dumps(SCHEMA, separators=(",", ":"))
    asked = [
        ({"type": "json_object"}, {"guided_decoding_guide_type": "json"}),
        (
            {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}},
            {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": compact},
        ),  # fmt: skip
        (
            {"type": "regex", "regex": "[0-9]{3}"},
            {"guided_decoding_guide_type": "regex", "guided_decoding_guide": "[0-9]{3}"},
        ),  # noqa: E501
        (
            {"type": "ebnf", "ebnf": 'root ::= "yes" | "no"'},
            {"guided_decoding_guide_type": "ebnf_grammar", "guided_decoding_guide": 'root ::= "yes" | "no"'},
        ),  # fmt: skip
    ]
    with realfront.start(real_triton, out, KEY, env={**os.environ, "DOUBLE_RECORD_DIR": str(recorded)},
                         log_dir=tmp_path) as front:  # fmt: skip
        api = openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0, timeout=60)
        for response_format, _ in asked:
            api.chat.completions.create(
                model=name, messages=MESSAGES, max_tokens=2, extra_body={"response_format": response_format}
            )
        streamed = list(api.chat.completions.create(model=name, messages=MESSAGES, max_tokens=2, stream=True,
                                                    response_format=asked[1][0]))  # fmt: skip
        with pytest.raises((openai.LengthFinishReasonError, pydantic.ValidationError)):  # the double writes no JSON
            api.beta.chat.completions.parse(model=name, messages=MESSAGES, max_tokens=2, response_format=Forecast)
        choice = {"type": "function", "function": {"name": "get_weather"}}
        named = api.chat.completions.create(
            model=name, messages=MESSAGES, max_tokens=2, tools=[WEATHER], tool_choice=choice
        )
        before = successes(front, out["front"]["plan"]["entry_model"])
        with pytest.raises(openai.BadRequestError) as bad_schema:
            remote = {"name": "x", "schema": {"$ref": "https://evil.example/s"}}
            api.chat.completions.create(
                model=name,
                messages=MESSAGES,
                max_tokens=2,
                response_format={"type": "json_schema", "json_schema": remote},
            )
        after = successes(front, out["front"]["plan"]["entry_model"])
        assert front.stop() == 0, front.log()[-3000:]
    got = records(recorded)
    assert all(entry["guided_decoding"] for entry in got)  # the backend loaded the info file and was set up for it
    guides = [{k: v for k, v in entry.items() if k != "guided_decoding"} for entry in got]
    assert guides[:4] == [expected for _, expected in asked]
    assert guides[4] == asked[1][1] and streamed[-1].choices[0].finish_reason == "length"
    sdk = guides[5]  # what the SDK's parse() sends for a pydantic model
    assert sdk["guided_decoding_guide_type"] == "json_schema"
    assert set(json.loads(sdk["guided_decoding_guide"])["properties"]) == {"city", "celsius"}
    assert guides[6] == {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": compact}
    # Named choice: the answer is read as that tool's arguments (the double's text is no JSON: still the call)
    assert named.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert bad_schema.value.response.json()["error"]["param"] == "response_format" and after == before
    assert len(got) == 7


@pytest.mark.parametrize(
    "tag,templates,why",
    [("25.01", "v0.17.0", "25.05"), ("26.07", "triton_backend", "WORKFLOW=engine")],
)
def test_response_format_is_a_400_naming_the_way_out_where_no_guide_is_taken(
    tmp_path, real_triton, tag, templates, why
):  # noqa: E501
    img = Image(tmp_path, tag, templates_for(templates))
    with_chat_template(img)
    out = prepared(img)
    name = out["ready"]["served_model_name"]
    with realfront.start(real_triton, out, KEY, log_dir=tmp_path) as front:
        api = openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0, timeout=60)
        refused = []
        for response_format in (
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}},
        ):  # noqa: E501
            with pytest.raises(openai.BadRequestError) as raised:
                api.chat.completions.create(
                    model=name, messages=MESSAGES, max_tokens=2, response_format=response_format
                )  # noqa: E501
            refused.append(raised.value.response.json()["error"])
        reached = successes(front, out["front"]["plan"]["entry_model"])
        plain = api.chat.completions.create(model=name, messages=MESSAGES, max_tokens=2)  # text still serves
        assert front.stop() == 0, front.log()[-3000:]
    assert all(e["param"] == "response_format" and why in e["message"] and "25.05" in e["message"] for e in refused)
    assert reached == 0 and plain.choices[0].finish_reason == "length"
