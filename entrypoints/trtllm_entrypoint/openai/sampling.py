"""A request's sampling, translated into only the inputs the served model declares: what each workflow's entry model
calls a parameter (its config.pbtxt), which the model lacks (refused, never dropped), and the JSON body of one
streamed generate request per choice."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from trtllm_entrypoint.openai.protocol import ApiError, SamplingRequest, Stop
from trtllm_entrypoint.repository import pbtxt

DEFAULT_MAX_TOKENS = 16  # OpenAI's own default for completions (chat's is the rest of the context: room_left)
MAX_STOPS = 4  # as OpenAI

# What each workflow's entry model calls a sampling parameter (their config.pbtxt's input names).
INPUT_NAMES: dict[str, dict[str, str]] = {
    "engine": {
        "prompt": "text_input",
        "max_tokens": "max_tokens",
        "stream": "stream",
        "temperature": "temperature",
        "top_p": "top_p",
        "top_k": "top_k",
        "presence_penalty": "presence_penalty",
        "frequency_penalty": "frequency_penalty",
        "seed": "random_seed",
        "logprobs": "return_log_probs",
        "stop": "stop_words",
        "lora_task_id": "lora_task_id",  # ensemble and BLS from v0.15.0; served only where lora_prefetch_dir loads it
    },
    "llmapi": {
        "prompt": "text_input",
        "max_tokens": "sampling_param_max_tokens",
        "stream": "streaming",
        "temperature": "sampling_param_temperature",
        "top_p": "sampling_param_top_p",
        "top_k": "sampling_param_top_k",
        "presence_penalty": "sampling_param_presence_penalty",
        "frequency_penalty": "sampling_param_frequency_penalty",
        "seed": "sampling_param_seed",
        "stop": "sampling_param_stop",
    },
}
# Sent whenever declared: older ensembles need the word lists (empty: stops are the front's), and the llmapi model
# must not repeat the prompt.
FIXED_INPUTS: dict[str, dict[str, object]] = {
    "engine": {"bad_words": "", "stop_words": ""},
    "llmapi": {"sampling_param_exclude_input_from_output": True},
}
# The per-token log-probabilities, where the model returns them.
LOGPROB_OUTPUT = {"engine": "output_log_probs"}


@dataclass(frozen=True)
class Model:
    """What the front serves: the name clients use and the entry model's declared inputs and outputs."""

    name: str
    workflow: Literal["engine", "llmapi"]
    inputs: frozenset[str]
    outputs: frozenset[str]
    created: int = field(default_factory=lambda: int(time.time()))

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
        )

    def input_name(self, param: str) -> str | None:
        name = INPUT_NAMES[self.workflow].get(param)
        return name if name in self.inputs else None

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


def room_left(prompt_tokens: int, max_seq_len: int) -> int:
    """What a chat answer may take when the request sets no limit: the rest of the model's context."""
    if prompt_tokens >= max_seq_len:
        raise ApiError(
            400, f"the prompt has {prompt_tokens} tokens and the model takes {max_seq_len} in all", "messages"
        )
    return max_seq_len - prompt_tokens


def _stops(stop: Stop) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"at most {MAX_STOPS} stop sequences, got {len(stops)}", "stop")
    return tuple(s for s in stops if s)


def sampling(request: SamplingRequest, model: Model, max_tokens: int | None, logprobs: bool) -> Sampling:
    """The request's sampling parameters, refused (400) where the model declares no input for one that was set."""
    values: dict[str, object] = {}
    for param in ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty", "seed"):
        value = getattr(request, param)
        if value is None:
            continue
        if param == "temperature" and value == 0:  # greedy: the backends take top_k=1 rather than a zero temperature
            param, value = "top_k", 1
        if model.input_name(param) is None:
            raise ApiError(400, f"{param} is not supported by model {model.name} ({model.workflow} workflow)", param)
        values[param] = value
    if logprobs and model.logprob_output is None:
        raise ApiError(400, f"logprobs: model {model.name} ({model.workflow} workflow) returns none", "logprobs")
    return Sampling(
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        values=values,
        stops=_stops(request.stop),
        logprobs=logprobs,
    )


def with_adapter(model: Model, s: Sampling, task_id: int | None) -> Sampling:
    """The sampling of a request that names a LoRA adapter: its task id goes to the model's `lora_task_id`."""
    if task_id is None:
        return s
    if model.input_name("lora_task_id") is None:  # the entrypoint serves adapters only where it is declared
        raise ApiError(400, f"model {model.name} ({model.workflow} workflow) takes no LoRA adapter", "model")
    return replace(s, values={**s.values, "lora_task_id": task_id})


def backend_body(model: Model, prompt: str, s: Sampling, choice: int) -> dict[str, object]:
    """The JSON body of one streamed generate request for the entry model, with only inputs it declares."""
    names = INPUT_NAMES[model.workflow]
    body: dict[str, object] = {names["prompt"]: prompt, names["max_tokens"]: s.max_tokens, names["stream"]: True}
    body.update({k: v for k, v in FIXED_INPUTS[model.workflow].items() if k in model.inputs})
    for param, value in s.values.items():
        body[names[param]] = value + choice if param == "seed" else value  # type: ignore[operator]
    if s.logprobs:
        body[names["logprobs"]] = True
    stop = model.input_name("stop")
    if s.stops and stop:  # the backend stops generating there too; the front still cuts the text exactly
        body[stop] = list(s.stops)
    return body
