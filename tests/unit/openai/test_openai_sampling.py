"""A request's sampling translated into only the inputs the served model's upstream config.pbtxt declares
(openai/sampling.py), for both workflows' entry models."""

from __future__ import annotations

import json
import re

import pytest

from harness.image import templates_for

pytest.importorskip("msgspec")

from trtllm_entrypoint.openai import rules
from trtllm_entrypoint.openai import sampling as sp  # noqa: E402
from trtllm_entrypoint.openai.protocol import ApiError, ChatRequest, CompletionRequest, decode  # noqa: E402


def model(templates: str, workflow: str) -> sp.Model:
    # the engine workflow's front asks the tensorrt_llm model (token ids), llmapi its own tensorrt_llm model
    folder = "llmapi/tensorrt_llm" if workflow == "llmapi" else "inflight_batcher_llm/tensorrt_llm"
    path = templates_for(templates) / folder / "config.pbtxt"
    if not path.is_file():  # a set that keeps its models beside all_models' workflow folders
        path = templates_for(templates) / "tensorrt_llm" / "config.pbtxt"
    filled = re.sub(r"\$\{\w+\}", "1", path.read_text())  # the template's parameters do not name inputs
    return sp.Model.from_config("served", workflow, filled, str(path))


def request(kind, **body):
    base = {"model": "served", **({"prompt": "hi"} if kind is CompletionRequest else {})}
    return decode(json.dumps({**base, **body}).encode(), kind)


@pytest.mark.parametrize("templates", ["v0.7.0", "v0.17.0", "triton_backend"])
def test_the_ensemble_gets_its_own_names_and_only_declared_inputs(templates):
    served = model(templates, "engine")
    req = request(CompletionRequest, max_tokens=5, seed=3, temperature=0.5, top_p=0.9)
    seed = served.input_name("seed")  # random_seed; `seed` in TensorRT-LLM 0.20's templates
    assert seed == ("seed" if templates == "triton_backend" else "random_seed")
    body = sp.backend_body(served, "hi", sp.sampling(req, served, req.max_tokens, False), choice=1)
    # the tensorrt_llm model's names (the engine workflow sends it ids; serving puts them in input_ids)
    assert body["request_output_len"] == 5 and body["streaming"] is True and "text_input" not in body
    assert body[seed] == 4  # the choice's own seed: the request's + the choice's index
    assert set(body) <= served.inputs


def test_the_llmapi_model_gets_its_sampling_param_names():
    served = model("triton_backend", "llmapi")
    messages = [{"role": "user", "content": "x"}]
    req = request(ChatRequest, messages=messages, max_completion_tokens=7, seed=1, stop=["\n", "END"])
    body = sp.backend_body(served, "prompt", sp.sampling(req, served, req.max_completion_tokens, False), choice=0)
    assert body == {
        "text_input": "prompt",
        "sampling_param_max_tokens": 7,
        "streaming": True,
        "sampling_param_exclude_input_from_output": True,
        "sampling_param_seed": 1,
    }  # no sampling_param_stop: the front cuts stops on the text (test_openai_llmapi)
    assert set(body) <= served.inputs


def test_temperature_zero_is_greedy_and_an_undeclared_parameter_is_refused():
    served = model("triton_backend", "llmapi")
    greedy = sp.sampling(request(CompletionRequest, temperature=0), served, None, False)
    assert dict(greedy.values) == {"top_k": 1} and greedy.max_tokens == sp.DEFAULT_MAX_TOKENS
    narrow = sp.Model("served", "engine", frozenset({"text_input", "max_tokens", "stream"}), frozenset())
    with pytest.raises(ApiError) as refused:
        sp.sampling(request(CompletionRequest, presence_penalty=1.0), narrow, None, False)
    assert (refused.value.status, refused.value.param) == (400, "presence_penalty")
    with pytest.raises(ApiError, match="logprobs"):
        sp.sampling(request(ChatRequest, messages=[{"role": "user", "content": "x"}]), served, None, True)


def test_at_most_four_stop_sequences_and_empty_ones_are_dropped():
    served = model("v0.17.0", "engine")
    with pytest.raises(ApiError, match="at most 4"):
        sp.sampling(request(CompletionRequest, stop=list("abcde")), served, None, False)
    assert sp.sampling(request(CompletionRequest, stop=["", "x"]), served, None, False).stops == ("x",)


def test_an_answer_gets_the_rest_of_the_context_and_no_more():
    assert rules.check_room(6, None, 256) == 250
    with pytest.raises(rules.Refused, match="the prompt has 256 tokens and the model's context is 256") as full:
        rules.check_room(256, None, 256, prompt_field="messages")
    assert full.value.field == "messages"


@pytest.mark.parametrize("templates", ["v0.7.0", "v0.17.0", "triton_backend"])
def test_values_that_do_not_fit_the_declared_input_are_refused_naming_the_field(templates):
    served = model(templates, "engine")
    for field, value in (("max_tokens", 2**32 + 3), ("top_k", 2**31)):
        with pytest.raises(ApiError) as refused:
            sp.sampling(
                request(CompletionRequest, **{field: value}), served, 2**32 + 3 if field == "max_tokens" else 5, False
            )
        assert refused.value.status == 400 and refused.value.param == field and "TYPE_INT32" in refused.value.message


@pytest.mark.parametrize(
    "workflow,templates", [("engine", "v0.17.0"), ("engine", "triton_backend"), ("llmapi", "triton_backend")]
)
def test_seeds_map_into_the_models_type_and_choices_sample_independently(workflow, templates):
    served = model(templates, workflow)
    seed = served.input_name("seed")
    minus_one = sp.sampling(request(CompletionRequest, seed=-1), served, None, False)
    assert sp.backend_body(served, "x", minus_one, choice=0)[seed] == 2**64 - 1  # a 502 before
    unseeded = sp.sampling(request(CompletionRequest, n=3, temperature=0.7), served, None, False)
    seeds = {sp.backend_body(served, "x", unseeded, choice=k)[seed] for k in range(3)}
    assert len(seeds) == 3  # TensorRT-LLM's default seed is fixed: without these, three identical choices


@pytest.mark.parametrize("templates", ["v0.7.0", "v0.17.0", "triton_backend"])
def test_extensions_map_to_declared_inputs_and_are_refused_elsewhere(templates):
    served = model(templates, "engine")
    s = sp.sampling(request(CompletionRequest, min_tokens=2, repetition_penalty=1.1), served, None, False)
    body = sp.backend_body(served, "x", s, choice=0)
    assert body[served.input_name("min_tokens")] == 2 and body["repetition_penalty"] == 1.1
    with pytest.raises(ApiError) as refused:
        sp.sampling(request(CompletionRequest, ignore_eos=True), served, None, False)
    assert refused.value.param == "ignore_eos"
    llmapi = model("triton_backend", "llmapi")
    with pytest.raises(ApiError) as refused:
        sp.sampling(request(CompletionRequest, min_tokens=2), llmapi, None, False)
    assert refused.value.param == "min_tokens"


def test_an_unknown_workflow_is_refused():
    with pytest.raises(ValueError, match="unknown workflow 'other'"):
        sp.Model.from_config("served", "other", 'name: "x"', "config.pbtxt")
