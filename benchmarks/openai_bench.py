"""Our OpenAI front against Triton's own generate_stream and the engine alone, back to back on the same running
FRONTEND=openai process tree (one `prepare`, run by the entrypoint's supervisor: harness/realfront.py), with a fast
engine stand-in (the engine double sending each request's 64 tokens from execute() as fast as it can:
TRTLLM_ENGINE_DOUBLE_INLINE), so that what is measured is the serving path, not the engine. Same HTTP streaming
client and closed-loop load for every API. Real: tritonserver 2.51.0, upstream's pre/postprocessing models, our front.

Engine workflow (tag 25.01): `generate_stream` of the ensemble (text in, upstream's Python stubs tokenize and
detokenize), our front (tokenizes itself, streams ids straight from the tensorrt_llm model, detokenizes in its own
processes), and the tensorrt_llm model alone (ids in and out: the ceiling). llmapi workflow (tag 26.07): the
tensorrt_llm model's own generate_stream (text) and our front. Targets (engine workflow): on 2 CPUs at c=16, the
front gives >= 1.5x generate_stream's tokens/s with <= 1 ms added p50 inter-token latency; from 16 usable CPUs, at
c=16, 64 and 256, >= 2.0x generate_stream, >= 0.8x the engine alone, <= 0.1 ms added. If one is missed, `profile`
records where the process tree spends its time.
"""

from __future__ import annotations

import http.client
import json
import math
import multiprocessing
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks import sandbox, serving_bench, stream_client
from benchmarks.report import Metric, Target
from benchmarks.serving_stats import StreamRun, percentile
from harness import realfront, realtriton
from harness.tiny_checkpoint import PROMPT
from trtllm_entrypoint.config import cpus

SMALL_CONCURRENCY = (1, 16, 64)
LARGE_CONCURRENCY = (16, 64, 256)
LARGE_MACHINE_CPUS = 16  # the lent 16-core machine
MAX_TOKENS = 64
WORKFLOW_TAGS = {"engine": "25.01", "llmapi": "26.07"}  # each tag's default workflow is the one named
# The front's own limits, per machine size: (tokens/s over generate_stream, over the engine alone, added p50 ms).
SMALL_TARGETS = (1.5, None, 1.0)
LARGE_TARGETS = (2.0, 0.8, 0.1)
# The load generator's processes: one per 4 CPUs (one Python process parses ~10k SSE events a second).
CPUS_PER_CLIENT_PROCESS = 4
# The engine stand-in's stub processes (the tensorrt_llm model's instances): one per 4 CPUs. One stub sends at most
# ~10k tokens/s, which made it the ceiling of every API on 16 CPUs; a C++ engine has no such limit.
CPUS_PER_STANDIN_INSTANCE = 4
Say = Callable[[str], None]


@dataclass(frozen=True)
class Api:
    """One way to stream the same request: where to POST it and which SSE events carry a token."""

    name: str
    route: str
    body: dict
    field: str  # the event's field that holds the token(s)


