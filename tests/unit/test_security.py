"""Restricted APIs: RESTRICTED_APIS and the admin key in, tritonserver flags and start-up warnings out."""

from dataclasses import replace
from pathlib import Path

import pytest

from harness import image_data
from trtllm_entrypoint import contract
from trtllm_entrypoint.config import credentials
from trtllm_entrypoint.config import settings as settings_mod
from trtllm_entrypoint.config.records import CommandLine
from trtllm_entrypoint.config.settings import Settings
from trtllm_entrypoint.config.variables import SECRET_FILE_LIMIT, VARIABLES
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.launch import argv as launch
from trtllm_entrypoint.launch import security

FACTS = replace(image_data.FACTS, features=("restricted_apis",))
KEY = "k3y-0123456789abcdef"
DEFAULT_FLAGS = [
    f"--http-restricted-api=shared-memory,model-repository,statistics,trace,logging:admin-key={KEY}",
    f"--grpc-restricted-protocol=shared-memory,model-repository,statistics,trace,logging:admin-key={KEY}",
]


@pytest.fixture(autouse=True)
def writable_default_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(settings_mod.contract, "DEFAULT_CACHE_DIR", str(tmp_path / "cache"))


def load(facts=FACTS, **env):
    return Settings.from_env(env, facts)


def test_by_default_the_admin_apis_are_closed_with_a_random_key_per_start():
    first, second = load(), load()
    assert first.restricted_apis == VARIABLES["RESTRICTED_APIS"].default
    assert first.admin_key_generated and len(first.admin_key) >= 32
    assert first.admin_key != second.admin_key
    assert security.restriction(first, FACTS).argv() == [flag.replace(KEY, first.admin_key) for flag in DEFAULT_FLAGS]


def test_the_key_comes_from_the_environment_or_a_file(tmp_path):
    assert load(TRITON_ADMIN_KEY=KEY).admin_key == KEY
    key_file = tmp_path / "key"
    key_file.write_text(f"  {KEY}\n")
    from_file = load(TRITON_ADMIN_KEY_FILE=str(key_file))
    assert (from_file.admin_key, from_file.admin_key_generated) == (KEY, False)
    assert security.restriction(from_file, FACTS).argv() == DEFAULT_FLAGS


@pytest.mark.parametrize(
    "env,expected",
    [
        (
            {"TRITON_ADMIN_KEY": "short"},
            "TRITON_ADMIN_KEY is not allowed (the value is not shown): expected 16 to 4096",
        ),
        ({"TRITON_ADMIN_KEY": "with space inside 0123456789"}, "TRITON_ADMIN_KEY is not allowed"),
        ({"TRITON_ADMIN_KEY": 'quote"0123456789abcdef'}, "TRITON_ADMIN_KEY is not allowed"),
        (
            {"TRITON_ADMIN_KEY": KEY, "TRITON_ADMIN_KEY_FILE": "/x"},
            "TRITON_ADMIN_KEY and TRITON_ADMIN_KEY_FILE are both",
        ),
    ],
)
def test_bad_keys_are_one_line_without_the_key(env, expected):
    with pytest.raises(UsageError) as error:
        load(**env)
    assert error.value.message.startswith(expected)
    assert env["TRITON_ADMIN_KEY"] not in error.value.message + error.value.hint


def test_key_files_are_read_strictly(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"a" * (SECRET_FILE_LIMIT + 1))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff" * 20)
    for path, allowed in (
        (big, "at most 65536 bytes"),
        (empty, "the file is empty"),
        (binary, "ASCII text"),
        (tmp_path, "a regular file"),
        (tmp_path / "missing", "No such file"),
    ):
        with pytest.raises(UsageError, match="TRITON_ADMIN_KEY_FILE=") as error:
            load(TRITON_ADMIN_KEY_FILE=str(path))
        assert allowed in error.value.message


def test_restricted_apis_changes_the_list():
    custom = load(RESTRICTED_APIS=" Logging, trace ,logging", TRITON_ADMIN_KEY=KEY)
    assert custom.restricted_apis == ("logging", "trace")
    assert security.restriction(custom, FACTS).argv() == [
        f"--http-restricted-api=logging,trace:admin-key={KEY}",
        f"--grpc-restricted-protocol=logging,trace:admin-key={KEY}",
    ]
    opened = load(RESTRICTED_APIS="none")
    assert opened.restricted_apis == () and security.restriction(opened, FACTS).argv() == []


@pytest.mark.parametrize("value", ["health", "logging,bogus", "none,logging", ""])
def test_unknown_api_names_are_one_line_naming_the_allowed_ones(value):
    if not value:
        # empty counts as unset
        assert load(RESTRICTED_APIS=value).restricted_apis == VARIABLES["RESTRICTED_APIS"].default
        return
    with pytest.raises(UsageError) as error:
        load(RESTRICTED_APIS=value)
    message = error.value.message
    assert message.startswith(f"RESTRICTED_APIS={value!r} is not allowed: expected 'none' or a comma-separated")
    assert "shared-memory" in message and "\n" not in message


