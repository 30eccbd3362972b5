import os
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from harness.image_data import ENGINE_DEFAULTS, FACTS
from trtllm_entrypoint.config import settings as settings_mod
from trtllm_entrypoint.config import variables
from trtllm_entrypoint.config.settings import Settings
from trtllm_entrypoint.errors import UsageError

OLD_FACTS = replace(FACTS, tag="24.08", tensorrt_llm="0.12.0", workflows=("engine",), openai_frontend=False)


@pytest.fixture(autouse=True)
def writable_default_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(settings_mod.contract, "DEFAULT_CACHE_DIR", str(tmp_path / "cache"))


def load(facts=FACTS, **env):
    return Settings.from_env(env, facts)


def test_defaults(tmp_path):
    s = load()
    assert (s.model_id, s.model_revision, s.hf_token, s.engine_dir, s.repository_dir) == (None,) * 5
    assert s.cache_dir == tmp_path / "cache" and s.cache_fallback_reason is None
    assert s.templates_dir == Path("/app/all_models")
    assert s.workflow == "engine" and asdict(s.engine_spec) == ENGINE_DEFAULTS
    assert s.kv_cache_free_gpu_mem_fraction == 0.9
    assert (s.enable_kv_cache_reuse, s.decoupled) == (False, False)
    assert (s.http_port, s.grpc_port, s.metrics_port, s.openai_port) == (8000, 8001, 8002, 9000)
    assert (s.frontend, s.served_model_name, s.log_format, s.triton_args) == ("triton", None, "text", ())
    assert (s.exit_timeout_secs, s.lock_timeout_secs, s.world_size) == (30, 3600, 1)


def test_values_are_parsed():
    s = load(
        MODEL_ID=" meta-llama/Llama-3.1-8B ",
        TP_SIZE="4",
        PP_SIZE="2",
        DTYPE="BFloat16",
        QUANTIZATION="fp8",
        DECOUPLED="Yes",
        ENABLE_KV_CACHE_REUSE="on",
        KV_CACHE_FREE_GPU_MEM_FRACTION="0.85",
        TRITON_ARGS="--log-verbose=1 --model-control-mode 'explicit'",
        ENGINE_DIR="rel/engine",
        SERVED_MODEL_NAME="llama-3.1",
        WORKFLOW="ENGINE",
        LOG_FORMAT="json",
    )
    assert s.model_id == "meta-llama/Llama-3.1-8B"
    assert (s.tp_size, s.pp_size, s.world_size) == (4, 2, 8)
    assert (s.dtype, s.quantization, s.decoupled, s.enable_kv_cache_reuse) == ("bfloat16", "fp8", True, True)
    assert s.kv_cache_free_gpu_mem_fraction == 0.85
    assert s.triton_args == ("--log-verbose=1", "--model-control-mode", "explicit")
    assert s.engine_dir.is_absolute() and s.engine_dir.parts[-2:] == ("rel", "engine")
    assert (s.served_model_name, s.workflow, s.log_format) == ("llama-3.1", "engine", "json")


def test_empty_values_count_as_unset():
    s = load(TP_SIZE="", DECOUPLED="  ", MODEL_ID="", HF_TOKEN="", FRONTEND="")
    assert (s.tp_size, s.decoupled, s.model_id, s.hf_token, s.frontend) == (1, False, None, None, "triton")


def test_default_workflow_follows_the_image():
    deprecated = replace(FACTS, engine_deprecated=True)
    assert load(deprecated).workflow == "llmapi"


