"""Triton's OpenAI frontend against Triton's own generate_stream, side by side in one run: the same prepared
repository (one `prepare`, the same engine double at the same delay per token), the same HTTP streaming client and
load, alternating. Real: tritonserver 2.51.0, server r24.12's OpenAI frontend on the in-process core
(tests/realopenai.py), upstream's pre/postprocessing. Targets (issue 19): at most 1 ms/token added at p50 at c=16,
at least 0.9x the tokens/s; if one is missed, `profile` records where the frontend's process spends its time.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks import serving_bench
from benchmarks.report import Metric, Target
from benchmarks.serving_stats import StreamRun, percentile
from tests import realopenai, realtriton
from tests.tiny_checkpoint import PROMPT

CONCURRENCY = (1, 16)
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


def load(port: int, api: Api, concurrency: int, warmup_s: float, measure_s: float) -> StreamRun:
    """Closed loop: `concurrency` clients, each sending its next request when the last one ended; what started in
    the measured window is counted."""
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
    for thread in threads:
        thread.join()
    return StreamRun(concurrency, measure_s, tuple(sent), tuple(arrivals), errors[0])


@dataclass(frozen=True)
class Servers:
    """The two command lines for one prepared repository, and the environment both run with."""

    triton_argv: list[str]
    openai_argv: list[str]
    env: dict[str, str]
    http_port: int
    openai_port: int
    frontend: realopenai.HostFrontend


def prepare(work: Path) -> Servers:
    layout = serving_bench.layout()
    frontend = realopenai.host_frontend(layout)
    bench = serving_bench.Bench(work, layout)
    openai_port = realtriton.free_port()
    env = bench.env(
        serving_bench.OURS,
        True,
        TRTLLM_ENGINE_DOUBLE_TOKEN_DELAY_S=str(TOKEN_DELAY_S),
        OPENAI_PORT=str(openai_port),
    )
    triton_argv = bench.prepare(env)
    openai_argv = realopenai.host_argv(frontend, bench.sandbox.prepare({**env, "FRONTEND": "openai"})["argv"])
    return Servers(triton_argv, openai_argv, frontend.environ(env), int(env["HTTP_PORT"]), openai_port, frontend)


def ready_at(servers: Servers, api: Api) -> tuple[str, str]:
    """(base URL, readiness route) of the server for `api`."""
    if api is OPENAI:
        return f"http://127.0.0.1:{servers.openai_port}", "/health/ready"
    return f"http://127.0.0.1:{servers.http_port}", "/v2/health/ready"


def started(servers: Servers, api: Api, log: Path) -> tuple[subprocess.Popen, float, int]:
    """Start the server for `api`; (the process, seconds to ready, the port to stream from)."""
    argv = servers.openai_argv if api is OPENAI else servers.triton_argv
    began = time.time()
    proc = serving_bench.start_server(argv, servers.env, log)
    url, route = ready_at(servers, api)
    ready = serving_bench.wait_ready(url, proc, route=route)
    port = servers.openai_port if api is OPENAI else servers.http_port
    return proc, ready - began, port


def measure(work: Path, warmup_s: float, measure_s: float, rounds: int, say: Say) -> dict:
    """Alternating rounds of each API at each concurrency; the raw runs and times to ready."""
    servers = prepare(work)
    runs: dict[tuple[str, int], list[StreamRun]] = {}
    ready: dict[str, list[float]] = {}
    for index in range(rounds):
        for api in (TRITON, OPENAI):
            proc, seconds, port = started(servers, api, work / f"{api.name}.log")
            ready.setdefault(api.name, []).append(seconds)
            try:
                for concurrency in CONCURRENCY:
                    say(f"openai bench: round {index + 1}/{rounds}, {api.name}, c={concurrency}")
                    runs.setdefault((api.name, concurrency), []).append(
                        load(port, api, concurrency, warmup_s, measure_s)
                    )
            finally:
                serving_bench.stop(proc)
    return {"runs": runs, "ready": ready}


def merged(runs: list[StreamRun]) -> StreamRun:
    return StreamRun(
        runs[0].concurrency,
        sum(r.seconds for r in runs),
        tuple(s for r in runs for s in r.sent_s),
        tuple(a for r in runs for a in r.arrivals_s),
        sum(r.errors for r in runs),
    )


def numbers(run: StreamRun) -> dict:
    return {
        "tokens_per_s": run.tokens_per_s,
        "itl_p50_ms": percentile(run.itl_s, 50) * 1e3,
        "itl_p99_ms": percentile(run.itl_s, 99) * 1e3,
        "ttft_p50_ms": percentile(run.ttft_s, 50) * 1e3,
        "requests": len(run.sent_s),
        "errors": run.errors,
    }


def metrics(measured: dict) -> list[Metric]:
    """Pure: the comparison rows from what `measure` returned."""
    rows = []
    summary = {key: numbers(merged(value)) for key, value in measured["runs"].items()}
    for concurrency in CONCURRENCY:
        triton, openai = summary[(TRITON.name, concurrency)], summary[(OPENAI.name, concurrency)]
        added = openai["itl_p50_ms"] - triton["itl_p50_ms"]
        ratio = openai["tokens_per_s"] / triton["tokens_per_s"]
        top = concurrency == max(CONCURRENCY)
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
        ]
    for name, samples in measured["ready"].items():
        rows.append(
            Metric(
                f"time to ready: {name} server (openai: the frontend's /health/ready)",
                sorted(samples)[len(samples) // 2],
                "s",
                details={"samples_s": samples},
            )
        )
    return rows


def profile(work: Path, measure_s: float, out: Path, say: Say) -> Path:
    """Where the frontend's process spends its time under the c=16 stream load: cProfile of main.py, written as a
    sorted text report to `out`."""
    import pstats  # noqa: PLC0415

    servers = prepare(work)
    stats_file = work / "openai.prof"
    bootstrap = work / "bootstrap.py"
    bootstrap.write_text(realopenai.HOST_BOOTSTRAP)
    out.parent.mkdir(parents=True, exist_ok=True)
    python, _, _, *rest = servers.openai_argv
    argv = [python, "-m", "cProfile", "-o", str(stats_file), str(bootstrap), *rest]
    proc = serving_bench.start_server(argv, servers.env, work / "profile.log")
    try:
        url, route = ready_at(servers, OPENAI)
        serving_bench.wait_ready(url, proc, route=route)
        say("openai bench: profiling the frontend at c=16")
        load(servers.openai_port, OPENAI, max(CONCURRENCY), 1.0, measure_s)
    finally:
        proc.send_signal(2)  # SIGINT: the frontend's own handler shuts down and cProfile writes its stats
        proc.wait(60)
    with open(out, "w") as text:
        # Own time first (where the process's CPU goes while it streams), then cumulative (start-up included).
        for order in ("tottime", "cumulative"):
            text.write(f"=== sorted by {order}\n")
            pstats.Stats(str(stats_file), stream=text).sort_stats(order).print_stats(40)
    return out


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
        "Triton's OpenAI frontend (r24.12) vs generate_stream, same repository, engine double at "
        f"{TOKEN_DELAY_S * 1e3:g} ms/token\n{subtitle}",
        fontsize=10,
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return None
