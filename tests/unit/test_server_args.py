"""The one flag table and its parser: getopt_long's rules (as tritonserver 2.51 applies them, measured in
test_real_triton_flags.py), reservation, side doors and the completion of a typed restriction."""

from __future__ import annotations

import pytest

from trtllm_entrypoint.config import server_args
from trtllm_entrypoint.config.server_args import TRITONSERVER, parse_options, resolve
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.launch import argv as launch


def names(table):
    return [flag.name for flag in table]


@pytest.mark.parametrize("table", [TRITONSERVER])
def test_each_program_lists_each_flag_once(table):
    assert len(set(names(table))) == len(table)
    assert all(name.startswith("--") and name == name.lower() for name in names(table))


@pytest.mark.parametrize(
    "given, meant",
    [
        ("--model-repo", "--model-repository"),
        ("--model-st", "--model-store"),
        ("--model-repository", "--model-repository"),
        ("--http-restricted", "--http-restricted-api"),
        ("--grpc-restricted-p", "--grpc-restricted-protocol"),
        ("--http-p", "--http-port"),
        ("--grpc-use-ssl", "--grpc-use-ssl"),  # exact wins over the longer --grpc-use-ssl-mutual
        ("--allow-s", "--allow-sagemaker"),
        ("--disable", "--disable-auto-complete-config"),
    ],
)
def test_any_unique_prefix_is_its_option(given, meant):
    flag = resolve(given, TRITONSERVER)
    assert flag is not None and flag.name == meant


@pytest.mark.parametrize("given", ["--model", "--model-", "--http", "--allow", "--grpc-use", "--log"])
def test_an_ambiguous_prefix_is_refused_naming_the_candidates(given):
    with pytest.raises(UsageError, match=f"'{given}' is ambiguous") as error:
        resolve(given, TRITONSERVER)
    assert len(error.value.message.split(", ")) >= 2


def test_names_the_table_does_not_know_are_kept_as_given():
    assert resolve("--no-such-flag", TRITONSERVER) is None
    assert [o.flag for o in parse_options(["--no-such-flag=1", "positional", "-x"])] == [None, None, None]


def test_a_flag_with_a_value_takes_the_next_argument_whatever_it_looks_like():
    options = parse_options(["--log-file", "--model-store=/x", "--model-repo", "/m"])
    assert [(o.flag.name if o.flag else None, o.value) for o in options] == [
        ("--log-file", "--model-store=/x"),
        ("--model-repository", "/m"),
    ]
    assert server_args.found(options, "--model-repository")[0].indexes() == (2, 3)


def test_a_flag_without_a_value_refuses_one_and_a_missing_value_is_refused():
    with pytest.raises(UsageError, match="takes no value"):
        parse_options(["--disable-auto-complete-config=1"])
    with pytest.raises(UsageError, match="--http-port needs a value"):
        parse_options(["--http-p"])


def test_after_a_double_dash_everything_is_positional():
    options = parse_options(["--id=a", "--", "--model-repository=/x"])
    assert [o.flag for o in options[1:]] == [None]


def test_store_and_repository_are_one_option():
    options = parse_options(["--model-store=/a", "--model-repo=/b"])
    assert [o.value for o in server_args.found(options, "--model-repository")] == ["/a", "/b"]


@pytest.mark.parametrize(
    "argv, repository, ports",
    [
        (["tritonserver", "--model-repo=/m", "--http-p=8080"], "/m", {"http_port": 8080}),
        (["tritonserver", "--model-st", "/m", "--grpc-p", "9000"], "/m", {"grpc_port": 9000}),
        (["tritonserver", "--log-file", "--model-store=/x", "--model-repository=/m"], "/m", {}),
    ],
)
def test_passthrough_and_rewriting_read_the_command_as_tritonserver_does(argv, repository, ports):
    given = launch.parse_passthrough(argv)
    assert str(given.repository) == repository and given.ports() == ports
    rewritten = launch.rewrite_repository(argv, "/new")
    assert launch.parse_passthrough(rewritten).repository.as_posix() == "/new"
    assert [a for a in rewritten if "/new" not in a] == [a for a in argv if repository not in a]


def test_restriction_typed_for_one_protocol_is_completed_with_the_same_groups_and_key():
    typed = ["--http-restricted=logging:admin-key=K1", "--http-restricted-api", "trace:admin-key=K2"]
    assert server_args.completed_restriction(parse_options(typed)) == [
        "--grpc-restricted-protocol=logging:admin-key=K1",
        "--grpc-restricted-protocol=trace:admin-key=K2",
    ]
    both = ["--http-restricted-api=logging:admin-key=K1", "--grpc-restricted-p=logging:admin-key=K3"]
    assert server_args.completed_restriction(parse_options(both)) == []
    keys = launch.parse_passthrough(["tritonserver", *typed]).restriction_keys
    assert keys == ("K1", "K2")


@pytest.mark.parametrize(
    "args, environ, doors",
    [
        (["--allow-sagemaker=true"], {}, ["--allow-sagemaker=true"]),
        (["--allow-sag", "on"], {}, ["--allow-sag=on"]),
        (["--allow-vertex-ai=1", "--vertex-ai-port=1"], {}, ["--allow-vertex-ai=1"]),
        (["--allow-sagemaker=false", "--allow-vertex-ai=OFF"], {}, []),
        ([], {"AIP_MODE": "PREDICTION"}, ["AIP_MODE=PREDICTION in the environment (without --allow-vertex-ai=false)"]),
        (["--allow-vertex-ai=false"], {"AIP_MODE": "PREDICTION"}, []),
        (["--allow-http=true", "--model-control-mode=explicit", "--load-model=*"], {}, []),
    ],
)
def test_side_doors_are_found_however_they_are_spelled(args, environ, doors):
    assert server_args.side_doors(args, environ) == doors


def test_every_side_door_names_a_feature_recorded_with_its_source():
    from trtllm_images import capabilities

    features = capabilities.load_capabilities().features
    recorded = {flag.side_door for flag in server_args.TRITONSERVER if flag.side_door}
    recorded |= {feature for *_, feature in server_args.SIDE_DOOR_VARIABLES}
    assert recorded and recorded <= set(features)
