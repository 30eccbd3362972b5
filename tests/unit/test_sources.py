import io
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from harness.upstream_files import upstream_path
from tests import factories
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.log import Log
from trtllm_entrypoint.model import digest as model_digest
from trtllm_entrypoint.model import hub, locate
from trtllm_entrypoint.model.digest import content_digest
from trtllm_entrypoint.model.hub import hub_allow_patterns
from trtllm_entrypoint.model.locate import ModelSource, classify_dir, identity

hub_errors = pytest.importorskip("huggingface_hub.errors")

FACTS = factories.image_facts(
    tag="25.05",
    tensorrt_llm="0.19.0",
    tensorrt=None,
    triton=None,
    workflows=("engine", "llmapi"),
    engine_deprecated=False,
    openai_frontend=True,
    app_dir=Path("/app"),
)
TOKEN = "hf_do_not_leak_this_token"


@pytest.fixture(autouse=True)
def _hub_answers_the_probe(monkeypatch):
    """These tests stand a mock in for the hub client; the probe before it (tests/unit/test_hub_reach.py) would ask
    the real endpoint."""
    monkeypatch.setattr(hub.hub_reach, "check", lambda repo_id, revision, base: None)


def make_settings(tmp_path, **env):
    return factories.settings(FACTS, CACHE_DIR=str(tmp_path / "cache"), **env)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def checkpoint(path: Path) -> Path:
    write(path / "config.json", json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    write(path / "model.safetensors", "weights")
    return path


def engine(path: Path) -> Path:
    write(path / "config.json", json.dumps({"version": "0.17.0", "build_config": {}, "pretrained_config": {}}))
    write(path / "rank0.engine", "engine")
    return path


# --- classify_dir -------------------------------------------------------------------------------------------------


def test_classify_checkpoint_engine_and_repository(tmp_path):
    assert classify_dir(checkpoint(tmp_path / "ckpt")) == "checkpoint"
    assert classify_dir(engine(tmp_path / "engine")) == "engine"
    write(tmp_path / "repo" / "ensemble" / "config.pbtxt", 'name: "ensemble"\nplatform: "ensemble"\n')
    write(tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt", 'name: "tensorrt_llm"\nbackend: "tensorrtllm"\n')
    assert classify_dir(tmp_path / "repo") == "repository"


def test_engine_needs_rank_files(tmp_path):
    path = engine(tmp_path / "e")
    (path / "rank0.engine").unlink()
    with pytest.raises(UsageError, match="holds no model that can be served: looked for a prebuilt engine"):
        classify_dir(path)


def test_model_type_alone_is_a_checkpoint(tmp_path):
    write(tmp_path / "config.json", '{"model_type": "qwen2"}')
    assert classify_dir(tmp_path) == "checkpoint"


def test_repository_with_placeholders_is_a_template(tmp_path):
    write(
        tmp_path / "tensorrt_llm" / "config.pbtxt",
        'parameters { key: "gpt_model_path" value: { string_value: "${engine_dir}" } }',
    )
    write(tmp_path / "ensemble" / "config.pbtxt", 'name: "ensemble"')
    with pytest.raises(UsageError, match=r"is a repository template: .* left in tensorrt_llm/config.pbtxt") as err:
        classify_dir(tmp_path)
    assert "MODEL_ID" in err.value.hint


def test_upstream_backend_templates_are_recognised_as_templates(tmp_path):
    shutil.copytree(upstream_path("tensorrtllm_backend/v0.17.0/inflight_batcher_llm"), tmp_path / "repo")
    with pytest.raises(UsageError, match="is a repository template"):
        classify_dir(tmp_path / "repo")


def test_unknown_directory_lists_what_was_looked_for(tmp_path):
    write(tmp_path / "README.md", "hello")
    with pytest.raises(UsageError) as err:
        classify_dir(tmp_path)
    for wanted in ("prebuilt engine", "Triton model repository", "Hugging Face checkpoint"):
        assert wanted in err.value.message


def test_broken_config_json_is_named(tmp_path):
    write(tmp_path / "config.json", "{not json")
    with pytest.raises(UsageError, match=r"config.json is not allowed: expected JSON"):
        classify_dir(tmp_path)


def test_a_file_is_not_a_model_dir(tmp_path):
    with pytest.raises(UsageError, match="is not a directory"):
        classify_dir(write(tmp_path / "model.gguf", "x"))


# --- resolve ------------------------------------------------------------------------------------------------------


def test_resolve_local_path(tmp_path):
    path = checkpoint(tmp_path / "llama")
    source = locate.resolve(make_settings(tmp_path, MODEL_ID=str(path)))
    assert source == ModelSource(kind="checkpoint", path=path, repo_id=None, revision=None, read_only=False)


def test_resolve_hub_id(tmp_path):
    settings = make_settings(tmp_path, MODEL_ID="meta-llama/Llama-3.1-8B-Instruct", MODEL_REVISION="v1")
    source = locate.resolve(settings, exists=lambda p: False)
    assert source == ModelSource(
        kind="hub", path=None, repo_id="meta-llama/Llama-3.1-8B-Instruct", revision="v1", read_only=False
    )


@pytest.mark.parametrize(
    "model_id, message",
    [
        ("llama", "or the path of an existing directory"),
        ("a/b/c", "expected a Hugging Face id"),
        ("org/na me", "expected a Hugging Face id"),
        ("org/..", "expected a Hugging Face id"),
        ("org/name-", "expected a Hugging Face id"),
        ("org/name.", "expected a Hugging Face id"),
        ("org/-name", "expected a Hugging Face id"),
        ("org/" + "n" * 97, "the name at most 96 characters"),
        ("org/name.git", "expected a Hugging Face id"),
        ("org/na--me", "expected a Hugging Face id"),
        ("/models/missing", "the path does not exist"),
        ("./missing", "the path does not exist"),
    ],
)
def test_resolve_bad_model_ids(tmp_path, model_id, message):
    with pytest.raises(UsageError) as err:
        locate.resolve(make_settings(tmp_path, MODEL_ID=model_id), exists=lambda p: False)
    assert err.value.message.startswith(f"MODEL_ID='{model_id}' is not allowed: ")
    assert message in err.value.message


HUB_IDS = [
    "org/name",
    "org/name-",
    "org/name.",
    "org/_x_",
    "org/" + "n" * 96,
    "org/" + "n" * 97,
    "org/a.b-c_d",
    "org/a..b",
    "org/a--b",
    "org/x.git",
    "o-r.g/x",
    "-org/x",
    "org/-x",
    "org/x y",
    "org/é",
]


@pytest.mark.parametrize("repo_id", HUB_IDS)
def test_hub_ids_follow_the_hubs_own_rule(repo_id):
    validators = pytest.importorskip("huggingface_hub.utils")
    try:
        validators.validate_repo_id(repo_id)
        valid = True
    except validators.HFValidationError:
        valid = False
    if repo_id.isascii():  # the hub also takes non-ASCII letters; MODEL_ID keeps to ASCII
        assert locate.is_hub_id(repo_id) == valid
    else:
        assert not locate.is_hub_id(repo_id)


def test_resolve_kserve_mount_is_read_only(tmp_path, monkeypatch):
    mount = checkpoint(tmp_path / "mnt" / "models")
    monkeypatch.setattr(locate.contract, "KSERVE_MODEL_DIR", str(mount))
    source = locate.resolve(make_settings(tmp_path))
    assert (source.kind, source.path, source.read_only) == ("checkpoint", mount, True)


def test_resolve_without_model_explains_both_ways(tmp_path, monkeypatch):
    monkeypatch.setattr(locate.contract, "KSERVE_MODEL_DIR", str(tmp_path / "absent"))
    with pytest.raises(UsageError) as err:
        locate.resolve(make_settings(tmp_path))
    assert err.value.message == f"MODEL_ID is not set and {tmp_path / 'absent'} does not exist"
    assert "set MODEL_ID" in err.value.hint and "mount the model" in err.value.hint
    with pytest.raises(UsageError, match="MODEL_INIT_MODE=async"):
        locate.resolve(make_settings(tmp_path, MODEL_INIT_MODE="async"))


def test_resolve_engine_dir_wins_and_must_hold_an_engine(tmp_path):
    built = engine(tmp_path / "engine")
    settings = make_settings(tmp_path, ENGINE_DIR=str(built), MODEL_ID="org/tokenizer")
    assert locate.resolve(settings).kind == "engine"
    assert locate.resolve_model(settings, exists=lambda p: False).repo_id == "org/tokenizer"
    ckpt = checkpoint(tmp_path / "ckpt")
    with pytest.raises(UsageError, match=r"ENGINE_DIR='.*ckpt' is not allowed: it holds a checkpoint"):
        locate.resolve(make_settings(tmp_path, ENGINE_DIR=str(ckpt)))
    with pytest.raises(UsageError, match=r"ENGINE_DIR='.*nowhere' is not allowed: the directory does not exist"):
        locate.resolve(make_settings(tmp_path, ENGINE_DIR=str(tmp_path / "nowhere")))


# --- fingerprint / identity ---------------------------------------------------------------------------------------


def test_content_digest_follows_every_byte_of_every_file(tmp_path):
    path = checkpoint(tmp_path / "m")
    first = content_digest(path, None)
    assert len(first) == 64 and first == content_digest(path, None)
    weights = path / "model.safetensors"
    st = weights.stat()
    weights.write_text("weightS")  # same size, the mtime put back: the bytes still count
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert content_digest(path, None) != first
    write(path / "sub" / "extra.txt", "x")
    assert len({first, content_digest(path, None)}) == 2


def test_the_memo_is_reused_only_while_device_inode_size_mtime_and_ctime_hold(tmp_path, monkeypatch):
    path, memo = checkpoint(tmp_path / "m"), tmp_path / "digests"
    with open(path / "model-00001.safetensors", "wb") as shard:
        shard.truncate(64 << 20)  # sparse: a weight shard
    first = content_digest(path, memo)
    hashed = []
    real = model_digest._hash
    monkeypatch.setattr(model_digest, "_hash", lambda p, state: hashed.append(p.name) or real(p, state))
    assert content_digest(path, memo) == first and hashed == [], "a warm start reads no file"
    with open(path / "model-00001.safetensors", "r+b") as shard:  # 1 MiB rewritten in place, same size
        st = os.fstat(shard.fileno())
        shard.seek(1 << 20)
        shard.write(b"\x01" * (1 << 20))
    os.utime(path / "model-00001.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back
    changed = content_digest(path, memo)
    assert changed != first and hashed == ["model-00001.safetensors"], "ctime gave the change away"


def test_a_memo_another_uid_could_write_is_not_trusted(tmp_path):
    path, memo = checkpoint(tmp_path / "m"), tmp_path / "digests"
    content_digest(path, memo)
    (memo_file,) = memo.glob("*.json")
    record = json.loads(memo_file.read_text())
    for state in record["files"].values():
        state[-1] = "0" * 64  # planted digests
    memo_file.write_text(json.dumps(record))
    os.chmod(memo_file, 0o666)
    assert model_digest.load_memo(memo, path) == {}
    os.chmod(memo_file, 0o600)
    assert model_digest.load_memo(memo, path) == record["files"]


def test_a_fifo_in_the_model_is_refused_not_read(tmp_path):
    path = checkpoint(tmp_path / "m")
    os.mkfifo(path / "model-00002.safetensors")
    with pytest.raises(UsageError, match="expected regular files only"):
        content_digest(path, None)


def test_content_digest_does_not_depend_on_location_or_creation_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root, names in ((a, ["x", "y/z", "w", ".cache/meta"]), (b, ["w", "y/z", "x"])):
        for name in names:
            write(root / name, "12")
    assert content_digest(a, None) == content_digest(b, None)


def test_identity(tmp_path):
    path = checkpoint(tmp_path / "m")
    local = ModelSource("checkpoint", path, None, None, False)
    assert identity(local) == {"content": content_digest(path, None)}
    fetched = ModelSource("checkpoint", path, "org/name", "abc123", True)
    assert identity(fetched) == {"repo_id": "org/name", "revision": "abc123"}
    with pytest.raises(ValueError, match="needs download"):
        identity(ModelSource("hub", None, "org/name", "main", False))


def test_the_same_bytes_at_any_path_share_an_identity_and_a_changed_byte_does_not(tmp_path):
    docker = checkpoint(tmp_path / "models" / "x")
    kserve = tmp_path / "mnt" / "models"
    shutil.copytree(docker, kserve)
    memo = tmp_path / "digests"
    mounted = [ModelSource("checkpoint", p, None, None, False) for p in (docker, kserve)]
    assert identity(mounted[0], memo) == identity(mounted[1], memo)
    weights = next(p for p in sorted(kserve.iterdir()) if p.is_file() and p.stat().st_size > 0)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # same size, one bit changed
    weights.write_bytes(bytes(data))
    assert identity(mounted[0], memo) != identity(mounted[1], memo)


# --- hub_allow_patterns -------------------------------------------------------------------------------------------

LLAMA_FILES = [
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "original/consolidated.00.pth",
    "original/params.json",
    "original/tokenizer.model",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "LICENSE",
    "README.md",
    "USE_POLICY.md",
    ".gitattributes",
]


def test_allow_patterns_llama():
    assert hub_allow_patterns(LLAMA_FILES) == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_allow_patterns_take_the_chat_templates_transformers_reads():
    files = [*LLAMA_FILES, "chat_template.jinja", "additional_chat_templates/tool_use.jinja"]
    files += ["additional_chat_templates/notes.md", "additional_chat_templates/deeper/x.jinja", "other/x.jinja"]
    taken = hub_allow_patterns(files)
    assert "chat_template.jinja" in taken and "additional_chat_templates/tool_use.jinja" in taken
    assert not {"additional_chat_templates/notes.md", "additional_chat_templates/deeper/x.jinja"} & set(taken)
    assert "other/x.jinja" not in taken


def test_allow_patterns_bin_only_without_safetensors():
    files = [
        "config.json",
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json",
        "training_args.bin",
        "tf_model.h5",
        "flax_model.msgpack",
        "model.onnx",
        "model.gguf",
        "tokenizer.model",
        "vocab.json",
        "merges.txt",
        "qwen.tiktoken",
        "tokenization_qwen.py",
    ]
    assert hub_allow_patterns(files) == [
        "config.json",
        "merges.txt",
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json",
        "qwen.tiktoken",
        "tokenization_qwen.py",
        "tokenizer.model",
        "vocab.json",
    ]
    assert "pytorch_model.bin" not in hub_allow_patterns(["config.json", "model.safetensors", "pytorch_model.bin"])


def test_allow_patterns_skip_consolidated_duplicates():
    files = [
        "config.json",
        "consolidated.safetensors",
        "model-00001-of-00003.safetensors",
        "model.safetensors.index.json",
        "params.json",
    ]
    assert hub_allow_patterns(files) == [
        "config.json",
        "model-00001-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    assert hub_allow_patterns(["config.json", "consolidated.safetensors"]) == [
        "config.json",
        "consolidated.safetensors",
    ]


def test_allow_patterns_escape_glob_characters():
    assert hub_allow_patterns(["config.json", "model[1].safetensors"]) == ["config.json", "model[[]1].safetensors"]


# --- download -----------------------------------------------------------------------------------------------------


def hub_source(revision=None):
    return ModelSource(kind="hub", path=None, repo_id="org/model", revision=revision, read_only=False)


def model_info(files, sha="0123abcd" * 5):
    return SimpleNamespace(sha=sha, siblings=[SimpleNamespace(rfilename=f, size=100) for f in files])


def test_download_lists_then_fetches_the_resolved_commit(tmp_path):
    settings = make_settings(tmp_path, HF_TOKEN=TOKEN, MODEL_ID="org/model", MODEL_REVISION="main")
    stream = io.StringIO()
    snapshot = checkpoint(tmp_path / "cache" / "models" / "hub" / "snap")
    with (
        mock.patch("huggingface_hub.HfApi") as api,
        mock.patch("huggingface_hub.snapshot_download", return_value=str(snapshot)) as fetch,
        mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False),
    ):
        api.return_value.model_info.return_value = model_info(LLAMA_FILES)
        result = hub.download(hub_source("main"), settings, Log(stream=stream, secrets=(TOKEN,)))
    api.return_value.model_info.assert_called_once_with("org/model", revision="main", token=TOKEN, files_metadata=True)
    fetch.assert_called_once_with(
        repo_id="org/model",
        revision="0123abcd" * 5,
        token=TOKEN,
        cache_dir=str(tmp_path / "cache" / "models" / "hub"),
        allow_patterns=hub_allow_patterns(LLAMA_FILES),
    )
    assert result == ModelSource(
        kind="checkpoint", path=snapshot, repo_id="org/model", revision="0123abcd" * 5, read_only=True
    )
    assert identity(result) == {"repo_id": "org/model", "revision": "0123abcd" * 5}
    assert f"model fetched repo_id=org/model commit={'0123abcd' * 5}" in stream.getvalue()
    assert TOKEN not in stream.getvalue()


def test_download_offline_uses_the_cached_snapshot(tmp_path):
    settings = make_settings(tmp_path, MODEL_ID="org/model")
    snapshot = checkpoint(tmp_path / "snapshots" / ("f" * 40))
    with (
        mock.patch("huggingface_hub.HfApi") as api,
        mock.patch("huggingface_hub.snapshot_download", return_value=str(snapshot)) as fetch,
        mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", True),
    ):
        result = hub.download(hub_source(), settings, Log(stream=io.StringIO()))
    api.assert_not_called()
    fetch.assert_called_once_with(
        repo_id="org/model", revision=None, token=None, cache_dir=str(tmp_path / "cache" / "models" / "hub")
    )
    assert (result.kind, result.path, result.revision) == ("checkpoint", snapshot, "f" * 40)


def test_download_refuses_a_repo_without_weights_before_fetching(tmp_path):
    with (
        mock.patch("huggingface_hub.HfApi") as api,
        mock.patch("huggingface_hub.snapshot_download") as fetch,
        mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False),
    ):
        api.return_value.model_info.return_value = model_info(["config.json", "model-q4.gguf", "original/x.pth"])
        with pytest.raises(UsageError, match=r"^org/model has no \*.safetensors or \*.bin weights"):
            hub.download(hub_source(), make_settings(tmp_path, MODEL_ID="org/model"), Log(stream=io.StringIO()))
    fetch.assert_not_called()


def test_download_refuses_a_repo_without_a_tokenizer_before_fetching(tmp_path):
    with (
        mock.patch("huggingface_hub.HfApi") as api,
        mock.patch("huggingface_hub.snapshot_download") as fetch,
        mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False),
    ):
        api.return_value.model_info.return_value = model_info(["config.json", "model.safetensors"])
        with pytest.raises(UsageError, match=r"^org/model has no tokenizer files"):
            hub.download(hub_source(), make_settings(tmp_path, MODEL_ID="org/model"), Log(stream=io.StringIO()))
    fetch.assert_not_called()