def apis(workflow: str, served_name: str, prompt_ids: list[int]) -> list[Api]:
    """The APIs measured for a workflow, the native one first and ours second."""
    openai = Api(
        "openai",
        "/v1/completions",
        {"model": served_name, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "stream": True},
        "choices",
    )
    if workflow == "llmapi":
        native = Api(
            "generate_stream",
            f"/v2/models/{served_name}/generate_stream",  # the llmapi model is served under the front's name
            {"text_input": PROMPT, "sampling_param_max_tokens": MAX_TOKENS, "streaming": True},
            "text_output",
        )
        return [native, openai]
    native = Api(
        "generate_stream",
        "/v2/models/ensemble/generate_stream",
        {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "stream": True},
        "text_output",
    )
    engine = Api(
        "engine alone",
        "/v2/models/tensorrt_llm/generate_stream",
        {"input_ids": prompt_ids, "input_lengths": len(prompt_ids), "request_output_len": MAX_TOKENS,
         "streaming": True},
        "output_ids",
    )  # fmt: skip
    return [native, openai, engine]


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds used during the measured window: by the server's processes (its process group: tritonserver,
    its Python-backend stubs and the front's workers), by the front's workers alone, and by the load generator."""

    server_s: float
    client_s: float
    front_s: float = 0.0


def load(
    port: int, api: Api, concurrency: int, warmup_s: float, measure_s: float, pgid: int
) -> tuple[StreamRun, CpuUse]:
    """Closed loop: `concurrency` clients, each sending its next request when the last one ended, spread over
    client processes (stream_client.py); what started in the measured window is counted, and the CPU used in it."""
    processes = max(1, min(concurrency, (os.cpu_count() or 1) // CPUS_PER_CLIENT_PROCESS))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    context = multiprocessing.get_context("fork")  # no re-import of the caller (`python -m benchmarks`)
    pipes, children = [], []
    for clients in shares:
        parent, child = context.Pipe()
        process = context.Process(
            target=stream_client.shard, args=(child, port, api.route, json.dumps(api.body), api.field, clients)
        )
        process.start()
        pipes.append(parent)
        children.append(process)
    try:
        for pipe in pipes:
            pipe.recv()  # ready
        start = time.perf_counter() + warmup_s
        end = start + measure_s
        for pipe in pipes:
            pipe.send((start, end))
        time.sleep(max(0.0, start - time.perf_counter()))
        server_before, front_before = serving_bench.group_cpu_s(pgid), front_cpu_s(pgid)
        time.sleep(max(0.0, end - time.perf_counter()))
        server_s, front_s = serving_bench.group_cpu_s(pgid) - server_before, front_cpu_s(pgid) - front_before
        results = [pipe.recv() for pipe in pipes]
    finally:
        for process in children:
            process.join(timeout=120)
    sent = tuple(t for r in results for t in r[0])
    arrivals = tuple(a for r in results for a in r[1])
    run = StreamRun(concurrency, measure_s, sent, arrivals, sum(r[2] for r in results))
    return run, CpuUse(server_s, sum(r[3] for r in results), front_s)


def front_cpu_s(pgid: int) -> float:
    """CPU seconds used so far by the front's worker processes of the tree (process_roles)."""
    workers = {pid for pid, role in process_roles(pgid).items() if role == "front worker"}
    ticks = sum(int(f[11]) + int(f[12]) for proc, f in serving_bench.group_processes(pgid) if int(proc.name) in workers)
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Servers:
    """One prepared FRONTEND=openai plan (tritonserver's command line and the front's), and where each API answers."""

    workflow: str
    prepared: dict
    env: dict[str, str]
    http_port: int
    openai_port: int
    layout: realtriton.Layout
    prompt_ids: list[int]


