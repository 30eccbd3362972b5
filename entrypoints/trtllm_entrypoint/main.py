"""`trtllm-entrypoint`: from environment variables to a tritonserver running in the foreground.

Like postgres' docker-entrypoint.sh: parse the settings once, run small idempotent steps (each skipped when its output
is already valid), and `exec` the server at the end so that it receives the container's signals.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from trtllm_entrypoint.config import gpu, server_args
from trtllm_entrypoint.config.credentials import check_typed_keys, token_values
from trtllm_entrypoint.config.image_facts import ImageFacts, installation, load_facts
from trtllm_entrypoint.config.records import CommandLine
from trtllm_entrypoint.config.settings import Settings, all_apis_open, side_door_variables
from trtllm_entrypoint.engine import config as engine_config
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.inspection import flags as flagcheck
from trtllm_entrypoint.inspection import probe
from trtllm_entrypoint.inspection.check import check
from trtllm_entrypoint.launch import argv as launch
from trtllm_entrypoint.launch import group, lora, preflight, ready, serve_files, supervise
from trtllm_entrypoint.launch import plan as serve_plan
from trtllm_entrypoint.launch.group import group_from_env
from trtllm_entrypoint.launch.health import health, health_url, record_health_url
from trtllm_entrypoint.launch.plan import Located, ServePlan
from trtllm_entrypoint.launch.prepare import Prepared, prepare, ssh_files
from trtllm_entrypoint.log import Log, capture_stderr, release_stderr, retarget_stderr
from trtllm_entrypoint.model import hub, locate
from trtllm_entrypoint.model import support as models
from trtllm_entrypoint.storage.paths import under_model_dir

SUBCOMMANDS = ("serve", "prepare", "build-engine", "check", "probe", "health", "flags")
USAGE = (
    "usage: trtllm-entrypoint [serve|prepare|build-engine|check|probe|health|flags] "
    "| trtllm-entrypoint <command> [args…] (runs the command, e.g. tritonserver …)"
)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if environ is None else environ)
    # From here on every line on stderr, ours or a library's, is masked (and JSON with LOG_FORMAT=json).
    capture_stderr(early_log(env))
    try:
        code = run(args, env)
    except EntrypointError as exc:
        fail(env, exc.message, exc.hint, exc.exit_code)
    except OSError as exc:  # a file system the user gave us (read-only, full, not ours): say which, no traceback
        if exc.filename:
            hint = (
                "check that CACHE_DIR (and REPOSITORY_DIR) is a writable directory with free space, and that the "
                "model directory is readable"
            )
        else:  # no file named: a network or system call, not the file system the user gave us
            hint = "check the network settings (HF_ENDPOINT, HTTPS_PROXY) and the system's limits"
        fail(env, f"{exc.filename}: {exc.strerror or exc}" if exc.filename else str(exc.strerror or exc), hint, 1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:  # a bug: its traceback goes through the capture too (masked; JSON lines with LOG_FORMAT=json)
        traceback.print_exc()
        sys.exit(1)
    finally:
        release_stderr()
    sys.exit(code)


def early_log(env: Mapping[str, str]) -> Log:
    """The log before the settings are parsed: every secret the environment holds is masked already."""
    fmt = (env.get("LOG_FORMAT") or "").strip().lower()
    return Log("json" if fmt == "json" else "text", secrets=token_values(env))


def fail(env: Mapping[str, str], message: str, hint: str, code: int) -> NoReturn:
    # Masked like every log line, whatever produced the message (settings may not have been parsed).
    early_log(env).fatal(message, hint)
    sys.exit(code)


def run(args: list[str], env: dict[str, str]) -> int:
    command = args[0] if args else "serve"
    if command in ("-h", "--help"):
        print(USAGE)
        return 0
    if command == "probe":
        print(json.dumps(probe.probe(installation(env, _facts_or_none(env))), indent=2))
        return 0
    if command == "health":
        return health(env)
    if command.startswith("-"):  # as postgres' entrypoint does: options are the server's
        return subcommand("serve", env, CommandLine(server_args=tuple(args)))
    if command not in SUBCOMMANDS:
        return passthrough(args, env)
    if len(args) > 1:
        raise UsageError(
            f"'{command}' takes no arguments, got {' '.join(args[1:])!r}",
            "configure it with environment variables (see the README's environment table), or give "
            "server options alone (they start with '-')",
        )
    return subcommand(command, env, CommandLine())


def subcommand(command: str, env: dict[str, str], command_line: CommandLine) -> int:
    """Load, decide, execute."""
    facts = load_facts(env)
    settings = Settings.from_env(env, facts, command_line)
    pod_group = group_from_env(env)
    log = open_log(settings)
    if pod_group is not None and command in ("serve", "prepare"):
        group.require_frontend(settings.frontend, pod_group)  # before any download, as the checks below
    if pod_group is not None and command == "serve":
        # Refused before any download or build: the group's pods cannot hold TP x PP ranks.
        group.ranks_per_pod(settings.world_size, pod_group, gpu.detect_gpus(settings.gpu_visibility).count)
        group.require_ssh(pod_group)
    if command == "check":
        return check(settings, facts, env, log)
    if command == "flags":
        uses = flagcheck.planned_uses(facts, models.load(facts.models_file), settings)
        print(json.dumps(flagcheck.report(facts, flagcheck.check(uses)), indent=2))
        return 0
    plan = decide(settings, facts, log)
    if command == "build-engine":
        engine_dir = serve_files.ensure_engine(
            plan, facts, env, log, functools.partial(gpu.detect_gpus, settings.gpu_visibility)
        )
        print(json.dumps({"engine_dir": str(engine_dir)}))
        return 0
    prepared = prepare(plan, facts, env, log, need_gpu=command == "serve", pod_group=pod_group)
    if command == "prepare":
        log.info("launch command", argv=" ".join(prepared.argv))  # the log masks the admin key
        # Job logs keep this output, so the admin key is left out; the printed command then fails closed if run
        # as is (Triton refuses an empty key, where a mask such as *** would become a key anyone can guess).
        print(prepared.to_json().replace(settings.admin_key, ""))
        return 0
    if pod_group is not None:
        return serve_in_group(prepared, pod_group, env, log)
    return exec_server(prepared, env, log)


def serve_in_group(prepared: Prepared, pod_group: group.Group, env: Mapping[str, str], log: Log) -> NoReturn:
    """A worker runs sshd until the leader's mpirun starts its ranks; the leader waits for every worker first."""
    files = group.install_ssh_files(pod_group.ssh_dir, ssh_files().directory)
    if not pod_group.is_leader:
        argv = group.sshd_argv(files)
        log.info("worker ready: waiting for the leader's ranks", index=pod_group.index, argv=" ".join(argv))
        launch.exec_argv(argv, env)
    with log.phase("workers", group_size=pod_group.size, timeout_s=pod_group.timeout_s):
        group.wait_for_workers(pod_group, log=log.info)
    exec_server(prepared, env, log)


