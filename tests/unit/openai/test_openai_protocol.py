"""The wire format (openai/protocol.py): requests read as OpenAI defines them, bad ones refused naming the field, and
every answer Struct read back by the official `openai` client's own types, with OpenAI's nulls where it has them."""

from __future__ import annotations

import json

import pytest

msgspec = pytest.importorskip("msgspec")
openai = pytest.importorskip("openai")

from trtllm_entrypoint.openai import protocol as p  # noqa: E402

USAGE = p.Usage.of(5, 2)


@pytest.mark.parametrize(
    "body,param",
    [({"max_tokens": -1}, "max_tokens"), ({"n": 0}, "n"), ({"temperature": "hot"}, "temperature"), ({}, None)],
)
def test_bad_requests_name_the_field_in_openais_error_shape(body, param):
    raw = json.dumps({"model": "served", **({"prompt": "x"} if body else {}), **body}).encode()
    with pytest.raises(p.ApiError) as bad:
        p.decode(raw, p.CompletionRequest)
    error = msgspec.to_builtins(bad.value.body())["error"]
    assert bad.value.status == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == (param or error["param"]) and set(error) == {"message", "type", "param", "code"}


def test_a_body_that_is_not_json_is_a_400_and_each_status_has_its_type():
    with pytest.raises(p.ApiError, match="the body is not JSON"):
        p.decode(b"{not json", p.ChatRequest)
    assert [p.ApiError(s, "m").type for s in (400, 401, 404, 502, 503)] == [
        "invalid_request_error", "authentication_error", "not_found_error", "server_error", "server_error",
    ]  # fmt: skip


def test_requests_keep_what_they_were_sent():
    chat = p.decode(
        b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}], '
        b'"stream": true, "stream_options": {"include_usage": true}}',
        p.ChatRequest,
    )
    assert chat.include_usage and chat.stream and chat.messages[0].content[0].text == "a"
    assert not p.decode(b'{"model": "m", "prompt": ["a", "b"]}', p.CompletionRequest).include_usage


def encoded(value: msgspec.Struct) -> dict:
    return json.loads(msgspec.json.encode(value))


def test_completions_whole_and_streamed_read_back_as_the_clients_completion():
    whole = p.Completion("cmpl-1", 7, "m", [p.CompletionChoice(0, "hi", None, "length")], USAGE)
    chunk = p.Completion("cmpl-1", 7, "m", [p.CompletionChoice(0, "h", None, None)])
    assert openai.types.Completion.model_validate(encoded(whole)).usage.total_tokens == 7
    assert encoded(chunk) == {
        "object": "text_completion",
        "id": "cmpl-1",
        "created": 7,
        "model": "m",
        "choices": [{"index": 0, "text": "h", "logprobs": None, "finish_reason": None}],
    }  # fmt: skip  (no usage in a chunk but the last)


def test_chat_answers_read_back_as_the_clients_types():
    logprobs = p.ChoiceLogprobs([p.TokenLogprob("é", -0.5, list("é".encode()), [])])
    whole = p.ChatCompletion("c", 1, "m", [p.ChatChoice(0, p.ChatMessage("assistant", "é"), logprobs, "stop")], USAGE)
    read = openai.types.chat.ChatCompletion.model_validate(encoded(whole))
    assert read.choices[0].logprobs.content[0].bytes == list("é".encode()) and read.object == "chat.completion"
    first = p.ChatCompletionChunk("c", 1, "m", [p.ChatChunkChoice(0, p.Delta(role="assistant", content=""))])
    last = p.ChatCompletionChunk("c", 1, "m", [p.ChatChunkChoice(0, p.Delta(), None, "length")])
    for chunk in (first, last):
        openai.types.chat.ChatCompletionChunk.model_validate(encoded(chunk))
    assert encoded(last)["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}]
    assert "usage" not in encoded(first)


def test_the_model_list_and_errors_read_back_as_the_clients_types():
    listed = encoded(p.ModelList([p.ModelCard("m", 3, "trtllm-images")]))
    assert listed["object"] == "list" and openai.types.Model.model_validate(listed["data"][0]).id == "m"
    error = encoded(p.ApiError(404, "no such model", "model", "model_not_found").body())
    assert error == {"error": {"message": "no such model", "type": "not_found_error", "param": "model",
                               "code": "model_not_found"}}  # fmt: skip
