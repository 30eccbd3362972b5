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
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, NoReturn, Sequence

from trtllm_entrypoint import (contract, engine_build, engine_cache, engine_config, fill, flagcheck, gpu, launch,
                               models, preflight, probe, repository, security, sources)
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.facts import ImageFacts, load_facts
from trtllm_entrypoint.log import Log
from trtllm_entrypoint.paths import under_model_dir
from trtllm_entrypoint.settings import Settings, token_values

SUBCOMMANDS = ("serve", "prepare", "build-engine", "check", "probe", "health", "flags")
USAGE = (
    "usage: trtllm-entrypoint [serve|prepare|build-engine|check|probe|health|flags] "
    "| trtllm-entrypoint <command> [args…] (runs the command, e.g. tritonserver …)"
)


@dataclass(frozen=True)
class Prepared:
    """Everything `serve` needs to exec the server; `prepare` prints it."""

    argv: list[str]
    repository: Path
    engine_dir: Path | None
    health_url: str
    env: dict[str, str]  # extra environment for the server (e.g. the OpenAI frontend's orchestrator mode)

    def to_json(self) -> str:
        return json.dumps(
            {"argv": self.argv, "repository": str(self.repository),
             "engine_dir": str(self.engine_dir) if self.engine_dir else None, "health_url": self.health_url,
             "env": self.env},
            indent=2)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if environ is None else environ)
    try:
        code = run(args, env)
    except EntrypointError as exc:
        fail(env, exc.message, exc.hint, exc.exit_code)
    except OSError as exc:  # a file system the user gave us (read-only, full, not ours): say which, no traceback
        where = f"{exc.filename}: " if exc.filename else ""
        fail(env, f"{where}{exc.strerror or exc}", "check that CACHE_DIR (and REPOSITORY_DIR) is a writable "
             "directory with free space, and that the model directory is readable", 1)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code)


def fail(env: Mapping[str, str], message: str, hint: str, code: int) -> NoReturn:
    # Masked like every log line, whatever produced the message (settings may not have been parsed).
    log = Log(secrets=token_values(env))
    print(log.redact(f"error: {message}"), file=sys.stderr)
    if hint:
        print(log.redact(f"hint: {hint}"), file=sys.stderr)
    sys.exit(code)


def run(args: list[str], env: dict[str, str]) -> int:
    command = args[0] if args else "serve"
    if command in ("-h", "--help"):
        print(USAGE)
        return 0
    if command == "probe":
        print(json.dumps(probe.probe(_facts_or_none(env), env), indent=2))
        return 0
    if command == "health":
        return health(env)
    if command not in SUBCOMMANDS:
        return passthrough(args, env)
    if len(args) > 1:
        raise UsageError(f"'{command}' takes no arguments, got {' '.join(args[1:])!r}",
                         "configure it with environment variables (see the README's environment table)")
    facts = load_facts(env)
    settings = Settings.from_env(env, facts)
    log = open_log(settings)
    if command == "check":
        return check(settings, facts, env, log)
    if command == "flags":
        uses = flagcheck.planned_uses(facts, models.load(env), settings)
        print(json.dumps(flagcheck.report(facts, flagcheck.check(uses)), indent=2))
        return 0
    if command == "build-engine":
        source = checked_model(settings, facts, env, log)
        engine_dir, _ = ensure_engine(settings, facts, env, log, source, lambda: gpu.detect_gpus(env))
        print(json.dumps({"engine_dir": str(engine_dir)}))
        return 0
    prepared = prepare(settings, facts, env, log, need_gpu=command == "serve")
    if command == "prepare":
        log.info("launch command", argv=" ".join(prepared.argv))  # the log masks the admin key
        # Job logs keep this output, so the admin key is left out; the printed command then fails closed if run
        # as is (Triton refuses an empty key, where a mask such as *** would become a key anyone can guess).
        print(prepared.to_json().replace(settings.admin_key, ""))
        return 0
    return exec_server(prepared, env, log)


def open_log(settings: Settings) -> Log:
    log = Log(settings.log_format, secrets=(settings.hf_token or "", settings.admin_key))
    if settings.cache_fallback_reason:
        log.warn(settings.cache_fallback_reason, cache_dir=settings.cache_dir)
    return log


