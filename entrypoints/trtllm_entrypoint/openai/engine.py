"""The engine workflow's OpenAI path, straight to the `tensorrt_llm` model: the front tokenizes the prompt, sends the
ids with the sampling inputs the model declares, and reads back `output_ids`, which detokenize.py turns into text.
No Python pre/postprocessing model sits on the way (docs/openai.md says why: measured).

What an OpenAI parameter is called among the model's inputs changed across releases (random_seed became seed,
min_length min_tokens): each row lists the names, the first one the model declares is used, and a parameter whose
names the model declares none of is refused where it is set. New inputs are new rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# OpenAI (or extension) parameter -> the tensorrt_llm model's input names for it, the first declared wins
# (sampling.py reads this table as the engine workflow's INPUT_NAMES; new inputs are new rows).
ENGINE_INPUTS: dict[str, tuple[str, ...]] = {
    "prompt": ("input_ids",),
    "max_tokens": ("request_output_len",),
    "stream": ("streaming",),
    "temperature": ("temperature",),
    "top_p": ("runtime_top_p",),
    "top_k": ("runtime_top_k",),
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "repetition_penalty": ("repetition_penalty",),
    "length_penalty": ("len_penalty",),
    "seed": ("random_seed", "seed"),
    "min_tokens": ("min_length", "min_tokens"),
    "logprobs": ("return_log_probs",),
    "lora_task_id": ("lora_task_id",),  # a LoRA adapter's task id, where lora_prefetch_dir loads the adapters
}
# Always sent where declared: the generated ids only (a stream never repeats the prompt; a whole answer would).
FIXED_ENGINE_INPUTS: dict[str, object] = {"exclude_input_in_output": True}
IDS_OUTPUT = "output_ids"
LOGPROBS_OUTPUT = "output_log_probs"


def input_name(declared: frozenset[str], param: str) -> str | None:
    """The model's input for `param`, or None when it declares none of its names."""
    return next((name for name in ENGINE_INPUTS.get(param, ()) if name in declared), None)


def ids_body(
    declared: frozenset[str], body: dict[str, object], prompt_ids: Sequence[int], *, end_id: int, pad_id: int
) -> dict[str, object]:
    """`body` (sampling.backend_body's, whose prompt is the ids' place) with the prompt's ids, their length, and the
    end and pad ids the preprocessing model would send (where declared)."""
    out = {**body, "input_ids": list(prompt_ids), "input_lengths": len(prompt_ids)}
    for name, value in (("end_id", end_id), ("pad_id", pad_id)):
        if name in declared:
            out[name] = value
    return out


def _flat(value: object) -> list[Any]:
    if isinstance(value, list):
        return [x for item in value for x in _flat(item)]
    return [] if value is None else [value]


def output_ids(event: Mapping[str, object]) -> list[int]:
    """The ids one streamed response carries: the generate endpoint writes a one-element tensor as a number and a
    longer one (several tokens in a step) as a list."""
    value = event.get(IDS_OUTPUT)
    if type(value) is int:  # one token a step: the usual case, per token
        return [value]
    return [int(i) for i in _flat(value)]


def output_logprobs(event: Mapping[str, object]) -> list[float]:
    return [float(x) for x in _flat(event.get(LOGPROBS_OUTPUT))]
