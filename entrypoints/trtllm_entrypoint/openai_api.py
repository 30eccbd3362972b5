"""The OpenAI API of our own front, as pure functions: request schemas, their translation into the served model's
declared inputs, the answers (whole or as stream chunks) and OpenAI's error shape. Nothing here does I/O;
openai_front.py serves it.

The front runs in its own processes (not the entrypoint's), with msgspec and jinja2 on its path (vendor.lock.json).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec

from trtllm_entrypoint import pbtxt

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1, le=16)]
Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)]
Probability = Annotated[float, msgspec.Meta(gt=0, le=1)]
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]
Stop = str | list[str] | None
DEFAULT_MAX_TOKENS = 16  # OpenAI's own default for completions (chat's is the rest of the context: room_left)
MAX_STOPS = 4  # as OpenAI


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class _Sampling(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: NonNegative | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    top_k: NonNegative | None = None  # not OpenAI's, as vLLM takes it
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None
    n: Positive = 1
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[str]
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=5)] | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    logit_bias: dict[str, float] | None = None


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatRequest(_Sampling, kw_only=True):
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    max_completion_tokens: NonNegative | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None


class ApiError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def type(self) -> str:
        if self.status == 401:
            return "authentication_error"
        if self.status == 404:
            return "not_found_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def decode(raw: bytes, kind: type[CompletionRequest] | type[ChatRequest]) -> Any:
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        # "Expected `int`, got `str` - at `$.max_tokens`": the field is the param
        text = str(exc)
        param = text.rsplit("`$.", 1)[1].rstrip("`").split("[")[0] if "`$." in text else None
        raise ApiError(400, text, param) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from None


# --- the served model's inputs ------------------------------------------------------------------------------------

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


def sampling(
    request: CompletionRequest | ChatRequest, model: Model, max_tokens: int | None, logprobs: bool
) -> Sampling:
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


def _refuse_unsupported(checks: Iterable[tuple[bool, str, str]]) -> None:
    """(whether it was asked for, what is not supported, the param) for each thing the front does not do."""
    for asked, message, param in checks:
        if asked:
            raise ApiError(400, f"{message} is not supported (see docs/openai.md)", param)


def check_completion(request: CompletionRequest) -> None:
    _refuse_unsupported(
        [
            (request.best_of not in (None, 1, request.n), "best_of other than n", "best_of"),
            (bool(request.suffix), "suffix", "suffix"),
            (bool(request.logit_bias), "logit_bias", "logit_bias"),
            (bool(request.logprobs), "completions' logprobs (top alternatives; chat's logprobs serve)", "logprobs"),
        ]
    )


def check_chat(request: ChatRequest) -> None:
    text_only = not request.response_format or request.response_format.get("type", "text") == "text"
    _refuse_unsupported(
        [
            (bool(request.tools), "tools", "tools"),
            (not text_only, "response_format other than text", "response_format"),
            (bool(request.logit_bias), "logit_bias", "logit_bias"),
            (bool(request.top_logprobs), "top_logprobs > 0 (the backend returns the chosen token's)", "top_logprobs"),
        ]
    )


def prompts_of(request: CompletionRequest) -> list[str]:
    prompts = [request.prompt] if isinstance(request.prompt, str) else list(request.prompt)
    if not prompts:
        raise ApiError(400, "prompt is empty", "prompt")
    return prompts


def messages_of(request: ChatRequest) -> list[dict[str, object]]:
    """The messages as chat templates read them: content parts joined into one text."""
    out = []
    for message in request.messages:
        content = message.content
        if isinstance(content, list):
            if any(part.type != "text" for part in content):
                raise ApiError(400, "only text content parts are supported", "messages")
            content = "".join(part.text or "" for part in content)
        item: dict[str, object] = {"role": message.role, "content": content or ""}
        if message.name:
            item["name"] = message.name
        out.append(item)
    return out


# --- stop sequences -----------------------------------------------------------------------------------------------


class StopScanner:
    """Finds the first stop sequence in streamed text, holding back only a tail that could start one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.held = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text that may be shown now, whether a stop sequence ended the text)."""
        if not self.stops:
            return piece, False
        text = self.held + piece
        hits = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return text[: min(hits)], True
        keep = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), keep, -1):
                if text.endswith(stop[:size]):
                    keep = size
                    break
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


# --- answers ------------------------------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def finish_reason(stopped: bool, tokens: int, max_tokens: int) -> str:
    return "length" if not stopped and tokens >= max_tokens else "stop"


def chat_logprobs(pieces: Iterable[tuple[str, float]]) -> dict[str, object]:
    return {
        "content": [
            {"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []} for text, lp in pieces
        ]
    }


def models_list(model: Model) -> dict[str, object]:
    return {"object": "list", "data": [model_card(model)]}


def model_card(model: Model) -> dict[str, object]:
    return {"id": model.name, "object": "model", "created": model.created, "owned_by": "trtllm-images"}


# --- chat templates -----------------------------------------------------------------------------------------------


class ChatTemplate:
    """The tokenizer's chat template (tokenizer_config.json's `chat_template`, or chat_template.jinja beside it),
    rendered by jinja2's sandbox with the variables Hugging Face templates read."""

    def __init__(self, source: str | None, special_tokens: Mapping[str, str]) -> None:
        from trtllm_entrypoint.openai import sandbox  # noqa: PLC0415  (the vendored jinja2, >= 3.1.6)

        jinja2 = sandbox.jinja2()

        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        env = sandbox.environment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda value, indent=None: msgspec.json.format(
            msgspec.json.encode(value), indent=indent or 0
        ).decode()
        self.template = env.from_string(source) if source else None
        self.special_tokens = dict(special_tokens)

    def render(self, messages: list[dict[str, object]], add_generation_prompt: bool = True) -> str:
        if self.template is None:
            raise ApiError(
                400,
                "this model's tokenizer has no chat_template: use /v1/completions, or serve a model with one",
                "messages",
            )
        import jinja2  # noqa: PLC0415

        try:
            rendered: str = self.template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, tools=None, **self.special_tokens
            )
            return rendered
        except jinja2.TemplateError as exc:
            raise ApiError(400, f"the chat template refused the messages: {exc}", "messages") from None


def template_source(config: Mapping[str, Any], beside: str | None) -> str | None:
    """tokenizer_config.json's chat_template (a string, or a list of named ones: `default`), else the file's."""
    found = config.get("chat_template")
    if isinstance(found, list):
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("default")
    return found if isinstance(found, str) else beside


def special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """bos_token, eos_token … as strings (tokenizer_config.json writes them as strings or AddedToken dicts)."""
    out = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out
