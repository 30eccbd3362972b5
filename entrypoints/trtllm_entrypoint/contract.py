"""Paths, ports and names shared by the image and what the host makes for it: the Dockerfiles (images/*.j2) and the
KServe manifests (trtllm_images/kserve/plan.py) read them from here. Standard library only, importing nothing of ours.
"""

import re

# Where KServe's storage initializer, PVC or modelcar puts the model; always treated as read-only.
KSERVE_MODEL_DIR = "/mnt/models"
# Where `build.py kserve --adapters` mounts the LoRA adapters' claim (read-only), named in LORA_DIR.
KSERVE_ADAPTERS_DIR = "/mnt/adapters"

# Written by build.py into every image: the whole matrix as JSON, and the tag that describes the image.
MATRIX_FILE = "/etc/trtllm-images/matrix.json"
# Next to it: which models each tag serves (`build.py models --json`); the entrypoint finds it beside MATRIX_FILE.
MODELS_FILE = "/etc/trtllm-images/models.json"

# NGC images from 25.01 ship the backend's all_models/, tools/ and examples/ here.
NGC_APP_DIR = "/app"
# Older images get the same layout from build.py (fetched at the backend ref of the matrix entry).
BUNDLED_APP_DIR = "/opt/trtllm-images/app"
# Only the repository check puts it on its import path: protobuf's pure-Python runtime and Triton's ModelConfig
# (model_config_pb2.py), pinned in vendor.lock.json; the base image's own site-packages stay untouched.
VALIDATION_DIR = "/opt/trtllm-images/validation"
# The same for the OpenAI front's processes (FRONTEND=openai): its HTTP server and client, schemas (vendor.lock.json).
FRONT_DIR = "/opt/trtllm-images/front"
# The variable that hands the admin key to the front's processes (read and dropped at their start).
FRONT_KEY_VARIABLE = "TRTLLM_FRONT_ADMIN_KEY"
# The header that carries the admin key to a restricted API: Triton's HTTP check and the OpenAI front's alike.
ADMIN_KEY_HEADER = "admin-key"
# The variable that hands the front's plan (openai/plan.py's FrontPlan, as JSON) to each of its processes.
FRONT_PLAN_VARIABLE = "TRTLLM_FRONT_PLAN"
# The variable that names the pipe (a file descriptor) each front process writes a byte to every second, so that the
# supervisor notices a worker whose event loop is stuck (supervise.py, openai/liveness.py).
FRONT_HEARTBEAT_VARIABLE = "TRTLLM_FRONT_HEARTBEAT_FD"
# prometheus_client's own: the directory where every front process writes its metric values (multiprocess mode), made
# fresh for each start by the supervisor; read when prometheus_client is first imported.
FRONT_METRICS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
# PID 1 of the images (ENTRYPOINT): passes signals to the server and reaps the ready-line watcher.
TINI = "/opt/trtllm-images/bin/tini"

# The hub huggingface_hub asks when HF_ENDPOINT is unset.
DEFAULT_HUB_ENDPOINT = "https://huggingface.co"

# Writable under any UID: the images create it with mode 1777.
DEFAULT_CACHE_DIR = "/var/cache/trtllm"

# On SIGTERM the server drains in-flight requests and unloads its models within EXIT_TIMEOUT_SECS, then exits 0
# (1 if that time ran out). Unloading the Python models alone takes seconds, so Docker's default grace of 10 s
# before SIGKILL is too short: the documented `docker run --stop-timeout`, the compose file's stop_grace_period and
# the manifests' terminationGracePeriodSeconds all give this grace, which leaves time after the drain to exit.
DEFAULT_EXIT_TIMEOUT_SECS = 30
STOP_GRACE_SECS = DEFAULT_EXIT_TIMEOUT_SECS + 10
# /dev/shm for every documented start (`docker run --shm-size`, compose's shm_size, the manifests' memory emptyDir):
# the Python models pass tensors through it and NCCL uses it between the GPUs of one host; Docker's 64 MB is too small.
SHM_SIZE_GIB = 8

# Triton's own defaults (the KServe runtime sets HTTP_PORT=8080 and keeps gRPC on 8001: 9000 is only the OpenAI API).
DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002
DEFAULT_OPENAI_PORT = 9000

# The NGC images' triton-server user: the images run as it, and the KServe pods' fsGroup is it.
UID = 1000

TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
# Triton's own OpenAI frontend, in images from 24.12 (run by hand: docs/openai.md).
OPENAI_FRONTEND_MAIN = "/opt/tritonserver/python/openai/openai_frontend/main.py"
# Where each frontend answers whether it is ready (Triton's KServe protocol; the OpenAI front's own route).
READY_PATHS = {"triton": "/v2/health/ready", "openai": "/health/ready"}

# The models of a filled repository by workflow, and the one clients call (SERVED_MODEL_NAME renames it). The
# others keep their names, since the ensemble steps and the BLS model refer to them: no served name may take them.
ENGINE_MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls", "ensemble")
ENTRY_MODEL = {"engine": "ensemble", "llmapi": "tensorrt_llm"}
# The model our OpenAI front asks with token ids, per workflow (the llmapi model takes text: its entry model).
IDS_MODEL = {"engine": "tensorrt_llm"}
INNER_MODELS = {"engine": tuple(m for m in ENGINE_MODELS if m != ENTRY_MODEL["engine"]), "llmapi": ()}

# TOOL_CALL_PARSER: `auto` (the family the chat template shows) or a tool-call family the OpenAI front reads
# (openai/tools.py's FAMILIES, which a test keeps equal to these names).
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "mistral", "granite", "qwen3_coder")

# Multi-node groups (LeaderWorkerSet): each worker pod runs sshd on this port with the group's key mounted here
# (a Secret with `id_ed25519` and `id_ed25519.pub`); the leader's mpirun starts the other ranks through it.
MPI_SSH_DIR = "/etc/trtllm-images/mpi-ssh"
MPI_SSH_PORT = 2222

# Hub ids are "org/name" by the hub's rules: letters, digits, '-', '_', '.', each part starting and ending with a
# letter, digit or '_', the name at most 96 characters, no '--' or '..' anywhere, no '.git' at the end.
_HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
HUB_ID = re.compile(rf"(?:[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?)/{_HUB_PART}")
HUB_ID_RULE = (
    "a Hugging Face id (org/name: letters, digits, '-', '_' and '.', each part starting and ending with a "
    "letter, digit or '_', the name at most 96 characters, no '--' or '..')"
)


def is_hub_id(text: str) -> bool:
    return bool(HUB_ID.fullmatch(text)) and ".." not in text and "--" not in text and not text.endswith(".git")