BAD = [
    ({"TP_SIZE": "zero"}, "TP_SIZE='zero'", "a whole number from 1 to 64"),
    ({"TP_SIZE": "3"}, "TP_SIZE='3'", "a power of two: 1, 2, 4, 8, 16, 32, 64"),
    ({"TP_SIZE": "128"}, "TP_SIZE='128'", "a whole number from 1 to 64"),
    ({"PP_SIZE": "0"}, "PP_SIZE='0'", "a whole number from 1 to 64"),
    ({"PP_SIZE": "1.5"}, "PP_SIZE='1.5'", "a whole number from 1 to 64"),
    ({"MAX_BATCH_SIZE": "-1"}, "MAX_BATCH_SIZE='-1'", "a whole number from 1 to 4096"),
    ({"MAX_INPUT_LEN": "2k"}, "MAX_INPUT_LEN='2k'", "a whole number from 1 to 1048576"),
    ({"MAX_SEQ_LEN": "2048"}, "MAX_SEQ_LEN='2048'", "a number greater than MAX_INPUT_LEN=2048"),
    ({"MAX_INPUT_LEN": "4096"}, "MAX_SEQ_LEN='4096'", "a number greater than MAX_INPUT_LEN=4096"),
    ({"MAX_NUM_TOKENS": "1024"}, "MAX_NUM_TOKENS='1024'", "a number at least MAX_INPUT_LEN=2048"),
    ({"MAX_BEAM_WIDTH": "0"}, "MAX_BEAM_WIDTH='0'", "a whole number from 1 to 64"),
    (
        {"KV_CACHE_FREE_GPU_MEM_FRACTION": "0"},
        "KV_CACHE_FREE_GPU_MEM_FRACTION='0'",
        "a number greater than 0 and at most 1",
    ),
    (
        {"KV_CACHE_FREE_GPU_MEM_FRACTION": "1.5"},
        "KV_CACHE_FREE_GPU_MEM_FRACTION='1.5'",
        "a number greater than 0 and at most 1",
    ),
    (
        {"KV_CACHE_FREE_GPU_MEM_FRACTION": "nan"},
        "KV_CACHE_FREE_GPU_MEM_FRACTION='nan'",
        "a number greater than 0 and at most 1",
    ),
    (
        {"KV_CACHE_FREE_GPU_MEM_FRACTION": "lots"},
        "KV_CACHE_FREE_GPU_MEM_FRACTION='lots'",
        "a number greater than 0 and at most 1",
    ),
    ({"DECOUPLED": "maybe"}, "DECOUPLED='maybe'", "one of true/1/yes/on/false/0/no/off"),
    ({"ENABLE_KV_CACHE_REUSE": "2"}, "ENABLE_KV_CACHE_REUSE='2'", "one of true/1/yes/on/false/0/no/off"),
    ({"DTYPE": "fp16"}, "DTYPE='fp16'", "one of auto, float16, bfloat16, float32"),
    (
        {"QUANTIZATION": "awq"},
        "QUANTIZATION='awq'",
        "one of none, fp8, int8_sq, int4_awq, w4a8_awq, int8_wo, int4_wo, nvfp4",
    ),
    ({"QUANTIZATION": "fp8", "WORKFLOW": "llmapi"}, "QUANTIZATION='fp8'", "none with WORKFLOW=llmapi"),
    ({"WORKFLOW": "pytorch"}, "WORKFLOW='pytorch'", "one of engine, llmapi (what TensorRT-LLM 0.19.0"),
    ({"FRONTEND": "vllm"}, "FRONTEND='vllm'", "one of triton, openai"),
    ({"LOG_FORMAT": "xml"}, "LOG_FORMAT='xml'", "one of text, json"),
    ({"HTTP_PORT": "0"}, "HTTP_PORT='0'", "a whole number from 1 to 65535"),
    ({"GRPC_PORT": "70000"}, "GRPC_PORT='70000'", "a whole number from 1 to 65535"),
    ({"GRPC_PORT": "8000"}, "GRPC_PORT='8000'", "a port different from HTTP_PORT=8000"),
    ({"OPENAI_PORT": "8002", "FRONTEND": "openai"}, "OPENAI_PORT='8002'", "a port different from METRICS_PORT=8002"),
    ({"SERVED_MODEL_NAME": "org/model"}, "SERVED_MODEL_NAME='org/model'", "up to 128 letters, digits"),
    ({"TRITON_ARGS": "--log-file 'unclosed"}, 'TRITON_ARGS="--log-file \'unclosed"', "arguments in shell quoting"),
    ({"EXIT_TIMEOUT_SECS": "-5"}, "EXIT_TIMEOUT_SECS='-5'", "a whole number from 0 to 3600"),
    ({"LOCK_TIMEOUT_SECS": "1h"}, "LOCK_TIMEOUT_SECS='1h'", "a whole number from 0 to 86400"),
    ({"ENGINE_DIR": "/engines/x", "WORKFLOW": "llmapi"}, "ENGINE_DIR='/engines/x'", "unset with WORKFLOW=llmapi"),
    ({"CACHE_DIR": "/mnt/models/cache"}, "CACHE_DIR='/mnt/models/cache'", "a writable directory outside /mnt/models"),
    ({"REPOSITORY_DIR": "/mnt/models"}, "REPOSITORY_DIR='/mnt/models'", "a writable directory outside /mnt/models"),
    # str.isdigit() accepts these and int() then fails (or, for "٨", silently reads 8): refused as not ASCII digits
    ({"TP_SIZE": "²"}, "TP_SIZE='²'", "a whole number from 1 to 64"),
    ({"PP_SIZE": "٨"}, "PP_SIZE='٨'", "a whole number from 1 to 64"),
    ({"MAX_BATCH_SIZE": "６４"}, "MAX_BATCH_SIZE='６４'", "a whole number from 1 to 4096"),
    (
        {"KV_CACHE_FREE_GPU_MEM_FRACTION": "٠.٥"},
        "KV_CACHE_FREE_GPU_MEM_FRACTION='٠.٥'",
        "a number greater than 0 and at most 1",
    ),
    ({"HTTP_PORT": "8_000"}, "HTTP_PORT='8_000'", "a whole number from 1 to 65535"),
    # names the repository's own models have
    ({"SERVED_MODEL_NAME": "tensorrt_llm"}, "SERVED_MODEL_NAME='tensorrt_llm'", "a name other than preprocessing"),
    ({"SERVED_MODEL_NAME": "preprocessing"}, "SERVED_MODEL_NAME='preprocessing'", "a name other than"),
    ({"SERVED_MODEL_NAME": "tensorrt_llm_bls"}, "SERVED_MODEL_NAME='tensorrt_llm_bls'", "a name other than"),
    # values that land in config.pbtxt, where `${` reads as an unfilled placeholder
    ({"MODEL_ID": "/models/${NAME}"}, "MODEL_ID='/models/${NAME}'", "a value without '${'"),
    ({"ENGINE_DIR": "/e/${x}"}, "ENGINE_DIR='/e/${x}'", "a value without '${'"),
    ({"CACHE_DIR": "/c/${x}"}, "CACHE_DIR='/c/${x}'", "a value without '${'"),
    ({"TEMPLATES_DIR": "/t/${x}"}, "TEMPLATES_DIR='/t/${x}'", "a value without '${'"),
]


