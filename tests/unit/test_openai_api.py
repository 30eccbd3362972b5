"""The OpenAI front's pure half (openai_api.py): requests read as OpenAI defines them, and translated into only the
inputs the served model's upstream config.pbtxt declares."""

from __future__ import annotations

import json
import re

import pytest

from harness.image import templates_for

api = pytest.importorskip("trtllm_entrypoint.openai_api")


def model(templates: str, workflow: str) -> api.Model:
    folder = "llmapi/tensorrt_llm" if workflow == "llmapi" else "inflight_batcher_llm/ensemble"
    path = templates_for(templates) / folder / "config.pbtxt"
    if not path.is_file():  # a set that keeps its models beside all_models' workflow folders
        path = templates_for(templates) / "ensemble" / "config.pbtxt"
    filled = re.sub(r"\$\{\w+\}", "1", path.read_text())  # the template's parameters do not name inputs
    return api.Model.from_config("served", workflow, filled, str(path))


def request(kind, **body):
    base = {"model": "served", **({"prompt": "hi"} if kind is api.CompletionRequest else {})}
    return api.decode(json.dumps({**base, **body}).encode(), kind)


@pytest.mark.parametrize("templates", ["v0.7.0", "v0.17.0", "triton_backend"])
def test_the_ensemble_gets_its_own_names_and_only_declared_inputs(templates):
    served = model(templates, "engine")
    req = request(api.CompletionRequest, max_tokens=5, seed=3, temperature=0.5, top_p=0.9)
    if "random_seed" not in served.inputs:  # v0.7.0's ensemble has no seed: refused, never dropped silently
        with pytest.raises(api.ApiError, match="seed is not supported"):
            api.sampling(req, served, req.max_tokens, False)
        req = request(api.CompletionRequest, max_tokens=5, temperature=0.5, top_p=0.9)
    body = api.backend_body(served, "hi", api.sampling(req, served, req.max_tokens, False), choice=1)
    assert body["text_input"] == "hi" and body["max_tokens"] == 5 and body["stream"] is True
    assert body.get("random_seed", 4) == 4  # the choice's own seed
    assert body["stop_words"] == ""  # older ensembles need the list, empty when no stop is asked for
    stopping = api.sampling(request(api.CompletionRequest, stop="END"), served, None, False)
    assert api.backend_body(served, "hi", stopping, choice=0)["stop_words"] == ["END"]
    assert set(body) <= served.inputs


def test_the_llmapi_model_gets_its_sampling_param_names():
    served = model("triton_backend", "llmapi")
    messages = [{"role": "user", "content": "x"}]
    req = request(api.ChatRequest, messages=messages, max_completion_tokens=7, seed=1, stop=["\n", "END"])
    req_sampling = api.sampling(req, served, req.max_completion_tokens, False)
    body = api.backend_body(served, "prompt", req_sampling, choice=0)
    assert body == {
        "text_input": "prompt",
        "sampling_param_max_tokens": 7,
        "streaming": True,
        "sampling_param_exclude_input_from_output": True,
        "sampling_param_seed": 1,
        "sampling_param_stop": ["\n", "END"],  # the backend stops there too
    }
    assert set(body) <= served.inputs


def test_temperature_zero_is_greedy_and_an_undeclared_parameter_is_refused():
    served = model("triton_backend", "llmapi")
    greedy = api.sampling(request(api.CompletionRequest, temperature=0), served, None, False)
    assert dict(greedy.values) == {"top_k": 1} and greedy.max_tokens == api.DEFAULT_MAX_TOKENS
    narrow = api.Model("served", "engine", frozenset({"text_input", "max_tokens", "stream"}), frozenset())
    with pytest.raises(api.ApiError) as refused:
        api.sampling(request(api.CompletionRequest, presence_penalty=1.0), narrow, None, False)
    assert (refused.value.status, refused.value.param) == (400, "presence_penalty")
    with pytest.raises(api.ApiError, match="logprobs"):
        api.sampling(request(api.ChatRequest, messages=[{"role": "user", "content": "x"}]), served, None, True)


@pytest.mark.parametrize(
    "body,param",
    [({"max_tokens": -1}, "max_tokens"), ({"n": 0}, "n"), ({"temperature": "hot"}, "temperature"), ({}, None)],
)
def test_bad_requests_name_the_field_in_openais_error_shape(body, param):
    raw = json.dumps({"model": "served", **({"prompt": "x"} if body else {}), **body}).encode()
    with pytest.raises(api.ApiError) as bad:
        api.decode(raw, api.CompletionRequest)
    error = bad.value.body()["error"]
    assert bad.value.status == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == (param or error["param"]) and set(error) == {"message", "type", "param", "code"}


def test_stops_are_found_across_pieces_and_a_possible_start_is_held_back():
    scanner = api.StopScanner(["END", "\n\n"])
    assert scanner.feed("hello E") == ("hello ", False)  # "E" may start END
    assert scanner.feed("Nx") == ("ENx", False)  # it did not
    assert scanner.feed(" and\n") == (" and", False)
    assert scanner.feed("\nrest") == ("", True)
    plain = api.StopScanner([])
    assert plain.feed("E") == ("E", False) and plain.flush() == ""
    tail = api.StopScanner(["STOP"])
    assert tail.feed("abcST") == ("abc", False) and tail.flush() == "ST"
    with pytest.raises(api.ApiError, match="at most 4"):
        api.sampling(request(api.CompletionRequest, stop=list("abcde")), model("v0.17.0", "engine"), None, False)


def test_a_chat_answer_without_a_limit_gets_the_rest_of_the_context():
    assert api.room_left(6, 256) == 250
    with pytest.raises(api.ApiError, match="the prompt has 256 tokens and the model takes 256") as full:
        api.room_left(256, 256)
    assert full.value.param == "messages"


def test_finish_reason_and_usage():
    assert api.finish_reason(False, 16, 16) == "length" and api.finish_reason(True, 16, 16) == "stop"
    assert api.finish_reason(False, 3, 16) == "stop"
    assert api.usage(5, 2) == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_chat_templates_as_hugging_face_writes_them():
    config = {
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
             "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"},
        ],
        "bos_token": {"content": "<s>", "lstrip": False},
    }  # fmt: skip
    template = api.ChatTemplate(api.template_source(config, None), api.special_tokens(config))
    messages = [{"role": "user", "content": "hi"}]
    assert template.render(messages) == "<s>[user]hi[assistant]"
    strict = api.ChatTemplate("{{ raise_exception('roles must alternate') }}", {})
    with pytest.raises(api.ApiError, match="roles must alternate"):
        strict.render(messages)
    with pytest.raises(api.ApiError, match="no chat_template"):
        api.ChatTemplate(api.template_source({}, None), {}).render(messages)
    assert api.template_source({}, "from the file") == "from the file"


def test_content_parts_are_joined_and_other_parts_refused():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    req = request(api.ChatRequest, messages=[{"role": "user", "content": parts}])
    assert api.messages_of(req) == [{"role": "user", "content": "ab"}]
    image = request(api.ChatRequest, messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(api.ApiError, match="only text"):
        api.messages_of(image)