def _facts_or_none(env: Mapping[str, str]) -> ImageFacts | None:
    try:
        return load_facts(env)
    except UsageError:
        return None


def locate_model(settings: Settings, env: Mapping[str, str], log: Log) -> sources.ModelSource:
    """What the model is, from names and files only: nothing is downloaded or written yet."""
    with log.phase("resolve") as extra:
        source = sources.resolve(settings, env)
        extra.update(kind=source.kind, model=source.repo_id or source.path)
    return source


def checked_model(settings: Settings, facts: ImageFacts, env: Mapping[str, str], log: Log,
                  source: sources.ModelSource | None = None) -> sources.ModelSource:
    """The model, after every check that needs no download: the first write or download comes after them."""
    source = source or locate_model(settings, env, log)
    check_model(source, settings, facts, env)
    preflight.check(settings, facts, source)
    return fetch_model(source, settings, log)


def check_model(source: sources.ModelSource, settings: Settings, facts: ImageFacts, env: Mapping[str, str]) -> None:
    """Refuse a checkpoint this image cannot serve with its workflow before any weight is downloaded or built."""
    if source.kind in ("hub", "checkpoint"):
        models.require_support(models.load(env), sources.read_config(source, settings), facts, settings.workflow)


def fetch_model(source: sources.ModelSource, settings: Settings, log: Log) -> sources.ModelSource:
    if source.kind != "hub":
        return source
    with log.phase("download", model=source.repo_id):
        return sources.download(source, settings, log)


def prepare(settings: Settings, facts: ImageFacts, env: Mapping[str, str], log: Log, *, need_gpu: bool,
            source: sources.ModelSource | None = None) -> Prepared:
    source = checked_model(settings, facts, env, log, source)
    gpus = functools.lru_cache(maxsize=None)(lambda: gpu.detect_gpus(env))  # nvidia-smi once per start, if at all
    if source.kind == "repository":
        log.info("model is a complete Triton model repository; serving it as given (its code is yours, not "
                 "compared with the image's)", repository=source.path)
        return finish(settings, facts, log, repo=source.path, engine_dir=None, world_size=settings.world_size,
                      tokenizer=None)
    if source.kind == "engine" and settings.workflow == "llmapi":
        if (env.get("WORKFLOW") or "").strip():
            raise UsageError(f"WORKFLOW=llmapi cannot serve the prebuilt engine at {source.path}",
                             "set WORKFLOW=engine, or give MODEL_ID a Hugging Face checkpoint")
        log.info("the model is a prebuilt engine: using the engine workflow (this image's default is llmapi)")
        settings = dataclasses.replace(settings, workflow="engine")
    if settings.workflow == "llmapi":
        engine_dir = None
        world_size = settings.world_size
    else:
        engine_dir, source = ensure_engine(settings, facts, env, log, source, gpus)
        world_size = engine_config.engine_world_size(engine_dir)
        settings, taken = engine_config.serving_settings(settings, engine_dir)
        if taken:
            log.info("serving the limits the engine was built with", **taken)
    if need_gpu:
        gpu.require_gpus(gpus(), world_size, "to serve the model")
    tokenizer = preflight.tokenizer_dir(settings, source, engine_dir)
    with log.phase("fill"):
        repo = write_repository(settings, facts, log, source, engine_dir, tokenizer)
    return finish(settings, facts, log, repo=repo, engine_dir=engine_dir, world_size=world_size, tokenizer=tokenizer)


def finish(settings: Settings, facts: ImageFacts, log: Log, *, repo: Path, engine_dir: Path | None,
           world_size: int, tokenizer: Path | None) -> Prepared:
    argv = launch.server_argv(settings, facts, repo, world_size, tokenizer=tokenizer)
    for warning in security.start_warnings(settings, facts):
        log.warn(warning)
    return Prepared(argv=argv, repository=repo, engine_dir=engine_dir,
                    health_url=health_url(settings.http_port),
                    env=launch.server_env(settings))