def test_download_of_a_snapshot_without_a_checkpoint_says_so(tmp_path):
    snapshot = write(tmp_path / "snap" / "model.safetensors", "x").parent
    with (
        mock.patch("huggingface_hub.HfApi") as api,
        mock.patch("huggingface_hub.snapshot_download", return_value=str(snapshot)),
        mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False),
    ):
        api.return_value.model_info.return_value = model_info(["model.safetensors", "tokenizer.json"])
        with pytest.raises(UsageError, match="holds no model that can be served"):
            hub.download(hub_source(), make_settings(tmp_path, MODEL_ID="org/model"), Log(stream=io.StringIO()))


def test_download_leaves_local_sources_alone(tmp_path):
    local = ModelSource("checkpoint", checkpoint(tmp_path / "m"), None, None, False)
    with mock.patch("huggingface_hub.snapshot_download") as fetch:
        assert hub.download(local, make_settings(tmp_path), Log(stream=io.StringIO())) is local
    fetch.assert_not_called()


def _response(status):
    """An HTTP response object of the kind the installed huggingface_hub builds its errors from."""
    for module in ("httpx2", "httpx"):
        try:
            http = __import__(module)
        except ImportError:
            continue
        return http.Response(status, request=http.Request("GET", "https://huggingface.co/api/models/org/model"))
    import requests

    response = requests.Response()
    response.status_code = status
    return response