@pytest.mark.parametrize("env, named, allowed", BAD, ids=[next(iter(row[0])) + "=" + repr(row[0]) for row in BAD])
def test_bad_values_name_the_variable_and_what_is_allowed(env, named, allowed):
    with pytest.raises(UsageError) as info:
        load(**env)
    message = info.value.message
    assert message.startswith(named + " is not allowed: expected ")
    assert allowed in message
    assert "\n" not in message
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    "args, variable",
    [
        ("--http-port=9000", "HTTP_PORT"),
        ("--log-verbose=1 --grpc-port 9001", "GRPC_PORT"),
        ("--metrics-port=1", "METRICS_PORT"),
        ("--http-p=9000", "HTTP_PORT"),  # tritonserver's getopt takes unique prefixes
        ("--model-repository=/other", "REPOSITORY_DIR"),
        ("--model-store /other", "REPOSITORY_DIR"),
        ("--model-repo=/other", "REPOSITORY_DIR"),
        ("--model-st /other", "REPOSITORY_DIR"),
        ("--http-restricted=logging:admin-key=k", "RESTRICTED_APIS"),
        ("--grpc-restricted-p logging:admin-key=k", "RESTRICTED_APIS"),
        ("--backend-config=python,shm-region-prefix-name=mine_", "nothing: each rank gets its own"),
        ("--backend-config python,shm-region-prefix-name=mine_", "nothing: each rank gets its own"),
    ],
)
def test_triton_args_may_not_set_what_the_entrypoint_sets(args, variable):
    with pytest.raises(UsageError) as info:
        load(TRITON_ARGS=args)
    assert info.value.message.startswith("TRITON_ARGS may not contain '--")
    assert info.value.hint.startswith(f"set {variable}")


