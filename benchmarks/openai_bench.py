"""Our OpenAI front against Triton's own generate_stream, back to back on the same running FRONTEND=openai process
tree (one `prepare`, run by the entrypoint's supervisor: harness/realfront.py), the same engine double at the same
delay per token, the same HTTP streaming client and load. Real: tritonserver 2.51.0, upstream's pre/postprocessing,
our front. Targets: at most 1 ms/token added at p50, at least 0.9x the tokens/s, at c=16 (c=64 from 16 usable CPUs,
target_concurrency); if one is missed, `profile` records where the process tree spends its time.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks import sandbox, serving_bench
from benchmarks.report import Metric, Target
from benchmarks.serving_stats import StreamRun, percentile
from harness import realfront, realtriton
from harness.tiny_checkpoint import PROMPT
from trtllm_entrypoint.config import cpus

CONCURRENCY = (1, 16, 64)
# Where the targets apply: c=16 on small machines (2 CPUs), c=64 from 16 usable CPUs (the lent 16-core machine).
LARGE_MACHINE_CPUS = 16
MAX_TOKENS = 32
TOKEN_DELAY_S = serving_bench.TOKEN_DELAY_S  # the serving suite's engine: 10 ms per token
ADDED_ITL_TARGET_MS = 1.0
TOKENS_RATIO_TARGET = 0.9
Say = Callable[[str], None]


@dataclass(frozen=True)
class Api:
    """One way to stream the same request: where to POST it and which SSE events carry a token."""

    name: str
    route: str
    body: dict

    def token_of(self, event: dict) -> bool:
        if self.name == "openai":
            return bool(event.get("choices") and event["choices"][0].get("text"))
        return bool(event.get("text_output"))


TRITON = Api(
    "generate_stream",
    "/v2/models/ensemble/generate_stream",
    {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "stream": True},
)
OPENAI = Api(
    "openai", "/v1/completions", {"model": "ensemble", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "stream": True}
)


def one_stream(port: int, api: Api) -> tuple[float, list[float]]:
    """POST the streaming request; (when it was sent, when each token event arrived)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        sent = time.perf_counter()
        connection.request("POST", api.route, json.dumps(api.body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{api.route} answered {response.status}: {response.read()[:300]!r}")
        arrivals = []
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            if api.token_of(json.loads(line[len(b"data: ") :])):
                arrivals.append(time.perf_counter())
        return sent, arrivals
    finally:
        connection.close()


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds used during the measured window: by the server's processes (its process group: the server and
    its Python-backend stubs) and by the load generator (this process)."""

    server_s: float
    client_s: float


def load(
    port: int, api: Api, concurrency: int, warmup_s: float, measure_s: float, pgid: int
) -> tuple[StreamRun, CpuUse]:
    """Closed loop: `concurrency` clients, each sending its next request when the last one ended; what started in
    the measured window is counted, and the CPU used in it."""
    start = time.perf_counter() + warmup_s
    end = start + measure_s
    sent: list[float] = []
    arrivals: list[tuple[float, ...]] = []
    errors = [0]
    lock = threading.Lock()

    def client() -> None:
        while time.perf_counter() < end:
            try:
                began, tokens = one_stream(port, api)
            except (OSError, RuntimeError):
                with lock:
                    errors[0] += 1
                continue
            if start <= began < end:
                with lock:
                    sent.append(began)
                    arrivals.append(tuple(tokens))

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, start - time.perf_counter()))
    server_before, client_before = serving_bench.group_cpu_s(pgid), time.process_time()
    time.sleep(max(0.0, end - time.perf_counter()))
    cpu = CpuUse(serving_bench.group_cpu_s(pgid) - server_before, time.process_time() - client_before)
    for thread in threads:
        thread.join()
    return StreamRun(concurrency, measure_s, tuple(sent), tuple(arrivals), errors[0]), cpu


@dataclass(frozen=True)
class Servers:
    """One prepared FRONTEND=openai plan (tritonserver's command line and the front's), and where each API answers."""

    prepared: dict
    env: dict[str, str]
    http_port: int
    openai_port: int
    layout: realtriton.Layout


def prepare(work: Path, workers: int | None = None) -> Servers:
    layout = serving_bench.layout()
    bench = serving_bench.Bench(work, layout)
    openai_port = realtriton.free_port()
    extra = {"OPENAI_WORKERS": str(workers)} if workers else {}
    env = bench.env(
        serving_bench.OURS,
        True,
        TRTLLM_ENGINE_DOUBLE_TOKEN_DELAY_S=str(TOKEN_DELAY_S),
        FRONTEND="openai",
        SERVED_MODEL_NAME="ensemble",  # one name for both APIs' requests (the front's would be the model's own)
        OPENAI_PORT=str(openai_port),
        **extra,
    )
    prepared = bench.sandbox.prepare(env)
    return Servers(prepared, env, int(env["HTTP_PORT"]), openai_port, layout)


@contextmanager
def started(servers: Servers, log_dir: Path) -> Iterator[tuple[realfront.RunningFront, float]]:
    """The whole FRONTEND=openai process tree, as `serve` runs it; (it, seconds to the front's readiness)."""
    began = time.time()
    with realfront.start(
        servers.layout, servers.prepared, sandbox.BENCH_ADMIN_KEY, env=servers.env, log_dir=log_dir, ready_timeout_s=300
    ) as tree:
        yield tree, time.time() - began


def measure(work: Path, warmup_s: float, measure_s: float, rounds: int, say: Say) -> dict:
    """Rounds of both APIs, back to back on the same running tree, at each concurrency; the raw runs, the CPU
    they used (the whole tree's) and the times to ready."""
    servers = prepare(work)
    runs: dict[tuple[str, int], list[StreamRun]] = {}
    cpu: dict[tuple[str, int], list[CpuUse]] = {}
    ready: dict[str, list[float]] = {}
    for index in range(rounds):
        with started(servers, work) as (tree, seconds):
            ready.setdefault(OPENAI.name, []).append(seconds)
            for concurrency in CONCURRENCY:
                for api, port in ((TRITON, servers.http_port), (OPENAI, servers.openai_port)):
                    say(f"openai bench: round {index + 1}/{rounds}, {api.name}, c={concurrency}")
                    run, used = load(port, api, concurrency, warmup_s, measure_s, tree.process.pid)
                    runs.setdefault((api.name, concurrency), []).append(run)
                    cpu.setdefault((api.name, concurrency), []).append(used)
    return {
        "runs": runs,
        "cpu": cpu,
        "ready": ready,
        "workers": servers.prepared["front"]["workers"],
        "target_concurrency": target_concurrency(cpus.usable_cpus()),
    }


def target_concurrency(usable_cpus: int) -> int:
    """The concurrency the targets hold at on a machine with `usable_cpus`."""
    return 64 if usable_cpus >= LARGE_MACHINE_CPUS else 16


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
    tokens = run.tokens_per_s * run.seconds
    return {
        "tokens_per_s": run.tokens_per_s,
        "server_cpu_ms_per_token": sum(c.server_s for c in cpu) / tokens * 1e3,
        "client_cpu_ms_per_token": sum(c.client_s for c in cpu) / tokens * 1e3,
        "cpus_busy": sum(c.server_s + c.client_s for c in cpu) / run.seconds,
        "itl_p50_ms": percentile(run.itl_s, 50) * 1e3,
        "itl_p99_ms": percentile(run.itl_s, 99) * 1e3,
        "ttft_p50_ms": percentile(run.ttft_s, 50) * 1e3,
        "requests": len(run.sent_s),
        "errors": run.errors,
    }


def metrics(measured: dict) -> list[Metric]:
    """Pure: the comparison rows from what `measure` returned."""
    rows = []
    summary = {key: numbers(merged(value), measured["cpu"][key]) for key, value in measured["runs"].items()}
    for concurrency in CONCURRENCY:
        triton, openai = summary[(TRITON.name, concurrency)], summary[(OPENAI.name, concurrency)]
        added = openai["itl_p50_ms"] - triton["itl_p50_ms"]
        ratio = openai["tokens_per_s"] / triton["tokens_per_s"]
        top = concurrency == measured["target_concurrency"]
        rows += [
            Metric(
                f"openai vs generate_stream c={concurrency}: p50 ITL added",
                added,
                "ms",
                Target("<=", ADDED_ITL_TARGET_MS, "ms") if top else None,
                note=f"p50 ITL {openai['itl_p50_ms']:.2f} vs {triton['itl_p50_ms']:.2f} ms (engine double at "
                f"{TOKEN_DELAY_S * 1e3:g} ms/token)",
                details={"openai": openai, "generate_stream": triton},
            ),
            Metric(
                f"openai vs generate_stream c={concurrency}: tokens/s ratio",
                ratio,
                "x",
                Target(">=", TOKENS_RATIO_TARGET, "x") if top else None,
                note=f"{openai['tokens_per_s']:.0f} vs {triton['tokens_per_s']:.0f} tokens/s",
            ),
            Metric(
                f"openai vs generate_stream c={concurrency}: server CPU per token",
                openai["server_cpu_ms_per_token"],
                "ms",
                note=f"vs {triton['server_cpu_ms_per_token']:.2f} ms; load generator "
                f"{openai['client_cpu_ms_per_token']:.2f} vs {triton['client_cpu_ms_per_token']:.2f} ms; CPUs busy "
                f"(server + load) {openai['cpus_busy']:.2f} vs {triton['cpus_busy']:.2f} of {os.cpu_count()}",
            ),
        ]
    samples = measured["ready"][OPENAI.name]
    rows.append(
        Metric(
            "time to ready: tritonserver and the OpenAI front (its /health/ready)",
            sorted(samples)[len(samples) // 2],
            "s",
            details={"samples_s": samples},
        )
    )
    return rows


def profile(work: Path, measure_s: float, out: Path, say: Say) -> str:
    """Where the frontend's process spends its time under the stream load the targets hold at (target_concurrency):
    py-spy samples every thread of the
    frontend and of its stub processes, native frames (Triton's C++, pybind11, libc) included. The summary goes to
    `out`, py-spy's speedscope file beside it. Returns what was written, or why nothing was."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return "no profile: py-spy is not installed (pip install -e '.[bench]')"
    servers = prepare(work)
    at = target_concurrency(cpus.usable_cpus())
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
        run, used = load(servers.openai_port, OPENAI, at, warmup_s, measure_s, proc.pid)
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
    """Tokens/s and p50 inter-token latency of both APIs at each concurrency; None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    added = [m for m in rows if m.name.endswith("p50 ITL added") and m.details]
    if not added:
        return "no results to plot"
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=120)
    width = 0.38
    for offset, (api, colour) in enumerate(((TRITON.name, "tab:gray"), (OPENAI.name, "tab:blue"))):
        xs = [i + (offset - 0.5) * width for i in range(len(added))]
        left.bar(xs, [m.details[api]["tokens_per_s"] for m in added], width, color=colour, label=api)
        right.bar(xs, [m.details[api]["itl_p50_ms"] for m in added], width, color=colour, label=api)
    labels = [m.name.split(" c=")[1].split(":")[0] for m in added]
    for axis, title, unit in ((left, "Streamed tokens/s", "tokens/s"), (right, "p50 inter-token latency", "ms")):
        axis.set_xticks(range(len(added)), [f"c={c}" for c in labels])
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(True, axis="y", alpha=0.3)
    left.legend(loc="upper left", fontsize=8)
    figure.suptitle(
        "The OpenAI front vs generate_stream, same running server, engine double at "
        f"{TOKEN_DELAY_S * 1e3:g} ms/token\n{subtitle}",
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
            roles[int(proc.name)] = "front worker" if b"trtllm_entrypoint.openai" in args else "supervisor"
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