def _http_error(cls, status):
    return cls(f"{status} Client Error (Authorization: Bearer {TOKEN})", response=_response(status))


@pytest.mark.parametrize(
    "make_error, message, hint, code",
    [
        (
            lambda: _http_error(hub_errors.GatedRepoError, 403),
            "org/model is a gated model",
            "request access on https://huggingface.co/org/model and set HF_TOKEN",
            2,
        ),
        (
            lambda: _http_error(hub_errors.RepositoryNotFoundError, 404),
            "model org/model was not found",
            "check MODEL_ID",
            2,
        ),
        (
            lambda: _http_error(hub_errors.RevisionNotFoundError, 404),
            "revision 'v9' of org/model was not found",
            "check MODEL_REVISION",
            2,
        ),
        (
            lambda: hub_errors.LocalEntryNotFoundError("not cached"),
            "org/model@v9 is not in the local cache",
            "set MODEL_ID to its path",
            1,
        ),
        (
            lambda: ConnectionError("connection refused"),
            "the Hugging Face hub cannot be reached",
            "HF_HUB_OFFLINE=1",
            1,
        ),
        (
            lambda: hub_errors.OfflineModeIsEnabled("offline"),
            "the Hugging Face hub cannot be reached",
            "HF_HUB_OFFLINE=1",
            1,
        ),
        (
            lambda: json.JSONDecodeError("Expecting value", "<html>proxy login</html>", 0),
            "the Hugging Face hub's answer about org/model is not JSON",
            "a proxy or captive portal",
            1,
        ),
        (
            lambda: _http_error(hub_errors.HfHubHTTPError, 500),
            "the Hugging Face hub failed to answer about org/model: HTTP status 500",
            "start again later",
            1,
        ),
        (
            lambda: _http_error(hub_errors.HfHubHTTPError, 401),
            "the Hugging Face hub refused to serve org/model: HTTP status 401",
            "check MODEL_ID, MODEL_REVISION and HF_TOKEN",
            2,
        ),
    ],
)
def test_hub_errors_become_one_line_errors_without_the_token(tmp_path, make_error, message, hint, code):
    settings = make_settings(tmp_path, HF_TOKEN=TOKEN, MODEL_ID="org/model")
    with (
        mock.patch("huggingface_hub.HfApi") as api,
        mock.patch("huggingface_hub.snapshot_download"),
        mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False),
    ):
        api.return_value.model_info.side_effect = make_error()
        with pytest.raises(EntrypointError) as err:
            hub.download(hub_source("v9"), settings, Log(stream=io.StringIO(), secrets=(TOKEN,)))
    # 2: the settings name what does not exist or may not be read; 1: the network or the hub failed.
    assert err.value.exit_code == code
    assert err.value.message.startswith(message) and "\n" not in err.value.message
    assert hint in err.value.hint
    assert err.value.__suppress_context__ and err.value.__cause__ is None
    assert TOKEN not in str(err.value)