@pytest.mark.parametrize("args, variable", [("--http-port=1234", "HTTP_PORT"), ("--metrics-p 1", "METRICS_PORT")])
def test_with_the_openai_front_triton_args_are_still_tritonservers(args, variable):
    with pytest.raises(UsageError) as info:
        load(TRITON_ARGS=args, FRONTEND="openai")
    assert info.value.message.startswith("TRITON_ARGS may not contain '--")
    assert info.value.hint.startswith(f"set {variable}")


def test_triton_args_keep_everything_else():
    args = "--log-verbose=1 --backend-config=python,shm-default-byte-size=1048576 --model-control-mode explicit"
    assert load(TRITON_ARGS=args).triton_args[:3] == (
        "--log-verbose=1",
        "--backend-config=python,shm-default-byte-size=1048576",
        "--model-control-mode",
    )


def test_image_capabilities_limit_workflow_and_frontend():
    with pytest.raises(UsageError, match=r"WORKFLOW='llmapi' .*one of engine \(what TensorRT-LLM 0.12.0"):
        load(OLD_FACTS, WORKFLOW="llmapi")
    # The front needs only tritonserver's generate_stream and a decoupled model: every tag serves it.
    assert load(OLD_FACTS, FRONTEND="openai").frontend == "openai"
    assert load(FACTS, FRONTEND="OpenAI").frontend == "openai"


def test_long_values_are_shortened_in_messages():
    with pytest.raises(UsageError) as info:
        load(DTYPE="x" * 500)
    assert len(info.value.message) < 200 and "..." in info.value.message


def test_token_sources(tmp_path):
    assert load(HF_TOKEN="hf_env").hf_token == "hf_env"
    assert load(HUGGING_FACE_HUB_TOKEN="hf_legacy").hf_token == "hf_legacy"
    assert load(HF_TOKEN="hf_new", HUGGING_FACE_HUB_TOKEN="hf_old").hf_token == "hf_new"
    token_file = tmp_path / "token"
    token_file.write_text("  hf_from_file\n")
    assert load(HF_TOKEN_FILE=str(token_file)).hf_token == "hf_from_file"


