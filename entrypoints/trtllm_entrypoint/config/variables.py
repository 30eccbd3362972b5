"""Every environment variable the image reads: name, type, default, allowed values and help, in one table.

`settings.py` parses by it, `build.py kserve` checks its options against it, and docs/environment.md's tables are
generated from it (`python -m trtllm_entrypoint.config.variables`; tests/unit/test_docs.py fails on drift). Standard
library only and importing nothing of ours but the contract, so the host may import it.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from trtllm_entrypoint import contract

Workflow = Literal["engine", "llmapi"]
Frontend = Literal["triton", "openai"]
LogFormat = Literal["text", "json"]
LogLevel = Literal["info", "debug"]
Dtype = Literal["auto", "float16", "bfloat16", "float32"]
Quantization = Literal["none", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "nvfp4"]
WORKFLOWS: tuple[Workflow, ...] = get_args(Workflow)

# How a value is read. `integer` with `choices` takes only those numbers; `list` is comma-separated `choices`, or
# `none` for the empty list; `special` variables are parsed by their own code in settings.py (or by image_facts.py, or
# by another program) and are here for their documentation.
Kind = Literal["text", "path", "integer", "fraction", "boolean", "choice", "list", "special"]

TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")
MAX_TOKENS = 1 << 20  # 1M tokens: above any context length TensorRT-LLM serves today
MAX_INSTANCES = 256  # Python model instances: one process each
POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64)
# Triton's API names (src/restricted_features.h, unchanged from 2.40 to 2.71) except `health`: the image's
# HEALTHCHECK and Kubernetes probes call it without headers.
APIS = ("metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics", "trace", "logging")
OPEN_APIS = "none"  # RESTRICTED_APIS=none: nothing restricted
ADMIN_KEY_LENGTH = (16, 4096)
SECRET_FILE_LIMIT = 64 * 1024  # tokens and keys are far smaller; anything bigger is the wrong file

Default = str | int | float | bool | tuple[str, ...] | None


@dataclass(frozen=True)
class Variable:
    name: str
    section: str  # the docs/environment.md heading it is listed under
    kind: Kind
    help: str
    default: Default = None  # what unset means to the parser; None: unset, or derived (see shown_default)
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] | tuple[int, ...] = ()
    shown_default: str = ""  # the table's words when the default is derived rather than `default`
    shown_allowed: str = ""  # the table's words for what is allowed, when the kind's own words do not say it
    also: str = ""  # a rule with other variables, appended to the allowed values

    @property
    def default_text(self) -> str:
        if self.shown_default:
            return self.shown_default
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return f"`{str(self.default).lower()}`"
        if isinstance(self.default, tuple):
            return f"`{','.join(self.default)}`"
        return f"`{self.default}`"

    @property
    def allowed_text(self) -> str:
        words = self.shown_allowed or self._kind_words()
        return f"{words}, {self.also}" if self.also else words

    def _kind_words(self) -> str:
        if self.kind == "integer" and self.choices:
            return "a power of two: " + ", ".join(map(str, self.choices))
        if self.kind == "integer":
            return f"{self.low} to {self.high}"
        if self.kind == "fraction":
            return "a number greater than 0 and at most 1"
        if self.kind == "boolean":
            pairs = ", ".join(f"`{t}`/`{f}`" for t, f in zip(TRUE_WORDS, FALSE_WORDS, strict=True))
            return f"{pairs} (any case)"
        if self.kind == "choice":
            return ", ".join(f"`{c}`" for c in self.choices)
        if self.kind == "list":
            names = ", ".join(f"`{c}`" for c in self.choices)
            return f"`{OPEN_APIS}`, or a comma-separated list of {names}"
        raise ValueError(f"{self.name}: a {self.kind} variable needs shown_allowed")


MODEL = "Model"
ENGINE = "Engine"
SERVER = "Server"
GPUS = "GPUs"
IMAGE = "Image identity (set by `build.py`; set them yourself only outside an image)"
SECTIONS = (MODEL, ENGINE, SERVER, GPUS, IMAGE)

TABLE: tuple[Variable, ...] = (
    Variable(
        "MODEL_ID",
        MODEL,
        "special",
        "The model. A path that exists wins over a hub id of the same spelling. A directory may hold a Hugging Face "
        "checkpoint (`config.json` with `architectures` or `model_type`), a prebuilt engine (`config.json` with "
        "`build_config` plus `rank*.engine`) or a complete Triton model repository (`<model>/config.pbtxt` with no "
        f"`${{…}}` left). `{contract.KSERVE_MODEL_DIR}` (KServe) is never written to. The engine cache identifies a "
        "local model by the SHA-256 of every file's bytes (see [Engine cache key]"
        "(cache.md)).",
        shown_default=f"unset: `{contract.KSERVE_MODEL_DIR}` if it exists",
        shown_allowed="a Hugging Face id `org/name`, or the path of an existing directory",
    ),
    Variable(
        "MODEL_REVISION",
        MODEL,
        "text",
        "Which revision of a hub model to fetch; the resolved commit is part of the engine cache key.",
        shown_default="`main`",
        shown_allowed="a branch, tag or commit of the hub repo",
    ),
    Variable(
        "HF_TOKEN",
        MODEL,
        "special",
        "For gated and private models. Never logged, never written to files.",
        shown_allowed="a Hugging Face access token",
    ),
    Variable(
        "HUGGING_FACE_HUB_TOKEN",
        MODEL,
        "special",
        "Older name of `HF_TOKEN`; used only when `HF_TOKEN` is unset.",
        shown_allowed="a token",
    ),
    Variable(
        "HF_TOKEN_FILE",
        MODEL,
        "special",
        "Reads the token from a file (a mounted secret). Setting it together with `HF_TOKEN` or "
        "`HUGGING_FACE_HUB_TOKEN` is an error.",
        shown_allowed=f"path of a readable, non-empty file of at most {SECRET_FILE_LIMIT // 1024} KiB holding an "
        "ASCII token",
    ),
    Variable(
        "HF_HUB_OFFLINE",
        MODEL,
        "special",
        "Huggingface_hub's own switch: serve a hub model from the cache under `CACHE_DIR/models/hub` without network.",
        shown_allowed="`1`",
    ),
    Variable(
        "HF_ENDPOINT",
        MODEL,
        "special",
        "Huggingface_hub's own: the hub (or a mirror) to download from. Credentials in it (`https://user:pass@host`) "
        "are masked in every log line.",
        shown_allowed="an `http://` or `https://` URL with a host",
    ),
    Variable(
        "MODEL_INIT_MODE",
        MODEL,
        "special",
        f"KServe's: the model container (modelcar) may put the model at `{contract.KSERVE_MODEL_DIR}` after the server "
        f"container starts. Only changes the error when `MODEL_ID` is unset and `{contract.KSERVE_MODEL_DIR}` is "
        "missing, which then says the modelcar has not put it there yet.",
        shown_allowed="`async`",
    ),
    Variable(
        "ENGINE_DIR",
        MODEL,
        "path",
        "Serve this engine instead of building one. The tokenizer files are looked for in it, then in `MODEL_ID` when "
        "that is a local checkpoint (the layout NVIDIA's examples use: engine and checkpoint apart). `MODEL_ID` is "
        "also the model to rebuild from if the engine was built by another TensorRT-LLM version. The parallelism and "
        "limits the engine was built with (`TP_SIZE`, `PP_SIZE`, `MAX_BATCH_SIZE`, `MAX_INPUT_LEN`, `MAX_SEQ_LEN`, "
        "`MAX_BEAM_WIDTH`, `MAX_NUM_TOKENS`) are served unless you set them; another parallelism, or a limit above "
        "the engine's, is refused before anything is written. Only with `WORKFLOW=engine`.",
        shown_allowed="a directory holding a prebuilt engine (`config.json` and one `rank<N>.engine` per rank)",
    ),
    Variable(
        "LORA_DIR",
        MODEL,
        "path",
        "LoRA adapters to serve beside the base model: Hugging Face PEFT adapters (`adapter_config.json` + "
        "`adapter_model.safetensors`), one per subdirectory, each served under its directory's name (`model` in "
        "OpenAI requests; `lora_task_id` on Triton's API). Checked against the base before any download, converted "
        "into the cache, and built into the engine's LoRA flags; see [LoRA adapters](lora.md). NIM: "
        "`NIM_PEFT_SOURCE`; vLLM: `--enable-lora --lora-modules name=path`.",
        shown_allowed="a directory, one adapter per subdirectory; only with `WORKFLOW=engine` on tags from 25.05 "
        "(TensorRT-LLM 0.19), refused elsewhere at start",
    ),
    Variable(
        "LORA_MAX_RANK",
        MODEL,
        "integer",
        "The largest adapter rank (`r`) `LORA_DIR` may hold; an adapter above it is refused at start. The engine is "
        "built for the largest rank the adapters have, not for this limit. vLLM: `--max-lora-rank` (default 16).",
        default=64,
        low=1,
        high=1024,
    ),
    Variable(
        "WORKFLOW",
        ENGINE,
        "special",
        "`engine`: build a TensorRT engine and serve the `inflight_batcher_llm` ensemble. `llmapi`: serve the "
        "checkpoint with the LLM API (no engine build).",
        choices=WORKFLOWS,
        shown_default="`llmapi` where the image's TensorRT-LLM deprecates engines (1.0 and later), else `engine`",
        shown_allowed="what the image supports: `engine` (all images), `llmapi` (from 25.05)",
    ),
    Variable(
        "TP_SIZE",
        ENGINE,
        "integer",
        "Tensor parallelism. Attention heads split evenly only by powers of two in practice.",
        default=1,
        low=1,
        high=POWERS_OF_TWO[-1],
        choices=POWERS_OF_TWO,
    ),
    Variable(
        "PP_SIZE",
        ENGINE,
        "integer",
        "Pipeline parallelism. `TP_SIZE` × `PP_SIZE` GPUs are needed.",
        default=1,
        low=1,
        high=64,
    ),
    Variable(
        "DTYPE",
        ENGINE,
        "choice",
        "Weight and activation type; `auto` takes the checkpoint's.",
        default="auto",
        choices=get_args(Dtype),
    ),
    Variable(
        "QUANTIZATION",
        ENGINE,
        "choice",
        "Quantize while building the engine. Must be `none` with `WORKFLOW=llmapi`, which serves the checkpoint as it "
        "is (use a pre-quantized checkpoint there).",
        default="none",
        choices=get_args(Quantization),
    ),
    Variable("MAX_BATCH_SIZE", ENGINE, "integer", "Most requests in flight at once.", default=64, low=1, high=4096),
    Variable("MAX_INPUT_LEN", ENGINE, "integer", "Longest prompt, in tokens.", default=2048, low=1, high=MAX_TOKENS),
    Variable(
        "MAX_SEQ_LEN",
        ENGINE,
        "integer",
        "Longest prompt plus generated tokens.",
        default=4096,
        low=2,
        high=MAX_TOKENS,
        also="greater than `MAX_INPUT_LEN`",
    ),
    Variable(
        "MAX_NUM_TOKENS",
        ENGINE,
        "integer",
        "Tokens scheduled per step. Without chunked context a whole prompt is scheduled in one step, so it must fit.",
        default=8192,
        low=1,
        high=MAX_TOKENS,
        also="at least `MAX_INPUT_LEN`",
    ),
    Variable(
        "MAX_BEAM_WIDTH", ENGINE, "integer", "Beam search width; 1 is greedy/sampling.", default=1, low=1, high=64
    ),
    Variable(
        "KV_CACHE_FREE_GPU_MEM_FRACTION",
        ENGINE,
        "fraction",
        "Share of the GPU memory left after loading the model that the KV cache takes.",
        default=0.9,
    ),
    Variable(
        "ENABLE_KV_CACHE_REUSE",
        ENGINE,
        "boolean",
        "Reuse KV cache blocks across requests with a common prefix.",
        default=False,
    ),
    Variable(
        "CACHE_DIR",
        ENGINE,
        "path",
        "Downloads (`models/`), engines (`engines/`) and generated repositories (`repositories/`). Mount a volume here "
        "to keep engines across restarts.",
        shown_default=f"`{contract.DEFAULT_CACHE_DIR}`; if that is not writable (read-only root file system) and "
        "`CACHE_DIR` is unset, `<tmp>/trtllm-cache-<uid>` with a warning",
        shown_allowed=f"a writable directory outside `{contract.KSERVE_MODEL_DIR}`, apart from the model, the engine "
        "and the templates (a model or engine under its `engines/` or `models/` is fine)",
    ),
    Variable(
        "LOCK_TIMEOUT_SECS",
        ENGINE,
        "integer",
        "How long a replica waits for another replica's engine build of the same key.",
        default=3600,
        low=0,
        high=86400,
    ),
    Variable(
        "DECOUPLED",
        SERVER,
        "boolean",
        "Streaming responses (Triton's decoupled mode).",
        default=False,
        shown_default="`false`; `true` with `FRONTEND=openai`, which streams (`false` is refused there)",
    ),
    Variable(
        "PREPROCESSING_INSTANCES",
        SERVER,
        "integer",
        "Instances of the `preprocessing` model (tokenizer), one process each. The CPUs are the cgroup quota "
        "(`--cpus`, `limits.cpu`) or the affinity mask (`--cpuset-cpus`), whichever is smaller, never the host's "
        "count. Measured: see `docs/benchmarks.md`.",
        low=1,
        high=MAX_INSTANCES,
        shown_default="one per two CPUs the container may use, at least 1, at most 8 (1 on 2 CPUs)",
    ),
    Variable(
        "POSTPROCESSING_INSTANCES",
        SERVER,
        "integer",
        "Instances of the `postprocessing` model (detokenizer; called once per token when streaming).",
        low=1,
        high=MAX_INSTANCES,
        shown_default="as `PREPROCESSING_INSTANCES`",
    ),
    Variable(
        "HTTP_PORT",
        SERVER,
        "integer",
        "Triton HTTP/REST port (KServe passes 8080 on the command line).",
        default=contract.DEFAULT_HTTP_PORT,
        low=1,
        high=65535,
    ),
    Variable(
        "GRPC_PORT", SERVER, "integer", "Triton gRPC port.", default=contract.DEFAULT_GRPC_PORT, low=1, high=65535
    ),
    Variable(
        "METRICS_PORT",
        SERVER,
        "integer",
        "Prometheus metrics port.",
        default=contract.DEFAULT_METRICS_PORT,
        low=1,
        high=65535,
    ),
    Variable(
        "OPENAI_PORT",
        SERVER,
        "integer",
        "OpenAI-compatible API port (with `FRONTEND=openai`). The four ports must be distinct.",
        default=contract.DEFAULT_OPENAI_PORT,
        low=1,
        high=65535,
    ),
    Variable(
        "FRONTEND",
        SERVER,
        "choice",
        "Which APIs to serve. `triton`: Triton's HTTP/gRPC. `openai`: the same, plus an OpenAI-compatible API "
        "(`/v1/models`, `/v1/completions`, `/v1/chat/completions`, streamed or not) on `OPENAI_PORT`, ready at "
        "`/health/ready` there once Triton is; see [The OpenAI-compatible API](openai.md).",
        default="triton",
        choices=get_args(Frontend),
        shown_allowed="`triton`, `openai` (every tag and workflow)",
    ),
    Variable(
        "OPENAI_WORKERS",
        SERVER,
        "integer",
        "Processes of the OpenAI front (with `FRONTEND=openai`), sharing `OPENAI_PORT`.",
        default=None,
        shown_default="one per 8 CPUs the container may use (at least 1, at most 8)",
        low=1,
        high=64,
    ),
    Variable(
        "OPENAI_MAX_GENERATIONS",
        SERVER,
        "integer",
        "Most generations one OpenAI request may run (with `FRONTEND=openai`): its prompts times `n`, each a stream "
        "to the model. A request asking for more is answered 400 before any starts.",
        default=256,
        low=1,
        high=65536,
    ),
    Variable(
        "SERVED_MODEL_NAME",
        SERVER,
        "special",
        "Name clients use for the model. With `FRONTEND=openai` it is the name OpenAI clients send as `model`; "
        "Triton's entry model takes it too where it is a Triton model name (not `org/name`).",
        shown_default="unset: the workflow's default name (`ensemble`, `tensorrt_llm`); with `FRONTEND=openai`, "
        "OpenAI clients use the model's own: `MODEL_ID` as given for a hub id, else the model directory's name",
        shown_allowed="up to 128 letters, digits, `.`, `_`, `-`, starting with a letter or digit; with "
        "`FRONTEND=openai` also a Hugging Face id (`org/name`)",
    ),
    Variable(
        "TOOL_CALL_PARSER",
        SERVER,
        "choice",
        "How the OpenAI front (`FRONTEND=openai`) reads tool calls out of the model's answers. `auto`: the format "
        "the chat template shows (its call markers), else config.json's `model_type`; or a family: `hermes` (Qwen "
        "2.5/3, Hermes, Granite 4), `llama3_json` (Llama 3.1-3.3), `mistral`, `granite` (Granite 3.x), "
        "`qwen3_coder`. A model with no known format, or whose template renders no tools, answers `tools` with a 400 "
        "naming this variable; see [Tools and structured output](openai.md#tools-and-structured-output).",
        default="auto",
        choices=contract.TOOL_CALL_PARSERS,
    ),
    Variable(
        "TEMPLATES_DIR",
        SERVER,
        "path",
        "Backend `config.pbtxt` templates to fill.",
        shown_default="the image's `all_models/` (under `TRTLLM_APP_DIR`)",
        shown_allowed="an existing directory: the backend's `all_models/`, or its `inflight_batcher_llm/` (or "
        "`llmapi/`) folder",
    ),
    Variable(
        "REPOSITORY_DIR",
        SERVER,
        "path",
        "Where the filled Triton model repository is written. The default is named by its content, so a restart with "
        "the same settings reuses it. A directory you name is rewritten when the settings change, never when it holds "
        "anything the entrypoint did not write: every file or folder its marker `.trtllm-stamp.json` does not list "
        "(the server's `__pycache__/*.pyc` apart) is yours, and the start is refused with exit 2 naming it, nothing "
        "deleted. Replicas may share it with the same settings; one with other settings stops with an error while "
        "another serves it.",
        shown_default="`CACHE_DIR/repositories/<digest of templates and values>`",
        shown_allowed="an absent or empty directory (not itself a mount point), or one the entrypoint wrote before; "
        f"apart from `CACHE_DIR`, the model, the engine and the templates; outside `{contract.KSERVE_MODEL_DIR}`",
    ),
    Variable(
        "ENABLE_BLS",
        SERVER,
        "boolean",
        "Also load the backend's BLS model (`tensorrt_llm_bls`). Off by default: it imports torch (slower start), and "
        "when it fails to load Triton starts no model at all.",
        default=False,
    ),
    Variable(
        "TRITON_ARGS",
        SERVER,
        "special",
        "Appended to the server command line: `tritonserver`'s (rank 0 with several GPUs), e.g. `--log-verbose=1`.",
        shown_default="empty",
        shown_allowed="arguments in shell quoting, except those the entrypoint sets: the repository "
        "(`--model-repository`, `--model-store`), the ports (`--http-port`, `--grpc-port`, `--metrics-port`), "
        "the shared-memory prefix (`--backend-config=python,shm-region-prefix-name=…`) "
        "and the API restriction (`--http-restricted-api`, `--grpc-restricted-protocol`); "
        "use `REPOSITORY_DIR`, the `*_PORT` variables and `RESTRICTED_APIS` instead",
    ),
    Variable(
        "RESTRICTED_APIS",
        SERVER,
        "list",
        "Triton APIs that answer only requests carrying the admin key (see [Security](security.md)). `none` opens "
        "every API, with a warning at start. `health` cannot be closed: probes need it. Closing `inference`, "
        "`metadata` or `model-config` needs a key.",
        # What no inference client needs: memory regions, loading code, per-model numbers, traces and verbose logs.
        default=("shared-memory", "model-repository", "statistics", "trace", "logging"),
        choices=APIS,
    ),
    Variable(
        "TRITON_ADMIN_KEY",
        SERVER,
        "special",
        "The value of the `admin-key` header (HTTP) / `triton-grpc-protocol-admin-key` metadata (gRPC) that opens the "
        "restricted APIs. Never logged.",
        low=ADMIN_KEY_LENGTH[0],
        high=ADMIN_KEY_LENGTH[1],
        shown_default="unset: a random key per start that nobody knows, so the restricted APIs are unreachable",
        shown_allowed=f'{ADMIN_KEY_LENGTH[0]} to {ADMIN_KEY_LENGTH[1]} visible ASCII characters, no space, `"` or `\\`',
    ),
    Variable(
        "TRITON_ADMIN_KEY_FILE",
        SERVER,
        "special",
        "Reads the key from a file (a mounted secret). Setting it together with `TRITON_ADMIN_KEY` is an error.",
        shown_allowed=f"path of a readable, non-empty regular file of at most {SECRET_FILE_LIMIT // 1024} KiB",
    ),
    Variable(
        "EXIT_TIMEOUT_SECS",
        SERVER,
        "integer",
        "`tritonserver --exit-timeout-secs`: how long in-flight requests may finish and the models unload after "
        "SIGTERM (`docker stop`); the server then exits 0, or 1 when this time ran out. The container's grace must be "
        f"longer: the documented `docker run --stop-timeout {contract.STOP_GRACE_SECS}` (Docker's own default is "
        "10 s), compose's `stop_grace_period` and Kubernetes' `terminationGracePeriodSeconds` give "
        f"{contract.STOP_GRACE_SECS} s. Raise them together.",
        default=contract.DEFAULT_EXIT_TIMEOUT_SECS,
        low=0,
        high=3600,
    ),
    Variable(
        "STRICT_ENV",
        SERVER,
        "boolean",
        "A variable that looks like one of these but is not (a close misspelling such as `MAX_BATCH_SIZ`, or an "
        "unknown name with one of their prefixes such as `MODEL_REV`) gets a warning at start naming the variable "
        "it probably meant. `true` refuses to start instead (exit 2, one line naming them all), for deployments "
        "whose settings must mean exactly what they say.",
        default=False,
    ),
    Variable(
        "LOG_FORMAT",
        SERVER,
        "choice",
        "One line per event, plain or JSON.",
        default="text",
        choices=get_args(LogFormat),
    ),
    Variable(
        "LOG_LEVEL",
        SERVER,
        "choice",
        "`info` keeps routine starts short: the template parameters you set (with counts of the rest), the step and "
        "output file of each build step, the program started. `debug` adds every template parameter, each build "
        "step's command line and the full server command line (`trtllm-entrypoint check` also lists every template "
        "parameter).",
        default="info",
        choices=get_args(LogLevel),
    ),
    Variable(
        "PROGRESS_INTERVAL_SECS",
        SERVER,
        "integer",
        "How often a hub download logs its progress (files and bytes done of the total, percent, rate, ETA), and a "
        "long step (converting, `trtllm-build`, waiting for another replica's build) logs that it is still running, "
        "with its elapsed time and the file its output goes to.",
        default=10,
        low=1,
        high=30,  # the heartbeat of a long step comes at least every 30 s
    ),
    Variable(
        "NVIDIA_VISIBLE_DEVICES",
        GPUS,
        "special",
        "`none`, `void` or empty: no GPU is used. A list naming GPUs that `nvidia-smi` shows keeps those; a list that "
        "names GPUs it does not show was already applied by the runtime (GPUs renumbered from 0) and keeps all.",
        shown_default="set by the container runtime",
        shown_allowed="`all`, `none`, `void`, or indices/UUIDs separated by commas",
    ),
    Variable(
        "CUDA_VISIBLE_DEVICES",
        GPUS,
        "special",
        "CUDA's rule: the listed GPUs in that order, up to the first entry that names no GPU; empty or `-1` hides all.",
        shown_default="unset: all",
        shown_allowed="indices or `GPU-…` UUIDs (or unique prefixes) separated by commas",
    ),
    Variable(
        "LWS_LEADER_ADDRESS",
        GPUS,
        "special",
        "Multi-node: set by a LeaderWorkerSet in every pod of a group, with `LWS_GROUP_SIZE` and `LWS_WORKER_INDEX` "
        "(all three or none). Pod 0 leads: it waits for its workers and runs `mpirun` across the pods over ssh; the "
        "others prepare the same engine from the cache and run sshd (docs/kserve.md).",
        shown_default="unset: one pod serves alone",
        shown_allowed="`<set>-<group>.<subdomain>.<namespace>`",
    ),
    Variable(
        "LWS_GROUP_SIZE",
        GPUS,
        "special",
        "Pods in the group; together they must hold `TP_SIZE` x `PP_SIZE` GPUs, each pod at least one rank.",
        shown_allowed="a whole number",
    ),
    Variable(
        "LWS_WORKER_INDEX",
        GPUS,
        "special",
        "This pod's place in the group: 0 is the leader.",
        shown_allowed="0 to `LWS_GROUP_SIZE` - 1",
    ),
    Variable(
        "WORKER_TIMEOUT_SECS",
        GPUS,
        "integer",
        "How long the leader waits for every worker's sshd; then it exits naming the missing ones.",
        default=3600,
        low=1,
        high=86400,
    ),
    Variable(
        "MPI_SSH_DIR",
        GPUS,
        "special",
        "The group's ssh key pair (`id_ed25519`, `id_ed25519.pub`, from a Secret): workers' host and login key.",
        shown_default=f"`{contract.MPI_SSH_DIR}`",
        shown_allowed="a directory",
    ),
    Variable(
        "MATRIX_TAG",
        IMAGE,
        "special",
        "Which matrix entry describes this image.",
        shown_default="baked into the image (`ENV MATRIX_TAG=<tag>`)",
        shown_allowed="a tag in the matrix file",
    ),
    Variable(
        "TRTLLM_MATRIX_FILE",
        IMAGE,
        "special",
        "The matrix, as JSON. The model list (`python build.py models --json`) is read from `models.json` in the same "
        "directory.",
        shown_default=f"`{contract.MATRIX_FILE}`",
        shown_allowed="path of `python build.py list --json` output",
    ),
    Variable(
        "TRTLLM_APP_DIR",
        IMAGE,
        "special",
        "The backend's templates, tools and TensorRT-LLM examples.",
        shown_default=f"`{contract.NGC_APP_DIR}` when the NGC image ships it (from 25.01), else "
        f"`{contract.BUNDLED_APP_DIR}`",
        shown_allowed="a directory with `all_models/`, `tools/`, `examples/`",
    ),
)
VARIABLES: dict[str, Variable] = {v.name: v for v in TABLE}

# Unknown names that start like ours are probably meant as ours. Only prefixes no other program in the image or its
# platform uses: not HF_ (huggingface_hub's), NVIDIA_/CUDA_, LWS_, HTTP_ (HTTP_PROXY), GRPC_, OPENAI_ (OPENAI_API_KEY)
# or TRTLLM_ (TensorRT-LLM's own).
OWN_PREFIXES = (
    "MODEL_",
    "ENGINE_",
    "MAX_",
    "KV_CACHE_",
    "ENABLE_",
    "TP_",
    "PP_",
    "PREPROCESSING_",
    "POSTPROCESSING_",
    "SERVED_",
    "TEMPLATES_",
    "REPOSITORY_",
    "RESTRICTED_",
    "TRITON_",
    "EXIT_",
    "LOG_",
    "PROGRESS_",
    "LOCK_",
    "LORA_",
)
# Names with one of those prefixes that others set: the NGC image's own.
FOREIGN_PREFIXES = ("TRITON_SERVER_",)
CLOSE_MATCH = 0.85  # difflib's ratio: catches a dropped, doubled or swapped letter, not HTTP_PROXY for HTTP_PORT


def lookalikes(names: Iterable[str]) -> list[tuple[str, str]]:
    """(name, the variable it probably meant) for each name that is not one of ours but looks like one: a close
    misspelling of a known name, or an unknown name with one of our prefixes (then the closest known one)."""
    found = []
    for name in sorted(set(names) - set(VARIABLES)):
        if not name.isupper() or name.startswith(FOREIGN_PREFIXES):
            continue
        close = difflib.get_close_matches(name, VARIABLES, n=1, cutoff=CLOSE_MATCH)
        if not close and name.startswith(OWN_PREFIXES):
            prefix = next(p for p in OWN_PREFIXES if name.startswith(p))
            close = difflib.get_close_matches(name, [v for v in VARIABLES if v.startswith(prefix)], n=1, cutoff=0)
        if close:
            found.append((name, close[0]))
    return found


def markdown(width: int = 116) -> str:
    """docs/environment.md's sections: one list item per variable, wrapped to `width` (a table row per variable made
    lines of 600 characters that no editor or diff shows whole)."""
    import textwrap  # noqa: PLC0415  (only the docs generator needs it)

    out: list[str] = []
    for section in SECTIONS:
        out += [f"### {section}", ""]
        for v in TABLE:
            if v.section == section:
                item = f"- `{v.name}`: default {v.default_text}; allowed: {v.allowed_text}. {v.help}"
                out += textwrap.wrap(
                    item, width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
                )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(markdown())