def test_an_older_clients_wrapped_http_failure_names_the_status(tmp_path):
    class HTTPError(OSError):  # requests' own, raised by huggingface_hub 0.x once its retries are spent
        response = _response(503)

    def wrapped(*_args, **_kwargs):
        try:
            raise HTTPError("503 Server Error")
        except HTTPError as cause:
            raise hub_errors.LocalEntryNotFoundError("An error happened") from cause

    settings = make_settings(tmp_path, MODEL_ID="org/model")
    with mock.patch("huggingface_hub.HfApi") as api, mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False):
        api.return_value.model_info.side_effect = wrapped
        with pytest.raises(EntrypointError, match="failed to answer about org/model: HTTP status 503") as err:
            hub.download(hub_source(), settings, Log(stream=io.StringIO()))
    assert err.value.exit_code == 1


def test_httpx_style_network_errors_are_recognised_by_name(tmp_path):
    class ConnectError(Exception):
        pass

    settings = make_settings(tmp_path, MODEL_ID="org/model")
    with mock.patch("huggingface_hub.HfApi") as api, mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False):
        api.return_value.model_info.side_effect = ConnectError("dns")
        with pytest.raises(EntrypointError, match="cannot be reached"):
            hub.download(hub_source(), settings, Log(stream=io.StringIO()))


