"""A request's sampling, translated into only the inputs the served model declares: what each workflow's entry model
calls a parameter (its config.pbtxt), which the model lacks (refused, never dropped), and the JSON body of one
streamed generate request per choice."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from trtllm_entrypoint.openai import engine, rules
from trtllm_entrypoint.openai.protocol import ApiError, SamplingRequest, Stop
from trtllm_entrypoint.repository import pbtxt

DEFAULT_MAX_TOKENS = 16  # OpenAI's own default for completions (chat's is the rest of the context)
MAX_STOPS = 4  # as OpenAI

# What each workflow's entry model calls a parameter (their config.pbtxt's input names), first declared wins: the
# ensemble of TensorRT-LLM >= 0.20 renamed random_seed to seed and min_length to min_tokens.
INPUT_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "engine": engine.ENGINE_INPUTS,  # the tensorrt_llm model, asked with token ids (engine.py)
    "llmapi": {
        "prompt": ("text_input",),
        "max_tokens": ("sampling_param_max_tokens",),
        "stream": ("streaming",),
        "temperature": ("sampling_param_temperature",),
        "top_p": ("sampling_param_top_p",),
        "top_k": ("sampling_param_top_k",),
        "presence_penalty": ("sampling_param_presence_penalty",),
        "frequency_penalty": ("sampling_param_frequency_penalty",),
        "seed": ("sampling_param_seed",),
        # no "stop": the LLM API matches a stop string as its token ids and trims them from a text whose first
        # tokens it has streamed already; the front cuts stops on the text and leaves the stream (stops.py)
        "min_tokens": ("sampling_param_min_tokens",),
        "repetition_penalty": ("sampling_param_repetition_penalty",),
        "length_penalty": ("sampling_param_length_penalty",),
        "ignore_eos": ("sampling_param_ignore_eos",),
    },
}
# The request's sampling fields, OpenAI's and the extensions (docs/openai.md): each sent where the model declares it,
# refused where it does not.
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "repetition_penalty",
    "length_penalty",
    "ignore_eos",
)
# Sent whenever declared: older ensembles need the word lists (empty: stops are the front's), and the llmapi model
# must not repeat the prompt.
FIXED_INPUTS: dict[str, dict[str, object]] = {
    "engine": engine.FIXED_ENGINE_INPUTS,
    "llmapi": {"sampling_param_exclude_input_from_output": True},
}
# The per-token log-probabilities, where the model returns them.
LOGPROB_OUTPUT = {"engine": engine.LOGPROBS_OUTPUT}


@dataclass(frozen=True)
class Model:
    """What the front serves: the name clients use and the entry model's declared inputs and outputs."""

    name: str
    workflow: Literal["engine", "llmapi"]
    inputs: frozenset[str]
    outputs: frozenset[str]
    created: int = field(default_factory=lambda: int(time.time()))
    types: Mapping[str, str] = field(default_factory=dict)  # input -> its declared data_type (TYPE_INT32, ...)

    @classmethod
    def from_config(cls, name: str, workflow: str, config_text: str, source: str) -> Model:
        config = pbtxt.parse(config_text, source)
        if workflow not in INPUT_NAMES:
            raise ValueError(f"unknown workflow {workflow!r}")
        return cls(
            name=name,
            workflow=workflow,  # type: ignore[arg-type]
            inputs=frozenset(pbtxt.names(config.get("input"))),
            outputs=frozenset(pbtxt.names(config.get("output"))),
            types={
                str(i["name"]): str(i.get("data_type", ""))
                for i in config.get("input") or []
                if isinstance(i, dict) and "name" in i
            },
        )

    def input_name(self, param: str) -> str | None:
        """The model's input for `param`, or None when it declares none."""
        return next((n for n in INPUT_NAMES[self.workflow].get(param, ()) if n in self.inputs), None)

    def required_input(self, param: str) -> str:
        """The input every entry model has (prompt, max_tokens, stream): its name even where not listed."""
        return self.input_name(param) or INPUT_NAMES[self.workflow][param][0]

    def fit(self, param: str, value: object, field: str | None = None) -> object:
        """`value` for `param`'s input, or a 400 naming `field` where it does not fit the input's declared type."""
        name = self.required_input(param)
        try:
            return rules.fit(field or param, value, self.types.get(name, ""), name)
        except rules.Refused as exc:
            raise ApiError(400, exc.message, exc.field) from None

    @property
    def logprob_output(self) -> str | None:
        name = LOGPROB_OUTPUT.get(self.workflow)
        return name if name in self.outputs and self.input_name("logprobs") else None