def test_token_errors_never_show_the_token(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("hf_file_secret")
    with pytest.raises(UsageError) as both:
        load(HF_TOKEN="hf_env_secret", HF_TOKEN_FILE=str(token_file))
    assert "HF_TOKEN and HF_TOKEN_FILE are both set" in both.value.message
    assert "hf_env_secret" not in str(both.value) and "hf_file_secret" not in str(both.value)
    with pytest.raises(UsageError, match=r"HF_TOKEN_FILE='.*missing' is not allowed: expected a readable file"):
        load(HF_TOKEN_FILE=str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(UsageError, match=r"HF_TOKEN_FILE=.* the file is empty"):
        load(HF_TOKEN_FILE=str(tmp_path / "empty"))


def test_token_files_are_read_bounded_and_strictly(tmp_path):
    with pytest.raises(UsageError, match=r"HF_TOKEN_FILE='/dev/zero' is not allowed: expected a regular file"):
        load(HF_TOKEN_FILE="/dev/zero")  # a device never ends: refused before any read
    (tmp_path / "huge").write_bytes(b"hf_" + b"x" * (64 * 1024))
    with pytest.raises(UsageError, match=r"HF_TOKEN_FILE=.* expected a file of at most 65536 bytes"):
        load(HF_TOKEN_FILE=str(tmp_path / "huge"))
    (tmp_path / "binary").write_bytes(b"hf_\xff\xfe\x00token")
    with pytest.raises(UsageError, match=r"HF_TOKEN_FILE=.* as ASCII text"):
        load(HF_TOKEN_FILE=str(tmp_path / "binary"))
    (tmp_path / "latin").write_bytes("hf_tökén".encode())
    with pytest.raises(UsageError, match=r"HF_TOKEN_FILE=.* as ASCII text"):
        load(HF_TOKEN_FILE=str(tmp_path / "latin"))


@pytest.mark.parametrize("token", ["hf_tökén_secret", "hf_two words", "hf_line\nbreak"])
def test_a_token_that_cannot_go_into_an_http_header_is_refused_without_showing_it(token):
    with pytest.raises(UsageError) as info:
        load(HF_TOKEN=token)
    assert info.value.message.startswith("HF_TOKEN is not allowed: expected a Hugging Face token")
    assert token.split()[0][3:] not in str(info.value)


def test_settings_know_which_values_were_set():
    s = load(MAX_BATCH_SIZE="8", DECOUPLED="", TP_SIZE=" 2 ")
    assert {"max_batch_size", "tp_size"} <= s.explicit and "decoupled" not in s.explicit
    assert "max_seq_len" not in s.explicit


def test_the_llmapi_model_may_keep_its_own_name():
    assert load(WORKFLOW="llmapi", SERVED_MODEL_NAME="tensorrt_llm").served_model_name == "tensorrt_llm"


def test_token_is_hidden_in_repr_and_describe():
    s = load(HF_TOKEN="hf_secret_value", MODEL_ID="org/name")
    assert "hf_secret_value" not in repr(s)
    described = s.describe()
    assert described["hf_token"] == "***"
    assert "hf_secret_value" not in str(described)
    assert load().describe()["hf_token"] is None


def test_describe_is_json_ready_and_complete(tmp_path):
    import json

    described = load(TRITON_ARGS="--log-info=true --id x", TP_SIZE="2").describe()
    assert json.loads(json.dumps(described)) == described
    assert described["cache_dir"] == str(tmp_path / "cache")
    assert described["triton_args"] == ["--log-info=true", "--id", "x"]
    assert described["world_size"] == 2
    assert {"model_id", "workflow", "openai_port", "cache_fallback_reason", "lock_timeout_secs"} <= set(described)


def test_unwritable_default_cache_falls_back_to_temp(monkeypatch, tmp_path):
    monkeypatch.setattr(settings_mod, "_writable", lambda path: False)
    monkeypatch.setattr(settings_mod.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    s = load()
    assert s.cache_dir == tmp_path / "tmp" / f"trtllm-cache-{os.geteuid()}"
    assert "not writable" in s.cache_fallback_reason and str(tmp_path / "cache") in s.cache_fallback_reason
    assert not (tmp_path / "tmp").exists(), "from_env must not create directories"


def test_explicit_cache_dir_is_used_even_when_unwritable(monkeypatch, tmp_path):
    monkeypatch.setattr(settings_mod, "_writable", lambda path: False)
    s = load(CACHE_DIR=str(tmp_path / "mine"))
    assert (s.cache_dir, s.cache_fallback_reason) == (tmp_path / "mine", None)


def test_writable_checks_the_nearest_existing_parent(tmp_path):
    assert settings_mod._writable(tmp_path / "not" / "yet")
    assert not (tmp_path / "not").exists()


def test_the_openai_port_only_has_to_differ_when_the_openai_frontend_runs():
    # KServe's gRPC port is 9000, OPENAI_PORT's default: fine as long as nothing listens on the OpenAI port.
    settings = Settings.from_env({"GRPC_PORT": "9000"}, FACTS)
    assert settings.grpc_port == settings.openai_port == 9000


def test_instance_counts_default_from_the_usable_cpus(monkeypatch):
    monkeypatch.setattr(settings_mod.cpus, "usable_cpus", lambda: 6)
    s = load()
    assert (s.preprocessing_instances, s.postprocessing_instances) == (3, 3)
    s = load(PREPROCESSING_INSTANCES="1", POSTPROCESSING_INSTANCES="12")
    assert (s.preprocessing_instances, s.postprocessing_instances) == (1, 12)
    with pytest.raises(UsageError, match="POSTPROCESSING_INSTANCES='0' is not allowed: expected a whole number"):
        load(POSTPROCESSING_INSTANCES="0")


# --- variables that look like ours ----------------------------------------------------------------------------------

# What the NGC image, the container runtimes, Kubernetes, KServe, LeaderWorkerSet, huggingface_hub, TensorRT-LLM,
# NCCL and Open MPI set or read: none of it is ours, none of it may be warned about.
OTHERS = [
    "PATH",
    "HOME",
    "HOSTNAME",
    "LANG",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "TRITON_SERVER_VERSION",
    "TRITON_SERVER_USER",
    "NVIDIA_TRITON_SERVER_VERSION",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_REQUIRE_CUDA",
    "NVIDIA_PRODUCT_NAME",
    "CUDA_VERSION",
    "CUDA_DRIVER_VERSION",
    "CUDA_HOME",
    "CUDA_MODULE_LOADING",
    "CUDA_DEVICE_ORDER",
    "TRT_VERSION",
    "TENSORRT_VERSION",
    "TRTLLM_ORCHESTRATOR",
    "HF_HOME",
    "HF_ENDPOINT",
    "HF_HUB_CACHE",
    "HF_HUB_ENABLE_HF_TRANSFER",
    "HF_HUB_DISABLE_TELEMETRY",
    "HF_HUB_DOWNLOAD_TIMEOUT",
    "HF_HUB_ETAG_TIMEOUT",
    "HF_TOKEN_PATH",
    "HF_HUB_VERBOSITY",
    "HF_XET_HIGH_PERFORMANCE",
    "TRANSFORMERS_CACHE",
    "TRANSFORMERS_OFFLINE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "REQUESTS_CA_BUNDLE",
    "SSL_CERT_FILE",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "POD_NAME",
    "POD_NAMESPACE",
    "NODE_NAME",
    "LWS_NAME",
    "K_SERVICE",
    "PORT",
    "STORAGE_URI",
    "AIP_MODE",
    "AIP_HTTP_PORT",
    "NCCL_DEBUG",
    "NCCL_IB_DISABLE",
    "NCCL_SOCKET_IFNAME",
    "OMPI_MCA_btl",
    "OMPI_ALLOW_RUN_AS_ROOT",
    "OMPI_MCA_rmaps_base_oversubscribe",
    "OMP_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "OPENAI_API_KEY",
    "GRPC_VERBOSITY",
    "GRPC_TRACE",
    "XDG_CACHE_HOME",
    "TMPDIR",
    "TZ",
]


def test_nothing_another_program_sets_looks_like_ours():
    assert variables.lookalikes(OTHERS) == []


@pytest.mark.parametrize(
    "name, meant",
    [
        ("MAX_BATCH_SIZ", "MAX_BATCH_SIZE"),
        ("DECOUPLE", "DECOUPLED"),
        ("MODELID", "MODEL_ID"),
        ("HF_TOKN", "HF_TOKEN"),
        ("QUANTISATION", "QUANTIZATION"),
        ("MAX_SEQ_LENGTH", "MAX_SEQ_LEN"),
        ("MODEL_REV", "MODEL_REVISION"),  # not close, but our prefix
        ("ENABLE_KV_REUSE", "ENABLE_KV_CACHE_REUSE"),
        ("TRITON_ADMIN_KEY_PATH", "TRITON_ADMIN_KEY"),
        ("EXIT_TIMEOUT", "EXIT_TIMEOUT_SECS"),
    ],
)
def test_a_lookalike_names_the_variable_it_probably_meant(name, meant):
    assert variables.lookalikes([name, "MAX_BATCH_SIZE", *OTHERS]) == [(name, meant)]


def test_lookalikes_are_kept_for_a_warning_or_refused_with_strict_env():
    settings = load(MAX_BATCH_SIZ="8", DECOUPLE="true")
    assert settings.lookalikes == ("DECOUPLE (did you mean DECOUPLED?)", "MAX_BATCH_SIZ (did you mean MAX_BATCH_SIZE?)")
    assert settings.max_batch_size == 64 and not settings.decoupled, "a lookalike is not read"
    with pytest.raises(UsageError, match=r"DECOUPLE \(did you mean DECOUPLED\?\), MAX_BATCH_SIZ") as err:
        load(MAX_BATCH_SIZ="8", DECOUPLE="true", STRICT_ENV="1")
    assert err.value.exit_code == 2 and "\n" not in err.value.message
    assert load(STRICT_ENV="1").lookalikes == ()