def test_unrelated_errors_are_not_disguised(tmp_path):
    settings = make_settings(tmp_path, MODEL_ID="org/model")
    with mock.patch("huggingface_hub.HfApi") as api, mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False):
        api.return_value.model_info.side_effect = KeyError("bug")
        with pytest.raises(KeyError):
            hub.download(hub_source(), settings, Log(stream=io.StringIO()))


# --- read_config: config.json alone, before any download --------------------------------------------------------


def test_read_config_of_a_hub_model_fetches_that_file_alone(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "phi3"}))
    settings = make_settings(tmp_path, HF_TOKEN=TOKEN, MODEL_ID="org/model")
    with (
        mock.patch("huggingface_hub.hf_hub_download", return_value=str(config)) as fetch,
        mock.patch("huggingface_hub.snapshot_download") as snapshot,
    ):
        assert hub.read_config(hub_source("v9"), settings) == {"model_type": "phi3"}
    fetch.assert_called_once_with(
        "org/model", "config.json", revision="v9", token=TOKEN, cache_dir=str(tmp_path / "cache" / "models" / "hub")
    )
    snapshot.assert_not_called()


def test_read_config_translates_hub_errors_without_the_token(tmp_path):
    settings = make_settings(tmp_path, HF_TOKEN=TOKEN, MODEL_ID="org/model")
    with (
        mock.patch("huggingface_hub.hf_hub_download", side_effect=_http_error(hub_errors.GatedRepoError, 403)),
        pytest.raises(EntrypointError, match="org/model is a gated model") as err,
    ):
        hub.read_config(hub_source(), settings)
    assert TOKEN not in str(err.value) and err.value.__cause__ is None


