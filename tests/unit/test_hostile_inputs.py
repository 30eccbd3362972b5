"""Hostile values that reach a parser, a path or another UID's reach: keys that look like options, fixed names under a
shared TMPDIR, hub answers, group settings."""

from __future__ import annotations

import io
import json
import os
import shlex
import stat
import tempfile
from pathlib import Path

import pytest

from harness import image_data
from harness.fake_hub import FakeHub
from harness.image import Image, templates_for
from trtllm_entrypoint import main
from trtllm_entrypoint.config import settings as settings_mod
from trtllm_entrypoint.config.credentials import generated_key
from trtllm_entrypoint.config.settings import Settings
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.launch import argv as launch
from trtllm_entrypoint.launch import group, health
from trtllm_entrypoint.model import hub_answer
from trtllm_entrypoint.storage import paths, trust

OPENAI_FACTS = image_data.image_facts("25.09")


@pytest.fixture(autouse=True)
def writable_default_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(settings_mod.contract, "DEFAULT_CACHE_DIR", str(tmp_path / "cache"))


def test_generated_keys_never_look_like_an_option():
    keys = [generated_key() for _ in range(5000)]
    assert not any(key.startswith("-") for key in keys)
    assert len(set(keys)) == len(keys) and all(len(key) >= 32 for key in keys)


OPENAI = {"FRONTEND": "openai", "MODEL_ID": "org/model", "WORKFLOW": "engine"}


def launch_words(env: dict[str, str]) -> tuple[Settings, list[str]]:
    """Every word the launch passes: tritonserver's (or mpirun's) and, with FRONTEND=openai, one front worker's."""
    settings = Settings.from_env(env, OPENAI_FACTS)
    argv = launch.server_argv(settings, OPENAI_FACTS, Path("/repo"), settings.world_size, uid=1)
    if settings.frontend == "openai":
        argv += launch.front_argv("python3")
    return settings, argv


@pytest.mark.parametrize("key", [None, "-starts-with-a-dash-0123", "--looks-like-a-flag-0123"])
@pytest.mark.parametrize("env", [OPENAI, {"TP_SIZE": "2"}, {}], ids=["openai", "mpirun", "triton"])
def test_no_launch_word_is_a_secret_or_reads_as_an_option_it_is_not(env, key):
    """Every argument the launch gives is an option (`--name`, `--name=value`, mpirun's -n/-x, python's -m) or a
    plain value; the admin key, generated or given (a given one may start with '-'), is only ever inside one
    `--flag=…` word, which no parser splits, and never in the OpenAI front's command line (its environment has it)."""
    for _ in range(50 if key is None else 1):  # generated keys: token_urlsafe gave one starting with '-' 1 in 64
        settings, argv = launch_words({**env, **({"TRITON_ADMIN_KEY": key} if key else {})})
        for word in argv:
            if settings.admin_key in word:
                assert word.startswith("--") and "=" in word and word.endswith(f"admin-key={settings.admin_key}")
            elif word.startswith("-"):
                assert word.startswith("--") or word in ("-n", "-x", "-m"), shlex.join(argv)
        front = argv[argv.index("trtllm_entrypoint.openai") :] if "trtllm_entrypoint.openai" in argv else []
        assert not any(settings.admin_key in word for word in front)
        assert front in ([], ["trtllm_entrypoint.openai"]), "the front's settings come in its environment, one value"


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    shared = tmp_path / "shared-tmp"
    shared.mkdir(mode=0o1777)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    paths.state_dir.cache_clear()
    yield shared
    paths.state_dir.cache_clear()
    tempfile.tempdir = None


