"""Each endpoint's own reading of a request (openai/completions.py, openai/chat.py): what it refuses as unsupported,
how prompts and messages become the backend's prompts, and the finish reason of a choice (serving.Choice)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("msgspec")

from trtllm_entrypoint.openai import chat, completions  # noqa: E402
from trtllm_entrypoint.openai.protocol import ApiError, ChatRequest, CompletionRequest, decode  # noqa: E402
from trtllm_entrypoint.openai.serving import Choice  # noqa: E402
from trtllm_entrypoint.openai.structured import Support  # noqa: E402


def completion(**body):
    return decode(json.dumps({"model": "m", "prompt": "p", **body}).encode(), CompletionRequest)


def chat_request(**body):
    return decode(
        json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], **body}).encode(), ChatRequest
    )


@pytest.mark.parametrize(
    "body,param",
    [({"best_of": 3}, "best_of"), ({"suffix": "s"}, "suffix"), ({"logit_bias": {"1": 1}}, "logit_bias"),
     ({"logprobs": 2}, "logprobs")],
)  # fmt: skip
def test_completions_refuse_what_the_front_does_not_do_naming_the_param(body, param):
    with pytest.raises(ApiError, match="is not supported") as refused:
        completions.check(completion(**body))
    assert (refused.value.status, refused.value.param) == (400, param)
    completions.check(completion(best_of=2, n=2))  # best_of equal to n is n


@pytest.mark.parametrize(
    "body,param",
    [({"logit_bias": {"1": 1}}, "logit_bias"), ({"top_logprobs": 2}, "top_logprobs")],
)  # fmt: skip
def test_chat_refuses_what_the_front_does_not_do_naming_the_param(body, param):
    with pytest.raises(ApiError, match="is not supported") as refused:
        chat.check(chat_request(**body))
    assert (refused.value.status, refused.value.param) == (400, param)
    chat.check(chat_request(response_format={"type": "text"}))


def served_with(support, inputs=frozenset({"guided_decoding_guide_type", "guided_decoding_guide"})):
    return SimpleNamespace(support=support, model=SimpleNamespace(name="ensemble", inputs=inputs))


@pytest.mark.parametrize(
    "support,body,param,words",
    [
        (Support(None, "the model's chat template renders no tools (TOOL_CALL_PARSER=auto)"),
         {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "TOOL_CALL_PARSER"),
        (Support(None, guided_off="tag 25.01 takes no guide; the first tag that serves it is 25.05"),
         {"response_format": {"type": "json_object"}}, "response_format", "25.05"),
        (Support(None), {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "blob"}}}},
         "response_format", "schema.type"),
    ],
)  # fmt: skip
def test_chat_refuses_tools_and_formats_the_served_model_cannot_take_naming_the_field(support, body, param, words):
    with pytest.raises(ApiError, match=words) as refused:
        chat.structure(served_with(support), chat_request(**body))
    assert (refused.value.status, refused.value.param) == (400, param)


def test_a_guide_for_a_model_that_declares_no_guide_inputs_is_refused():
    with pytest.raises(ApiError, match="declares no guided decoding inputs"):
        chat.structure(served_with(Support(None), frozenset()), chat_request(response_format={"type": "json_object"}))


def test_an_assistants_calls_reach_the_template_with_their_arguments_as_an_object():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    messages = [{"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "2"}]  # fmt: skip
    rendered = chat.messages_of(chat_request(messages=messages))
    assert rendered[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert rendered[1] == {"role": "tool", "content": "2", "tool_call_id": "c1"}


def test_prompts_are_one_or_a_list_and_never_none():
    assert completions.prompts_of(completion(prompt=["a", "b"])) == ["a", "b"]
    with pytest.raises(ApiError, match="prompt is empty"):
        completions.prompts_of(completion(prompt=[]))


def test_content_parts_are_joined_and_other_parts_refused():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    named = {"role": "user", "content": parts, "name": "ann"}
    assert chat.messages_of(chat_request(messages=[named])) == [{"role": "user", "content": "ab", "name": "ann"}]
    assert chat.messages_of(chat_request(messages=[{"role": "assistant", "content": None}]))[0]["content"] == ""
    with pytest.raises(ApiError, match="only text"):
        chat.messages_of(chat_request(messages=[{"role": "user", "content": [{"type": "image_url"}]}]))


def test_a_choice_ends_by_length_only_when_no_stop_ended_it_first():
    assert Choice(0, "p", tokens=16).finish_reason(16) == "length"
    assert Choice(0, "p", tokens=16, stopped=True).finish_reason(16) == "stop"
    assert Choice(0, "p", tokens=3).finish_reason(16) == "stop"