def ensure_engine(settings: Settings, facts: ImageFacts, env: Mapping[str, str], log: Log,
                  source: sources.ModelSource,
                  detect_gpus: Callable[[], gpu.GpuInfo]) -> tuple[Path, sources.ModelSource]:
    """A prebuilt engine of the installed TensorRT-LLM, or one from the cache (built once, under a lock); with the
    source it came from (the checkpoint when a prebuilt engine of another version was rebuilt)."""
    if source.kind == "engine":
        try:
            engine_config.check_engine_version(source.path, facts.tensorrt_llm)
            log.info("using the prebuilt engine", engine_dir=source.path)
            return source.path, source
        except EntrypointError as exc:
            if not settings.model_id:
                raise
            log.warn(f"{exc.message}; rebuilding from MODEL_ID", model=settings.model_id)
            source = sources.resolve_model(settings, env)
            check_model(source, settings, facts, env)
            source = fetch_model(source, settings, log)
    if source.kind != "checkpoint":
        raise UsageError(f"the {source.kind} at {source.path} cannot be turned into an engine",
                         "give MODEL_ID a Hugging Face checkpoint, or ENGINE_DIR a prebuilt engine")
    converter = models.converter(models.load(env), sources.read_config(source, settings), facts)
    gpus = detect_gpus()
    # Engines are specific to the GPU's compute capability, so building needs one (ranks are built one by one).
    gpu.require_gpus(gpus, 1, "to build a TensorRT engine")
    inputs = engine_cache.key_inputs(sources.identity(source), settings, facts, gpus)
    key = engine_cache.cache_key(inputs)
    cache = engine_cache.EngineCache(settings.cache_dir / "engines")
    build = engine_build.engine_builder(facts, settings, source.path, converter, log, env)
    with log.phase("engine", key=key) as extra:
        engine_dir, built = cache.ensure(key, engine_cache.stamp_inputs(inputs, facts, gpus), build,
                                         timeout_s=settings.lock_timeout_secs, log=log)
        extra.update(cache="built" if built else "hit", engine_dir=engine_dir)
    return engine_dir, source


def write_repository(settings: Settings, facts: ImageFacts, log: Log, source: sources.ModelSource,
                     engine_dir: Path | None, tokenizer_dir: Path) -> Path:
    values = fill.fill_values(settings, facts, engine_dir, tokenizer_dir)
    plan = fill.plan_fill(settings.templates_dir, values, settings=settings, model_path=source.path)
    log.info("optional template parameters", **dict(sorted(plan.effective.items())))
    if settings.repository_dir:
        # The returned lock descriptor stays open on purpose: the exec'd server inherits it and holds it while serving.
        repository.write_named(plan, settings.repository_dir, settings.templates_dir, log,
                               timeout_s=settings.lock_timeout_secs)
        return settings.repository_dir
    # Named by its content: a restart with the same settings finds it valid and skips the write.
    dest, _ = repository.write_cached(plan, settings.cache_dir / "repositories", settings.templates_dir, log,
                                      timeout_s=settings.lock_timeout_secs)
    return dest


def exec_server(prepared: Prepared, env: Mapping[str, str], log: Log) -> NoReturn:
    record_health_url(prepared.health_url)
    log.info("starting the server", argv=" ".join(prepared.argv))  # exactly what is exec'd
    launch.exec_argv(prepared.argv, {**env, **prepared.env})


def health_url(port: int | str) -> str:
    return f"http://127.0.0.1:{port}/v2/health/ready"


def health_state() -> Path:
    """Where `serve` records the URL that `health` (the image's HEALTHCHECK) asks: per container, so the temp dir."""
    return Path(tempfile.gettempdir()) / "trtllm-entrypoint" / "health.json"


def record_health_url(url: str) -> None:
    state = health_state()
    try:
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps({"url": url}))
    except OSError:
        pass  # the health check then falls back to HTTP_PORT; serving must not fail over it