def open_log(settings: Settings, typed_keys: Sequence[str] = ()) -> Log:
    """`typed_keys`: admin keys on a typed command line, masked like ours."""
    log = Log(
        settings.log_format,
        secrets=(settings.hf_token or "", settings.admin_key, *typed_keys),
        level=settings.log_level,
        progress_s=settings.progress_secs,
    )
    retarget_stderr(log)
    if settings.cache_fallback_reason:
        log.warn(settings.cache_fallback_reason, cache_dir=settings.cache_dir)
    for lookalike in settings.lookalikes:
        log.warn(f"ignoring {lookalike}: not a variable trtllm-entrypoint reads")
    return log


def _facts_or_none(env: Mapping[str, str]) -> ImageFacts | None:
    try:
        return load_facts(env)
    except UsageError:
        return None


def decide(
    settings: Settings,
    facts: ImageFacts,
    log: Log,
    given: locate.ModelSource | None = None,
    typed_argv: tuple[str, ...] = (),
) -> ServePlan:
    """Locate and check the model (downloading it last), then decide once what is served."""
    located = checked_model(settings, facts, log, locate_model(settings, facts, log, given))
    if located.source.kind != "repository":  # a complete repository brings its own
        # Found (and checked) before any build: the candidates are the model, a prebuilt engine, MODEL_ID's own
        # directory; an engine the cache builds holds no tokenizer files.
        tokenizer = preflight.tokenizer_dir(settings, located.source, model_dir=located.model_dir)
        located = dataclasses.replace(located, tokenizer=tokenizer)
        if located.source.repo_id is None:  # a hub model's was checked before its weights came (checked_model)
            check_chat_template(settings, tokenizer, log)
    plan = serve_plan.decide_serve_plan(settings, located, typed_argv)
    for note in plan.notes:
        log.info(note)
    return plan


def locate_model(settings: Settings, facts: ImageFacts, log: Log, given: locate.ModelSource | None = None) -> Located:
    """What the model is, from names and files only: nothing is downloaded or written yet. A prebuilt engine's
    config.json is read here, once. One of another TensorRT-LLM gives way to the checkpoint MODEL_ID names, which is
    then built here."""
    with log.phase("resolve") as extra:
        source = given or locate.resolve(settings)
        extra.update(kind=source.kind, model=source.repo_id or source.path)
    model_dir = locate.model_id_dir(settings)
    if source.kind != "engine" or source.path is None:
        return Located(source, model_dir=model_dir)
    built = engine_config.read(source.path)
    if not settings.model_id:
        return Located(source, built, model_dir)
    try:
        engine_config.check_engine_version(built, facts.tensorrt_llm)
    except EntrypointError as exc:
        checkpoint = locate.resolve_model(settings)
        if checkpoint.kind == "engine":  # MODEL_ID names that engine: nothing to rebuild it from
            raise
        log.warn(f"{exc.message}; rebuilding from MODEL_ID", model=settings.model_id)
        return Located(checkpoint, model_dir=model_dir)
    return Located(source, built, model_dir)