def test_read_config_of_a_local_checkpoint_names_a_broken_file(tmp_path):
    model = checkpoint(tmp_path / "m")
    local = ModelSource(kind="checkpoint", path=model, repo_id=None, revision=None, read_only=False)
    assert "architectures" in hub.read_config(local, make_settings(tmp_path))
    (model / "config.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match="expected a JSON object, found list"):
        hub.read_config(local, make_settings(tmp_path))


def test_download_progress_reads_finished_and_partial_files_from_the_hub_cache(tmp_path):
    snapshot, blobs = tmp_path / "snapshots" / "c0ffee", tmp_path / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    (snapshot / "config.json").write_text("x" * 100)  # downloaded before: no part of the rate
    known = hub.DownloadProgress(tmp_path, "c0ffee", {"config.json": 100, "model.safetensors": 900})
    (blobs / "0123.incomplete").write_bytes(b"w" * 400)  # the weights, in flight
    assert known.fields(2.0) == {
        "files": "1/2",
        "bytes": "500B/1.0KB",
        "percent": 50.0,
        "rate": "200B/s",
        "eta_s": 2,
    }
    # A file list without sizes: what is on disk, without a total, percent or ETA that would be made up.
    unknown = hub.DownloadProgress(tmp_path, "c0ffee", {"config.json": None, "model.safetensors": None})
    assert unknown.fields(2.0) == {"files": "1/2", "bytes": "500B", "rate": "0B/s"}


def test_the_hub_probe_asks_the_endpoint_the_settings_name_and_describe_masks_a_mirrors_password(tmp_path):
    default = make_settings(tmp_path, MODEL_ID="org/model")
    mirror = make_settings(tmp_path, MODEL_ID="org/model", HF_ENDPOINT="https://user:s3cret@mirror.example/hf/")
    assert default.hub_endpoint == "https://huggingface.co"
    assert mirror.hub_endpoint == "https://user:s3cret@mirror.example/hf"
    assert "s3cret" not in repr(mirror) and "s3cret" not in json.dumps(mirror.describe())
    assert mirror.describe()["hub_endpoint"] == "https://***@mirror.example/hf"