def test_state_lives_in_a_new_private_directory_never_at_a_fixed_name(tmpdir_env, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    # what an earlier version used, planted as links into a directory the other UID reads
    for name in ("trtllm-mpi-ssh", "trtllm-entrypoint", f"trtllm-entrypoint-{os.geteuid()}"):
        (tmpdir_env / name).symlink_to(victim)
    state = paths.state_dir()
    assert state.parent == tmpdir_env and not state.is_symlink()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and state.stat().st_uid == os.geteuid()
    health.record_health_url("http://127.0.0.1:8000/v2/health/ready")
    files = main.ssh_files()
    assert files.directory.parent == state
    assert list(victim.iterdir()) == []
    assert health.recorded_health_url() == "http://127.0.0.1:8000/v2/health/ready"


def test_ssh_keys_are_copied_into_the_private_state_directory(tmpdir_env, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nk\n-----END OPENSSH PRIVATE KEY-----\n")
    (secret / "id_ed25519.pub").write_text("ssh-ed25519 AAAA group\n")
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmpdir_env / "trtllm-mpi-ssh").symlink_to(victim)
    installed = group.install_ssh_files(secret, main.ssh_files().directory)
    assert installed.key.read_text().startswith("-----BEGIN") and list(victim.iterdir()) == []
    assert paths.is_private(installed.directory.parent, directory=True)


@pytest.mark.parametrize(
    "plant",
    [
        "link_to_other_file",  # a link named health.json in a directory of ours
        "open_directory",  # a state directory that group or others may write
        "foreign_url",  # a URL that is not the loopback server's
    ],
)
def test_health_reads_only_its_own_private_record(tmpdir_env, tmp_path, plant):
    directory = tmpdir_env / f"{paths.state_prefix()}planted"
    directory.mkdir(mode=0o700)
    record = json.dumps({"url": "http://127.0.0.1:1/ready"})
    if plant == "link_to_other_file":
        other = tmp_path / "other.json"
        other.write_text(record)
        (directory / health.HEALTH_FILE).symlink_to(other)
    elif plant == "open_directory":
        (directory / health.HEALTH_FILE).write_text(record)
        directory.chmod(0o777)
    else:
        (directory / health.HEALTH_FILE).write_text(json.dumps({"url": "http://evil.example:80/ok"}))
    assert health.recorded_health_url() is None


def test_serve_never_writes_through_a_planted_health_file(tmpdir_env, tmp_path):
    target = tmp_path / "victims-file"
    target.write_text("precious")
    (tmpdir_env / "trtllm-entrypoint").mkdir()
    (tmpdir_env / "trtllm-entrypoint" / "health.json").symlink_to(target)
    health.record_health_url("http://127.0.0.1:8000/v2/health/ready")
    assert target.read_text() == "precious"


def test_health_against_a_planted_ready_server_reports_unhealthy_with_no_server(tmpdir_env, tmp_path):
    """A planted record pointing at a server another UID runs must not make `health` pass."""
    import http.server
    import threading

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        planted = tmpdir_env / "trtllm-entrypoint"
        planted.mkdir()
        (planted / "health.json").write_text(json.dumps({"url": f"http://127.0.0.1:{server.server_address[1]}/"}))
        planted.chmod(0o777)
        assert health.health({"HTTP_PORT": "1"}) == 1
    finally:
        server.shutdown()
        server.server_close()


def test_the_fallback_cache_is_per_uid_and_refused_when_not_this_uids(tmpdir_env, monkeypatch, tmp_path):
    monkeypatch.setattr(settings_mod, "_writable", lambda path: False)  # a read-only root file system
    settings = Settings.from_env({}, image_data.FACTS)
    assert settings.cache_dir == tmpdir_env / f"trtllm-cache-{os.geteuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    settings.cache_dir.symlink_to(elsewhere)
    with pytest.raises(UsageError, match="was not created by this UID"):
        Settings.from_env({}, image_data.FACTS)
    if os.geteuid() == 0:  # root can play the other UID
        settings.cache_dir.unlink()
        settings.cache_dir.mkdir()
        os.chown(settings.cache_dir, 4242, 4242)
        with pytest.raises(UsageError, match="was not created by this UID"):
            Settings.from_env({}, image_data.FACTS)


# --- the hub's answers --------------------------------------------------------------------------------------------

HUB_FILES = {
    "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode(),
    "tokenizer.json": b"{}",
    "model.safetensors": b"weights" * 100,
}
INFO = {"id": "org/model", "sha": FakeHub.COMMIT, "siblings": [{"rfilename": name} for name in HUB_FILES]}


def model_api(body: object, status: int = 200, headers: dict[str, str] | None = None):
    def answer(path: str):
        if not path.startswith("/api/models/org/model"):
            return None
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return status, {"Content-Type": "application/json", **(headers or {})}, data

    return answer


def config_file(status: int, headers: dict[str, str], body: bytes = HUB_FILES["config.json"]):
    def answer(path: str):
        return (status, headers, body) if path.startswith("/org/model/resolve/") else None

    return answer


HOSTILE = {
    "config.json commit climbing out": config_file(
        200, {"X-Repo-Commit": "../../../../outside/planted", "ETag": '"abc"'}
    ),
    "config.json bare 302": config_file(302, {}, b""),
    "config.json without headers": config_file(200, {}),
    "sha climbing out of the cache": model_api({**INFO, "sha": "../../../../outside/planted"}),
    "sha forging a log line": model_api({**INFO, "sha": FakeHub.COMMIT + "\n[trtllm-entrypoint] info: ready"}),
    "sha in upper case": model_api({**INFO, "sha": FakeHub.COMMIT.upper()}),
    "numeric sha": model_api({**INFO, "sha": 1234}),
    "sha as an object": model_api({**INFO, "sha": {"a": 1}}),
    "non-string rfilename": model_api({**INFO, "siblings": [{"rfilename": 7}, {"rfilename": "config.json"}]}),
    "rfilename climbing out": model_api({**INFO, "siblings": [*INFO["siblings"], {"rfilename": "../../x.py"}]}),
    "rfilename with a newline": model_api({**INFO, "siblings": [*INFO["siblings"], {"rfilename": "a\nb.json"}]}),
    "siblings as an object": model_api({**INFO, "siblings": {"rfilename": "config.json"}}),
    "sibling as a string": model_api({**INFO, "siblings": ["config.json"]}),
    "negative size": model_api({**INFO, "siblings": [{"rfilename": "model.safetensors", "size": -1}]}),
    "a list where an object belongs": model_api([INFO]),
    "a bare string": model_api("hello"),
    "a bare 302 without Location": model_api(b"", status=302),
    "a 302 to nowhere": model_api(b"", status=302, headers={"Location": "::::"}),
    "HTML instead of JSON": model_api(b"<html>login</html>"),
}


@pytest.mark.process
@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_hub_answer_is_one_error_line_and_nothing_outside_the_cache(tmp_path, case):
    pytest.importorskip("huggingface_hub")
    hub = FakeHub("org/model", HUB_FILES, override=HOSTILE[case])
    try:
        image = Image(tmp_path, "25.01", templates_for("v0.17.0"))
        result = image.run("prepare", MODEL_ID="org/model", HF_ENDPOINT=hub.url, HF_HUB_DISABLE_TELEMETRY="1")
    finally:
        hub.close()
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "ready" not in result.stderr.replace(errors[0], "")
    outside = [p for p in tmp_path.rglob("*") if "planted" in p.name or p.name == "x.py"]
    assert outside == []
    assert not list((tmp_path / "outside").glob("*")) if (tmp_path / "outside").exists() else True
    forged = [line for line in result.stderr.splitlines() if line.startswith("[trtllm-entrypoint] info: ready")]
    assert forged == []


@pytest.mark.parametrize("name", ["config.json", "tokenizer.model", "sub/dir/file.bin", "a b.json"])
def test_plain_file_names_from_the_hub_are_taken(name):
    assert hub_answer.file_name(name)


@pytest.mark.parametrize("name", ["", "/etc/passwd", "../x", "a/../b", "a//b", "a\\b", "x\n", ".", 5, None])
def test_file_names_that_leave_the_snapshot_are_refused(name):
    assert not hub_answer.file_name(name)


# --- a shared cache another UID controls --------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing another UID needs root (chown)")


def repository_plan():
    from harness.upstream_files import upstream_path
    from trtllm_entrypoint.repository import fill as filling

    root = upstream_path("tensorrt_llm/triton_backend/all_models")
    settings = Settings.from_env({"CACHE_DIR": "/var/cache/trtllm"}, image_data.FACTS)
    values = filling.fill_values(settings, image_data.FACTS, Path("/e"), Path("/t"))
    return filling.plan_fill(root, values, settings=settings), root


@needs_root
@pytest.mark.parametrize("mode", [0o1777, 0o755, 0o777])
def test_a_repositories_directory_of_another_uid_never_holds_the_served_repository(tmp_path, tmpdir_env, mode):
    from trtllm_entrypoint.log import Log
    from trtllm_entrypoint.repository import write as repository

    plan, templates = repository_plan()
    cache = tmp_path / "cache"
    shared = cache / "repositories"
    shared.mkdir(parents=True)
    os.chown(shared, 4242, 4242)
    shared.chmod(mode)
    served, _ = repository.write_cached(plan, shared, templates, Log(stream=io.StringIO()), timeout_s=5)
    assert shared not in served.parents
    assert served.parent == cache / f"repositories.uid{os.geteuid()}"
    for directory in (served, *served.parents):
        if directory == cache:
            break
        assert trust.renamable(directory.parent) is None
    again, written = repository.write_cached(plan, shared, templates, Log(stream=io.StringIO()), timeout_s=5)
    assert (again, written) == (served, False)
    # the cache itself another UID's: only this process's private state directory is safe
    os.chown(cache, 4242, 4242)
    served, _ = repository.write_cached(plan, shared, templates, Log(stream=io.StringIO()), timeout_s=5)
    assert paths.state_dir() in served.parents


@needs_root
def test_a_planted_private_root_is_not_used(tmp_path, tmpdir_env):
    cache = tmp_path / "cache"
    (cache / "repositories").mkdir(parents=True)
    os.chown(cache / "repositories", 4242, 4242)
    planted = cache / f"repositories.uid{os.geteuid()}"
    planted.mkdir()
    os.chown(planted, 4242, 4242)
    assert paths.state_dir() in trust.private_root(cache / "repositories").parents


def test_renamable_names_what_lets_another_uid_move_entries(tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o755)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(closed)
    assert trust.renamable(closed) is None and trust.renamable(sticky) is None
    assert "not sticky" in trust.renamable(open_dir)
    assert "symbolic link" in trust.renamable(link)


# --- group settings -----------------------------------------------------------------------------------------------

LWS = {"LWS_LEADER_ADDRESS": "llm-0.llm.default", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"}


@pytest.mark.parametrize(
    "address",
    [
        "-oProxyCommand=sh",
        "llm-0.llm.default,evil.example",
        "llm-0\nevil",
        "llm-0.llm default",
        "-llm.default",
        "llm-.default",
        "llm_0.default",
        "llm-0.llm.default:22",
        "a" * 64 + ".default",
        ".".join(["a" * 60] * 5),
        "llm-0.llm.default.",
        "user@llm-0",
        "llm-0;reboot",
    ],
)
def test_a_leader_address_that_is_not_a_host_never_reaches_mpirun(address):
    with pytest.raises(UsageError, match="LWS_LEADER_ADDRESS=.* is not a DNS name or an IP address"):
        group.group_from_env({**LWS, "LWS_LEADER_ADDRESS": address})


@pytest.mark.parametrize("address", ["llm-0.llm.default", "10.0.0.7", "fd00::7", "LLM-0.Team-A.svc"])
def test_dns_names_and_ip_addresses_are_leader_addresses(address):
    assert group.group_from_env({**LWS, "LWS_LEADER_ADDRESS": address}).leader_address == address


@pytest.mark.process
def test_the_openai_frontend_in_a_multi_pod_group_is_refused_before_any_download(tmp_path):
    pytest.importorskip("huggingface_hub")
    hub = FakeHub("org/model", HUB_FILES)
    try:
        image = Image(tmp_path, "25.09", None)
        for command in ("serve", "prepare"):
            result = image.run(
                command,
                MODEL_ID="org/model",
                HF_ENDPOINT=hub.url,
                FRONTEND="openai",
                WORKFLOW="engine",
                TP_SIZE="2",
                NVIDIA_VISIBLE_DEVICES="0",
                **LWS,
            )
            assert result.returncode == 2, result.stderr
            errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and "FRONTEND=openai cannot serve a multi-pod group" in errors[0]
            assert "FRONTEND=triton" in result.stderr
    finally:
        hub.close()
    assert hub.requests == []
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*.json"))


@needs_root
def test_an_engines_directory_of_another_uid_never_holds_the_served_engine(tmp_path, tmpdir_env):
    from trtllm_entrypoint.engine.cache import EngineCache
    from trtllm_entrypoint.log import Log

    def build(out: Path, _log: Path) -> None:
        (out / "config.json").write_text(json.dumps({"pretrained_config": {"mapping": {"world_size": 1}}}))
        (out / "rank0.engine").write_bytes(b"engine")

    cache = tmp_path / "cache"
    engines = cache / "engines"
    engines.mkdir(parents=True)
    os.chown(engines, 4242, 4242)
    engines.chmod(0o1777)
    served, built = EngineCache(engines).ensure("k" * 20, {}, build, timeout_s=5, log=Log(stream=io.StringIO()))
    assert built and engines not in served.parents
    assert served.parent == cache / f"engines.uid{os.geteuid()}" and (served / "rank0.engine").read_bytes() == b"engine"
    again, built = EngineCache(engines).ensure("k" * 20, {}, build, timeout_s=5, log=Log(stream=io.StringIO()))
    assert (again, built) == (served, False)
