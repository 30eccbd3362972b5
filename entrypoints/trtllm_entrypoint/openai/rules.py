"""OpenAI's request rules that depend on the served model, as pure functions: a value fits the model input's declared
type or is a 400 naming the field; seeds are mapped from OpenAI's range into the model's; choices sample
independently; the answer fits the context left after the prompt. Standard library only (the errors are the caller's:
each function raises `Refused`, which the front answers as OpenAI's 400).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping

# Triton's integer data types and the values each holds.
INT_RANGES: Mapping[str, tuple[int, int]] = {
    "TYPE_INT8": (-(1 << 7), (1 << 7) - 1),
    "TYPE_INT16": (-(1 << 15), (1 << 15) - 1),
    "TYPE_INT32": (-(1 << 31), (1 << 31) - 1),
    "TYPE_INT64": (-(1 << 63), (1 << 63) - 1),
    "TYPE_UINT8": (0, (1 << 8) - 1),
    "TYPE_UINT16": (0, (1 << 16) - 1),
    "TYPE_UINT32": (0, (1 << 32) - 1),
    "TYPE_UINT64": (0, (1 << 64) - 1),
}
# The largest finite value of each floating type.
FLOAT_MAX: Mapping[str, float] = {
    "TYPE_FP16": 65504.0,
    "TYPE_BF16": 3.3895313892515355e38,
    "TYPE_FP32": 3.4028234663852886e38,
    "TYPE_FP64": 1.7976931348623157e308,
}
# OpenAI's `seed` is a signed 64-bit integer (its API reference's bounds).
SEED_RANGE = INT_RANGES["TYPE_INT64"]


class Refused(ValueError):
    """A request value the model cannot take: (message, the request's field)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message, self.field = message, field


def fit(field: str, value: object, dtype: str, input_name: str) -> object:
    """`value` if the model's input `input_name` (of Triton type `dtype`) holds it, else Refused naming `field`."""
    where = f"the model's input {input_name} ({dtype})"
    if dtype == "TYPE_BOOL":
        if not isinstance(value, bool):
            raise Refused(f"{field} must be true or false for {where}", field)
    elif dtype in INT_RANGES:
        low, high = INT_RANGES[dtype]
        if isinstance(value, bool) or not isinstance(value, int):
            raise Refused(f"{field} must be an integer for {where}", field)
        if not low <= value <= high:
            raise Refused(f"{field} is {value}; {where} holds {low} to {high}", field)
    elif dtype in FLOAT_MAX:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Refused(f"{field} must be a number for {where}", field)
        if not math.isfinite(float(value)) or abs(float(value)) > FLOAT_MAX[dtype]:
            raise Refused(f"{field} is {value}; {where} holds at most {FLOAT_MAX[dtype]:g} in size", field)
    elif dtype in ("TYPE_STRING", "TYPE_BYTES") and not isinstance(value, str):
        raise Refused(f"{field} must be a string for {where}", field)
    return value


def check_seed(seed: int) -> int:
    low, high = SEED_RANGE
    if not low <= seed <= high:
        raise Refused(f"seed is {seed}; OpenAI's seed is a 64-bit signed integer ({low} to {high})", "seed")
    return seed


def seed_for(seed: int | None, choice: int, dtype: str) -> int:
    """The model's seed for choice `choice` of a request: `seed + choice` wrapped into the input's range (two's
    complement: for UINT64, -1 is 2**64 - 1), so choices differ and a given seed repeats its answer. Without a seed, a
    fresh random one per choice: TensorRT-LLM's own default seed is fixed, which would make every choice (and every
    request) the same sample."""
    low, high = INT_RANGES.get(dtype, INT_RANGES["TYPE_UINT64"])
    span = high - low + 1
    if seed is None:
        return low + secrets.randbelow(span)
    return (check_seed(seed) + choice - low) % span + low


def check_room(
    prompt_tokens: int,
    max_tokens: int | None,
    max_seq_len: int,
    field: str = "max_tokens",
    prompt_field: str = "prompt",
) -> int:
    """The answer's length: `max_tokens`, or all the room left when None. Refused when the prompt leaves no room or
    `max_tokens` is more than the room left (both numbers named)."""
    room = max_seq_len - prompt_tokens
    if room <= 0:
        raise Refused(
            f"the prompt has {prompt_tokens} tokens and the model's context is {max_seq_len}: no room is left for an "
            "answer",
            prompt_field,
        )
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise Refused(
            f"{field} is {max_tokens}, but only {room} tokens are left of the model's context of {max_seq_len} after "
            f"the prompt's {prompt_tokens}",
            field,
        )
    return max_tokens