def checked_model(settings: Settings, facts: ImageFacts, log: Log, located: Located) -> Located:
    """The model, after every check that needs no download: the first write or download comes after them."""
    source = located.source
    lora.check_servable(settings, facts)
    config: dict[str, Any] = {}
    if source.kind in ("hub", "checkpoint"):
        # Refuse a checkpoint this image cannot serve with its workflow before any weight is downloaded or built;
        # the model list is read this once, and the converter an engine would be built with is kept.
        table, config = models.load(facts.models_file), hub.read_config(source, settings)
        models.require_support(table, config, facts, settings.workflow)
        located = dataclasses.replace(located, converter=models.engine_converter(table, config, facts))
    built = located.built.config if located.built is not None else None
    if built is not None:
        config = built.get("pretrained_config") or {}
    build_config = built.get("build_config") or {} if built else None
    found, flags = lora.read(settings, source, config, log, build_config, located.model_dir)
    located = dataclasses.replace(located, adapters=found, lora_flags=flags)
    preflight.check(settings, facts, located)
    if source.kind != "hub":
        return located
    with log.phase("download", model=source.repo_id):
        openai = settings.frontend == "openai"
        check = functools.partial(check_chat_template, settings, log=log) if openai else None
        fetched = hub.download(source, settings, log, check)
        return dataclasses.replace(located, source=fetched)


def check_chat_template(settings: Settings, tokenizer: Path, log: Log) -> None:
    """With FRONTEND=openai, a chat template the front cannot compile stops the start here, not every worker later:
    before any download for a local model, before the weights for a hub one."""
    if settings.frontend == "openai":
        log.info(preflight.check_chat_template(tokenizer, os.environ))


def exec_server(prepared: Prepared, env: Mapping[str, str], log: Log) -> NoReturn:
    url = health_url(prepared.plan.health_port, prepared.plan.health_path)
    record_health_url(url)
    log.info("starting the server", program=Path(prepared.argv[0]).name, repository=prepared.launch.repository)
    log.debug("starting the server", argv=" ".join(prepared.argv))  # exactly what is exec'd
    ready.spawn_watcher(url, log, prepared.ready)
    front = prepared.launch.front
    if front is None or prepared.front is None:
        launch.exec_argv(prepared.argv, env)
    log.info("starting the OpenAI front", workers=front.workers, port=front.port)
    front_env = supervise.front_environ(env, prepared.launch.settings.admin_key, front)
    grace = front.shutdown_timeout + supervise.KILL_MARGIN_S  # the children's drain, then SIGKILL
    sys.exit(supervise.run(prepared.argv, prepared.front, front.workers, env, front_env, grace_s=grace, warn=log.warn))


def passthrough(args: list[str], env: dict[str, str]) -> int:
    """Run a given command line; a `tritonserver` one whose repository is not a complete repository gets one.

    It is read as tritonserver reads it (unique prefixes included). A restriction typed for one protocol is
    completed for the other with the same key, and a route around a restriction is refused."""
    if Path(args[0]).name != "tritonserver":
        launch.exec_argv(args, env)
    args = args + server_args.completed_restriction(server_args.parse_options(args[1:]))
    given = launch.parse_passthrough(args)
    check_typed_keys(given.restriction_keys)
    retarget_stderr(Log(early_log(env).fmt, secrets=(*token_values(env), *given.restriction_keys)))
    store = given.repository
    kind = locate.classify_dir(store) if store is not None else "repository"
    opened = all_apis_open(env)
    restricted = bool(given.restriction_keys) or (kind != "repository" and not opened)
    if restricted and not opened:
        server_args.check_side_doors(args[1:], side_door_variables(env), "the tritonserver command")
    if store is None or kind == "repository":
        if given.http_port:
            record_health_url(health_url(given.http_port))
        launch.exec_argv(args, env)
    facts = load_facts(env)
    # The ports typed on the command line win over the environment's (and are validated with it); with several
    # ranks its other arguments go to rank 0.
    typed = CommandLine(server_args=given.others, ports=given.ports(), typed_server=True)
    settings = Settings.from_env(env, facts, typed)
    log = open_log(settings, given.restriction_keys)
    log.info("the model store is not a Triton model repository; preparing one from it", path=store)
    source = locate.ModelSource(kind=kind, path=store, repo_id=None, revision=None, read_only=under_model_dir(store))
    plan = decide(settings, facts, log, given=source, typed_argv=tuple(args))
    return exec_server(prepare(plan, facts, env, log, need_gpu=True), env, log)