def health(env: Mapping[str, str]) -> int:
    """Exit 0 when the server answers ready; the image's HEALTHCHECK runs this."""
    import urllib.error  # noqa: PLC0415  (only this short-lived subcommand needs HTTP)
    import urllib.request  # noqa: PLC0415
    try:
        url = json.loads(health_state().read_text())["url"]
    except (OSError, ValueError, KeyError):
        url = health_url(env.get("HTTP_PORT") or contract.DEFAULT_HTTP_PORT)
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1


def passthrough(args: list[str], env: dict[str, str]) -> int:
    """Run a given command line; a `tritonserver` one whose repository is not a complete repository gets one."""
    if Path(args[0]).name != "tritonserver":
        launch.exec_argv(args, env)
    given = launch.parse_passthrough(args)
    kind = sources.classify_dir(given.repository) if given.repository is not None else "repository"
    if kind == "repository":
        if given.http_port:
            record_health_url(health_url(given.http_port))
        launch.exec_argv(args, env)
    facts = load_facts(env)
    # The ports typed on the command line win over the environment's (and are validated with it); it asked for
    # tritonserver, so no OpenAI frontend; with several ranks its other arguments go to rank 0.
    typed = {name.upper(): str(port) for name, port in given.ports().items()}
    settings = Settings.from_env({**env, **typed, "FRONTEND": "triton"}, facts)
    settings = dataclasses.replace(settings, triton_args=given.others + settings.triton_args)
    if security.flags_in(given.others):  # it restricts APIs itself: ours would clash
        settings = dataclasses.replace(settings, restricted_apis=())
    log = open_log(settings)
    log.info("the model store is not a Triton model repository; preparing one from it", path=given.repository)
    source = sources.ModelSource(kind=kind, path=given.repository, repo_id=None, revision=None,
                                 read_only=under_model_dir(given.repository))
    prepared = prepare(settings, facts, env, log, need_gpu=True, source=source)
    if Path(prepared.argv[0]).name == "tritonserver":
        # One rank: the command as typed, with only its model repository replaced (and the APIs restricted).
        argv = launch.rewrite_repository(args, prepared.repository) + security.restriction(settings, facts).argv()
        prepared = dataclasses.replace(prepared, argv=argv)
    return exec_server(prepared, env, log)


def check(settings: Settings, facts: ImageFacts, env: Mapping[str, str], log: Log) -> int:
    """Print what was detected and resolved; non-zero when the image and the matrix disagree."""
    gpus = gpu.detect_gpus(env)
    report = {
        "facts": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(facts).items()},
        "gpus": [dataclasses.asdict(g) for g in gpus.gpus],
        "settings": settings.describe(),
        "installed": probe.probe(facts, env),
        "model": model_support(settings, facts, env),
    }
    print(json.dumps(report, indent=2, default=str))
    problems = compatibility_problems(facts, settings, gpus)
    if report["model"] and report["model"]["problem"]:
        problems.append(report["model"]["problem"])
    for problem in problems:
        log.error(problem)
    return 1 if problems else 0


def model_support(settings: Settings, facts: ImageFacts, env: Mapping[str, str]) -> dict | None:
    """Whether this image serves the configured checkpoint with its workflow (None: no checkpoint is configured)."""
    try:
        source = sources.resolve(settings, env)
    except UsageError:
        return None
    if source.kind not in ("hub", "checkpoint"):
        return None
    config = sources.read_config(source, settings)
    return {"model": models.describe(config), "workflow": settings.workflow,
            "problem": models.unsupported_reason(models.load(env), config, facts, settings.workflow)}


def compatibility_problems(facts: ImageFacts, settings: Settings, gpus: gpu.GpuInfo) -> list[str]:
    problems = []
    if facts.installed and facts.tensorrt_llm != facts.matrix_tensorrt_llm:
        problems.append(f"installed TensorRT-LLM {facts.tensorrt_llm} differs from {facts.matrix_tensorrt_llm} that "
                        f"the matrix gives for {facts.tag}")
    try:
        fill.workflow_templates(settings.templates_dir, settings.workflow)
    except UsageError as exc:
        problems.append(exc.message)
    if gpus.count < settings.world_size:
        problems.append(f"TP_SIZE x PP_SIZE = {settings.world_size} needs {settings.world_size} GPUs, "
                        f"{gpus.count} visible")
    return problems