def test_closing_what_clients_need_requires_a_key():
    with pytest.raises(UsageError, match="closes inference but no TRITON_ADMIN_KEY"):
        load(RESTRICTED_APIS="logging,inference")
    assert load(RESTRICTED_APIS="logging,inference", TRITON_ADMIN_KEY=KEY).restricted_apis == ("logging", "inference")


@pytest.mark.parametrize("args", ["--http-restricted-api=logging:k=v", "--log-verbose=1 --grpc-restricted-protocol x"])
def test_triton_args_cannot_undo_the_restriction(args):
    with pytest.raises(UsageError) as error:
        load(TRITON_ARGS=args)
    assert "TRITON_ARGS may not contain '--" in error.value.message and "RESTRICTED_APIS" in error.value.hint


def test_the_key_is_hidden_in_repr_and_describe():
    settings = load(TRITON_ADMIN_KEY=KEY)
    assert KEY not in repr(settings)
    assert settings.describe()["admin_key"] == "***"
    assert KEY not in str(settings.describe())


def test_secrets_for_masking_include_the_admin_key(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    assert credentials.token_values({"TRITON_ADMIN_KEY": KEY}) == (KEY,)
    assert credentials.token_values({"TRITON_ADMIN_KEY_FILE": str(key_file), "HF_TOKEN": "hf_x"}) == ("hf_x", KEY)


def test_only_rank_0_gets_the_flags_and_triton_args_come_last():
    settings = load(TRITON_ADMIN_KEY=KEY, TP_SIZE="2", TRITON_ARGS="--log-verbose=1")
    argv = launch.server_argv(settings, FACTS, Path("/repo"), 2, uid=1000)
    rank0, rank1 = " ".join(argv).split(" : ")
    assert rank0.split()[-3:] == [*DEFAULT_FLAGS, "--log-verbose=1"]
    assert "restricted" not in rank1 and "--allow-http=false" in rank1
    assert argv[0] == "mpirun" and contract.TRITONSERVER in rank0


@pytest.mark.parametrize(
    "facts,env,warning",
    [
        (FACTS, {"RESTRICTED_APIS": "none"}, "RESTRICTED_APIS=none: every Triton API"),
        (
            FACTS,
            {"FRONTEND": "openai", "MODEL_ID": "m", "RESTRICTED_APIS": "none"},
            "RESTRICTED_APIS=none: every Triton",
        ),
        (replace(FACTS, features=()), {}, "tritonserver 2.58.0 in image 25.05 cannot restrict APIs"),
    ],
)
def test_what_stays_open_is_a_warning_and_gets_no_flags(facts, env, warning):
    settings = load(facts, **env)
    (message,) = security.start_warnings(settings, facts)
    assert message.startswith(warning)
    assert security.restriction(settings, facts).argv() == []


def test_no_warning_when_restricted():
    assert security.start_warnings(load(), FACTS) == []


def test_a_command_line_that_restricts_apis_itself_gets_no_warning():
    own = replace(load(RESTRICTED_APIS="none"), triton_args=("--http-restricted-api=logging:k=v",))
    assert security.start_warnings(own, FACTS) == []


@pytest.mark.parametrize(
    "env",
    [
        {"TRITON_ARGS": "--allow-sagemaker=true --sagemaker-port=8090 --model-control-mode=explicit"},
        {"TRITON_ARGS": "--allow-sag true"},
        {"TRITON_ARGS": "--allow-vertex-ai=1"},
        {"AIP_MODE": "PREDICTION"},
    ],
)
def test_routes_around_the_restriction_are_refused_unless_every_api_is_open(env):
    with pytest.raises(UsageError, match="opens a route around the API restriction") as error:
        load(**env)
    assert error.value.exit_code == 2 and "RESTRICTED_APIS=none" in error.value.hint
    assert load(**env, RESTRICTED_APIS="none").restricted_apis == ()


def test_a_side_door_given_as_server_arguments_is_refused_too():
    line = CommandLine(server_args=("--allow-vertex=true",))
    with pytest.raises(UsageError, match="--allow-vertex=true"):
        Settings.from_env({"CACHE_DIR": "/tmp/c"}, FACTS, line)
    closed = CommandLine(server_args=("--allow-vertex-ai=false",))
    assert Settings.from_env({"AIP_MODE": "PREDICTION", "CACHE_DIR": "/tmp/c"}, FACTS, closed).triton_args


@pytest.mark.parametrize(
    "apis,closed",
    [(None, ()), ("inference,model-repository", ("inference",)), ("metadata,inference", ("inference", "metadata"))],
)
def test_the_openai_fronts_routes_close_with_the_same_groups_as_triton(apis, closed):
    """/v1/models tells what Triton's model metadata tells; completions and chat are inference."""
    env = {"FRONTEND": "openai", "TRITON_ADMIN_KEY": KEY} | ({"RESTRICTED_APIS": apis} if apis else {})
    assert security.front_restricted(load(**env)) == closed