def prepare(work: Path, workflow: str = "engine", workers: int | None = None) -> Servers:
    layout = serving_bench.layout()
    # A SentencePiece tokenizer (`▁` word starts, byte fallback), as Llama 2 and TinyLlama ship: the detokenizing
    # both paths do is a real model's.
    bench = serving_bench.Bench(work, layout, tag=WORKFLOW_TAGS[workflow], tokenizer="llama2")
    openai_port = realtriton.free_port()
    extra = {"OPENAI_WORKERS": str(workers)} if workers else {}
    env = bench.env(
        serving_bench.OURS,
        True,
        TRTLLM_ENGINE_DOUBLE_INLINE="1",
        FRONTEND="openai",
        SERVED_MODEL_NAME="ensemble",  # one name for both APIs' requests (the front's would be the model's own)
        OPENAI_PORT=str(openai_port),
        **extra,
    )
    prepared = bench.sandbox.prepare(env)
    if workflow == "engine":  # the llmapi model is the whole LLM API in one Python process, as it is served
        prepared = standin_instances(prepared, work, max(1, cpus.usable_cpus() // CPUS_PER_STANDIN_INSTANCE))
    import tokenizers  # noqa: PLC0415  (the harness's: the prompt's ids for the engine alone)

    prompt_ids = tokenizers.Tokenizer.from_file(str(bench.model / "tokenizer.json")).encode(PROMPT).ids
    return Servers(workflow, prepared, env, int(env["HTTP_PORT"]), openai_port, layout, list(prompt_ids))


def standin_instances(prepared: dict, work: Path, instances: int) -> dict:
    """`prepared` serving a copy of its repository in which the tensorrt_llm model (the engine stand-in) runs as
    `instances` stub processes; the cached repository stays as `prepare` made it."""
    argv = prepared["argv"]
    at = next(i for i, arg in enumerate(argv) if arg.startswith("--model-repository="))
    copy = work / "standin-repository"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(argv[at].partition("=")[2], copy, symlinks=True)
    config = copy / "tensorrt_llm" / "config.pbtxt"
    text, count = re.subn(r"(instance_group\s*\[\s*\{\s*count\s*:\s*)\d+", rf"\g<1>{instances}", config.read_text())
    if count != 1:
        raise RuntimeError(f"{config}: expected one instance_group count to set, found {count}")
    config.chmod(0o644)
    config.write_text(text)
    return {**prepared, "argv": [*argv[:at], f"--model-repository={copy}", *argv[at + 1 :]]}


def served_name(port: int) -> str:
    """The name the front serves (the model's own, or SERVED_MODEL_NAME), as a client finds it."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/v1/models", headers={"Authorization": f"Bearer {sandbox.BENCH_ADMIN_KEY}"})
        return str(json.loads(connection.getresponse().read())["data"][0]["id"])
    finally:
        connection.close()


@contextmanager
def started(servers: Servers, log_dir: Path) -> Iterator[tuple[realfront.RunningFront, float]]:
    """The whole FRONTEND=openai process tree, as `serve` runs it; (it, seconds to the front's readiness)."""
    began = time.time()
    with realfront.start(
        servers.layout, servers.prepared, sandbox.BENCH_ADMIN_KEY, env=servers.env, log_dir=log_dir, ready_timeout_s=300
    ) as tree:
        yield tree, time.time() - began


def concurrencies(usable_cpus: int) -> tuple[int, ...]:
    return LARGE_CONCURRENCY if usable_cpus >= LARGE_MACHINE_CPUS else SMALL_CONCURRENCY


def target_concurrencies(usable_cpus: int) -> tuple[int, ...]:
    """The concurrencies the targets hold at on a machine with `usable_cpus`."""
    return LARGE_CONCURRENCY if usable_cpus >= LARGE_MACHINE_CPUS else (16,)


def measure(
    work: Path, warmup_s: float, measure_s: float, rounds: int, say: Say, workflows: tuple[str, ...] = ("engine",)
) -> dict:
    """Rounds of every API, back to back on the same running tree, at each concurrency; the raw runs, the CPU
    they used (the whole tree's) and the times to ready."""
    usable = cpus.usable_cpus()
    runs: dict[tuple[str, str, int], list[StreamRun]] = {}
    cpu: dict[tuple[str, str, int], list[CpuUse]] = {}
    ready: dict[str, list[float]] = {}
    workers = 0
    for workflow in workflows:
        servers = prepare(work / workflow, workflow)
        workers = servers.prepared["front"]["workers"]
        for index in range(rounds):
            with started(servers, work / workflow) as (tree, seconds):
                ready.setdefault(workflow, []).append(seconds)
                measured = apis(workflow, served_name(servers.openai_port), servers.prompt_ids)
                for concurrency in concurrencies(usable):
                    for api in measured:
                        port = servers.openai_port if api.name == "openai" else servers.http_port
                        say(f"openai bench: {workflow}, round {index + 1}/{rounds}, {api.name}, c={concurrency}")
                        run, used = load(port, api, concurrency, warmup_s, measure_s, tree.process.pid)
                        runs.setdefault((workflow, api.name, concurrency), []).append(run)
                        cpu.setdefault((workflow, api.name, concurrency), []).append(used)
    return {
        "runs": runs,
        "cpu": cpu,
        "ready": ready,
        "workers": workers,
        "usable_cpus": usable,
    }


def merged(runs: list[StreamRun]) -> StreamRun:
    return StreamRun(
        runs[0].concurrency,
        sum(r.seconds for r in runs),
        tuple(s for r in runs for s in r.sent_s),
        tuple(a for r in runs for a in r.arrivals_s),
        sum(r.errors for r in runs),
    )


def numbers(run: StreamRun, cpu: list[CpuUse]) -> dict:
    """`cpu` over the same windows as `run`: per token, the window's CPU over the tokens it streamed (closed loop,
    steady state: the requests started in a window stream about as many tokens as it holds)."""
    tokens = max(run.tokens_per_s * run.seconds, 1.0)

    def p(values: list[float], q: float) -> float:  # a window with no finished request has none: NaN, not a crash
        return percentile(values, q) * 1e3 if values else math.nan

    return {
        "tokens_per_s": run.tokens_per_s,
        "server_cpu_ms_per_token": sum(c.server_s for c in cpu) / tokens * 1e3,
        "client_cpu_ms_per_token": sum(c.client_s for c in cpu) / tokens * 1e3,
        "front_cpu_ms_per_token": sum(c.front_s for c in cpu) / tokens * 1e3,
        "cpus_busy": sum(c.server_s + c.client_s for c in cpu) / run.seconds,
        "itl_p50_ms": p(run.itl_s, 50),
        "itl_p99_ms": p(run.itl_s, 99),
        "ttft_p50_ms": p(run.ttft_s, 50),
        "requests": len(run.sent_s),
        "errors": run.errors,
    }


def _ratio(ours: float, theirs: float) -> float:
    """NaN where the other API streamed nothing in its windows (every request failed): the table says so."""
    return ours / theirs if theirs else math.nan


def metrics(measured: dict) -> list[Metric]:
    """Pure: the comparison rows from what `measure` returned."""
    rows = []
    usable = measured["usable_cpus"]
    ratio_native, ratio_engine, added_limit = LARGE_TARGETS if usable >= LARGE_MACHINE_CPUS else SMALL_TARGETS
    summary = {key: numbers(merged(value), measured["cpu"][key]) for key, value in measured["runs"].items()}
    for workflow, api_name, concurrency in sorted({(w, "openai", c) for w, _, c in summary}):
        ours = summary[(workflow, api_name, concurrency)]
        native = summary[(workflow, "generate_stream", concurrency)]
        engine = summary.get((workflow, "engine alone", concurrency))
        top = workflow == "engine" and concurrency in target_concurrencies(usable)
        added = ours["itl_p50_ms"] - native["itl_p50_ms"]
        label = f"openai ({workflow}) c={concurrency}"
        details = {"openai": ours, "generate_stream": native, **({"engine alone": engine} if engine else {})}
        rows += [
            Metric(
                f"{label}: tokens/s over generate_stream",
                _ratio(ours["tokens_per_s"], native["tokens_per_s"]),
                "x",
                Target(">=", ratio_native, "x") if top else None,
                note=f"{ours['tokens_per_s']:.0f} vs {native['tokens_per_s']:.0f} tokens/s",
                details=details,
            ),
            Metric(
                f"{label}: p50 ITL added over generate_stream",
                added,
                "ms",
                Target("<=", added_limit, "ms") if top else None,
                note=f"p50 ITL {ours['itl_p50_ms']:.3f} vs {native['itl_p50_ms']:.3f} ms",
            ),
            Metric(
                f"{label}: server CPU per token",
                ours["server_cpu_ms_per_token"],
                "ms",
                note=f"vs {native['server_cpu_ms_per_token']:.3f} ms; CPUs busy (server + load) "
                f"{ours['cpus_busy']:.2f} vs {native['cpus_busy']:.2f} of {os.cpu_count()}",
            ),
            Metric(f"{label}: the front's own CPU per token", ours["front_cpu_ms_per_token"], "ms"),
        ]
        if engine is not None:
            rows.append(
                Metric(
                    f"{label}: tokens/s over the engine alone",
                    _ratio(ours["tokens_per_s"], engine["tokens_per_s"]),
                    "x",
                    Target(">=", ratio_engine, "x") if top and ratio_engine else None,
                    note=f"{ours['tokens_per_s']:.0f} vs {engine['tokens_per_s']:.0f} tokens/s",
                )
            )
    for workflow, samples in measured["ready"].items():
        rows.append(
            Metric(
                f"time to ready ({workflow}): tritonserver and the OpenAI front (its /health/ready)",
                sorted(samples)[len(samples) // 2],
                "s",
                details={"samples_s": samples},
            )
        )
    return rows


def table(rows: list[Metric]) -> str:
    """The per-API table docs/benchmarks.md shows: every API's numbers at each concurrency."""
    lines = [
        "| workflow | c | API | tokens/s | ITL p50 / p99 ms | TTFT p50 ms | server CPU ms/token (front's) | CPUs busy "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if not row.details or "generate_stream" not in row.details:
            continue
        workflow, concurrency = row.name.split("(")[1].split(")")[0], row.name.split("c=")[1].split(":")[0]
        for api, n in row.details.items():
            lines.append(
                f"| {workflow} | {concurrency} | {api} | {n['tokens_per_s']:.0f} | {n['itl_p50_ms']:.3f} / "
                f"{n['itl_p99_ms']:.3f} | {n['ttft_p50_ms']:.2f} | {n['server_cpu_ms_per_token']:.3f} "
                f"({n['front_cpu_ms_per_token']:.3f}) | {n['cpus_busy']:.2f} | {n['errors']} |"
            )
    return "\n".join(lines)


def profile(work: Path, measure_s: float, out: Path, say: Say) -> str:
    """Where the frontend's process spends its time under the highest stream load the targets hold at:
    py-spy samples every thread of the
    frontend and of its stub processes, native frames (Triton's C++, pybind11, libc) included. The summary goes to
    `out`, py-spy's speedscope file beside it. Returns what was written, or why nothing was."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return "no profile: py-spy is not installed (pip install -e '.[bench]')"
    servers = prepare(work)
    at = max(target_concurrencies(cpus.usable_cpus()))
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.with_suffix(".speedscope.json")
    with started(servers, work) as (tree, _):
        proc = tree.process
        roles = process_roles(proc.pid)
        say(f"openai bench: profiling the frontend at c={at} with py-spy --native")
        warmup_s = 1.0
        spy_argv = [py_spy, "record", "--pid", str(proc.pid), "--native", "--threads", "--subprocesses"]
        spy_argv += ["--rate", str(SPY_RATE_HZ), "--duration", str(math.ceil(warmup_s + measure_s))]
        spy_argv += ["--format", "speedscope", "--output", str(raw)]
        spy = subprocess.Popen(spy_argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        openai = apis("engine", served_name(servers.openai_port), servers.prompt_ids)[1]
        run, used = load(servers.openai_port, openai, at, warmup_s, measure_s, proc.pid)
        _, errors = spy.communicate(timeout=120)
    if spy.returncode != 0 or not raw.is_file():
        return f"no profile: py-spy exited {spy.returncode}: {errors.strip()[-500:]}"
    header = (
        f"py-spy record --native --threads --subprocesses at {SPY_RATE_HZ} Hz over the c={at} load "
        f"({measure_s:g} s after {warmup_s:g} s warm-up). Under the profiler: {run.tokens_per_s:.0f} tokens/s; "
        f"CPU in the window: server {used.server_s:.2f} s, load generator {used.client_s:.2f} s. Sampled seconds "
        "count a thread whenever py-spy found it running or blocked in native code (py-spy's idle filter is off "
        "for native stacks), so shares say where threads are, not only where the CPU goes.\n\n"
    )
    out.write_text(header + summarise(json.loads(raw.read_text()), roles, SPY_RATE_HZ))
    return f"the frontend's profile is in {out} (py-spy's speedscope file: {raw})"


def write_plot(rows: list[Metric], path: Path, subtitle: str) -> str | None:
    """Tokens/s and p50 inter-token latency of every API at each concurrency (engine workflow); None when written,
    else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    points = [m for m in rows if m.details and "generate_stream" in m.details and "(engine)" in m.name]
    if not points:
        return "no results to plot"
    names = list(points[0].details)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=120)
    width = 0.8 / len(names)
    colours = {"generate_stream": "tab:gray", "openai": "tab:blue", "engine alone": "tab:green"}
    for offset, api in enumerate(names):
        xs = [i + (offset - (len(names) - 1) / 2) * width for i in range(len(points))]
        left.bar(xs, [m.details[api]["tokens_per_s"] for m in points], width, color=colours.get(api), label=api)
        right.bar(xs, [m.details[api]["itl_p50_ms"] for m in points], width, color=colours.get(api), label=api)
    labels = [m.name.split(" c=")[1].split(":")[0] for m in points]
    for axis, title, unit in ((left, "Streamed tokens/s", "tokens/s"), (right, "p50 inter-token latency", "ms")):
        axis.set_xticks(range(len(points)), [f"c={c}" for c in labels])
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(True, axis="y", alpha=0.3)
    left.legend(loc="upper left", fontsize=8)
    figure.suptitle(
        f"The OpenAI front, generate_stream and the engine alone, same running server, fast engine stand-in, "
        f"{MAX_TOKENS} tokens per request\n{subtitle}",
        fontsize=10,
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return None


SPY_RATE_HZ = 50  # py-spy's native unwinding stops the process per sample: low, to disturb 2 CPUs little
SPY_ROOTS = ("process ", "thread (")  # py-spy's own root frames (the process and thread names): not code


def process_roles(pgid: int) -> dict[int, str]:
    """What each process of the tree's process group is: the supervisor, tritonserver, a front worker, or the stub of
    which model."""
    roles = {}
    for proc, _ in serving_bench.group_processes(pgid):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # ended while we read
            continue
        stub = next((i for i, a in enumerate(args) if a.endswith(b"triton_python_backend_stub")), None)
        # A stub's first argument is <repository>/<model>/<version>/model.py.
        if stub is not None:
            roles[int(proc.name)] = f"stub {Path(args[stub + 1].decode()).parts[-3]}"
        elif any(a.endswith(b"tritonserver") for a in args[:1]):
            roles[int(proc.name)] = "tritonserver"
        else:
            # A worker runs `python -m trtllm_entrypoint.openai`; the supervisor's plan names that module too.
            worker = any(a == b"-m" and b == b"trtllm_entrypoint.openai" for a, b in zip(args, args[1:], strict=False))
            roles[int(proc.name)] = "front worker" if worker else "supervisor"
    return roles


def summarise(speedscope: dict, roles: dict[int, str], rate_hz: int, top: int = 12) -> str:
    """Pure: py-spy's speedscope profile as text: sampled seconds per process and thread, then each busy thread's
    heaviest frames, by own time (the leaf: where the CPU was) and by inclusive time (what it was doing)."""
    frames = speedscope["shared"]["frames"]

    def label(index: int) -> str:
        frame = frames[index]
        where = Path(frame.get("file") or "?").name
        name = frame["name"] if len(frame["name"]) <= 120 else frame["name"][:117] + "..."  # C++ templates
        return f"{name} ({where}:{frame['line']})" if frame.get("line") else f"{name} ({where})"

    def leaf(stack: list[int]) -> str:
        # The leaf is often an unnamed libc address (a futex: waiting); its named callers say for what.
        named = [label(i) for i in stack[-4:] if not frames[i]["name"].startswith(("0x", *SPY_ROOTS))]
        return " < ".join(reversed(named[-2:])) if named else label(stack[-1])

    threads = []
    for prof in speedscope["profiles"]:
        _, pid, _, tid, *name = prof["name"].split(" ", 4)  # Process <pid> Thread <tid> "<name>"
        threads.append((roles.get(int(pid), f"pid {pid}"), f"{tid} {' '.join(name)}", prof["samples"]))
    total = sum(len(samples) for *_, samples in threads) or 1
    lines = [f"{'process':<28} {'thread':<36} {'sampled s':>9} {'share':>6}"]
    threads.sort(key=lambda t: -len(t[2]))
    for role, thread, samples in threads:
        lines.append(f"{role:<28} {thread[:36]:<36} {len(samples) / rate_hz:>9.2f} {len(samples) / total:>6.1%}")
    for role, thread, samples in threads:
        if len(samples) < total * 0.05:
            continue
        own: dict[str, int] = {}
        inclusive: dict[str, int] = {}
        for stack in samples:
            if stack:
                own[leaf(stack)] = own.get(leaf(stack), 0) + 1
            for name in {label(i) for i in stack if not frames[i]["name"].startswith(SPY_ROOTS)}:
                inclusive[name] = inclusive.get(name, 0) + 1
        lines.append(f"\n== {role}, thread {thread}: {len(samples)} samples")
        for title, counts in (("own", own), ("inclusive", inclusive)):
            lines.append(f"-- by {title} time" + (" (the leaf < its nearest named callers)" if title == "own" else ""))
            for name, count in sorted(counts.items(), key=lambda item: -item[1])[:top]:
                lines.append(f"{count / len(samples):>6.1%}  {name}")
    return "\n".join(lines) + "\n"
