"""FrontPlan: everything one worker of the OpenAI front needs, decided by the entrypoint with the rest of the launch
plan and handed to every worker as one JSON value in its environment (contract.FRONT_PLAN_VARIABLE). Standard library
only: the entrypoint imports it, the front's processes read it back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FrontPlan:
    host: str  # the address the workers bind
    port: int  # OPENAI_PORT, shared by the workers through SO_REUSEPORT
    workers: int  # OPENAI_WORKERS
    triton_url: str  # tritonserver's own HTTP endpoint on this host
    served_name: str  # the name clients send as `model`
    entry_model: str  # the Triton model the front asks: the engine workflow's tensorrt_llm, the llmapi model
    workflow: str  # engine | llmapi
    config: str  # the entry model's config.pbtxt in the filled repository (its declared inputs)
    tokenizer: str  # the model's tokenizer directory
    add_special_tokens: bool  # as the preprocessing model encodes prompts (the engine workflow's ids)
    skip_special_tokens: bool  # as the postprocessing model decodes answers
    restricted: tuple[str, ...]  # the RESTRICTED_APIS groups that close the front's routes
    max_seq_len: int  # prompt plus answer, in tokens
    shutdown_timeout: float  # EXIT_TIMEOUT_SECS: how long the workers let streams finish on SIGTERM
    max_generations: int  # OPENAI_MAX_GENERATIONS: prompts x n of one request, at most
    log_format: str = "text"  # LOG_FORMAT: the workers' own lines (the drain's) as the entrypoint writes its lines
    adapters: Mapping[str, int] = field(default_factory=dict)  # LORA_DIR's adapters: name -> the backend's task id
    tool_parser: str = "auto"  # TOOL_CALL_PARSER: `auto` (the family the chat template shows) or a family's name
    guided_off: str = ""  # why the served model takes no guided decoding guide, said in a 400; "" when it does

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FrontPlan:
        data: Mapping[str, Any] = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        if set(data) != names:
            raise ValueError(
                f"front plan fields differ: missing {sorted(names - set(data))}, unknown {sorted(set(data) - names)}"
            )
        return cls(**{**data, "restricted": tuple(data["restricted"]), "adapters": dict(data["adapters"])})