@dataclass(frozen=True)
class Sampling:
    """One request's generation, as the backend gets it (per choice, the seed may differ)."""

    max_tokens: int
    values: Mapping[str, object]  # param -> value, only the ones set
    stops: tuple[str, ...]
    logprobs: bool
    seed: int | None = None  # the request's (OpenAI's range); each choice's is derived in backend_body
    inputs: Mapping[str, object] = field(default_factory=dict)  # more declared inputs, by name (the guide)
    inputs_param: str | None = None  # the request's field that asked for them: what a backend refusal names

    def with_inputs(self, inputs: Mapping[str, object], param: str) -> Sampling:
        return replace(self, inputs={**self.inputs, **inputs}, inputs_param=param)


def _stops(stop: Stop) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"at most {MAX_STOPS} stop sequences, got {len(stops)}", "stop")
    return tuple(s for s in stops if s)


def sampling(
    request: SamplingRequest, model: Model, max_tokens: int | None, logprobs: bool, max_tokens_field: str = "max_tokens"
) -> Sampling:
    """The request's sampling parameters, refused (400) where the model declares no input for one that was set, or
    where a value does not fit the input's declared type."""
    values: dict[str, object] = {}
    for param in SAMPLING_FIELDS:
        value = getattr(request, param)
        if value is None:
            continue
        field_name = param
        if param == "temperature" and value == 0:  # greedy: the backends take top_k=1 rather than a zero temperature
            param, value = "top_k", 1
        if model.input_name(param) is None:
            raise ApiError(
                400, f"{field_name} is not supported by model {model.name} ({model.workflow} workflow)", field_name
            )
        values[param] = model.fit(param, value, field_name)
    if request.seed is not None:
        if model.input_name("seed") is None:
            raise ApiError(400, f"seed is not supported by model {model.name} ({model.workflow} workflow)", "seed")
        try:
            rules.check_seed(request.seed)
        except rules.Refused as exc:
            raise ApiError(400, exc.message, exc.field) from None
    if logprobs and model.logprob_output is None:
        raise ApiError(400, f"logprobs: model {model.name} ({model.workflow} workflow) returns none", "logprobs")
    limit = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    model.fit("max_tokens", limit, max_tokens_field)
    return Sampling(
        max_tokens=limit,
        values=values,
        stops=_stops(request.stop),
        logprobs=logprobs,
        seed=request.seed,
    )


def with_adapter(model: Model, s: Sampling, task_id: int | None) -> Sampling:
    """The sampling of a request that names a LoRA adapter: its task id goes to the model's `lora_task_id`."""
    if task_id is None:
        return s
    if model.input_name("lora_task_id") is None:  # the entrypoint serves adapters only where it is declared
        raise ApiError(400, f"model {model.name} ({model.workflow} workflow) takes no LoRA adapter", "model")
    return replace(s, values={**s.values, "lora_task_id": task_id})


def backend_body(model: Model, prompt: str, s: Sampling, choice: int) -> dict[str, object]:
    """The JSON body of one streamed generate request for the entry model, with only inputs it declares. Choice k
    gets the request's seed + k (mapped into the input's type: rules.seed_for), or a random seed of its own."""
    body: dict[str, object] = {
        model.required_input("prompt"): prompt,
        model.required_input("max_tokens"): s.max_tokens,
        model.required_input("stream"): True,
    }
    body.update({k: v for k, v in FIXED_INPUTS[model.workflow].items() if k in model.inputs})
    for param, value in s.values.items():
        body[model.required_input(param)] = value
    seed = model.input_name("seed")
    if seed is not None:
        body[seed] = rules.seed_for(s.seed, choice, model.types.get(seed, "TYPE_UINT64"))
    if s.logprobs:
        body[model.required_input("logprobs")] = True
    body.update(s.inputs)
    return body
