"""The streaming load generator's client processes (standard library only, so that each starts quickly): a
closed loop of clients, each sending its next streamed request when the last one ended, recording when each request
was sent and when each token event arrived. One Python process parses only so many SSE events a second (its GIL):
the suites run several of these, so that the load generator is not what they measure.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from multiprocessing.connection import Connection


def token_of(event: dict, field: str) -> bool:
    """Whether an SSE event carries a token: an OpenAI chunk with text, or a generate_stream event with output."""
    if field == "choices":
        return bool(event.get("choices") and event["choices"][0].get("text"))
    return event.get(field) not in (None, "", [])


def one_stream(port: int, route: str, body: str, field: str) -> tuple[float, list[float]]:
    """POST the streaming request; (when it was sent, when each token event arrived)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        sent = time.perf_counter()
        connection.request("POST", route, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{route} answered {response.status}: {response.read()[:300]!r}")
        arrivals = []
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            if token_of(json.loads(line[len(b"data: ") :]), field):
                arrivals.append(time.perf_counter())
        return sent, arrivals
    finally:
        connection.close()


def closed_loop(
    port: int, route: str, body: str, field: str, clients: int, start: float, end: float
) -> tuple[list[float], list[tuple[float, ...]], int, float]:
    """`clients` threads until `end` (perf_counter, which is CLOCK_MONOTONIC: one clock for every process);
    (sent times and arrivals of the requests started in [start, end), errors, this process's CPU seconds in it)."""
    sent: list[float] = []
    arrivals: list[tuple[float, ...]] = []
    errors = [0]
    lock = threading.Lock()

    def client() -> None:
        while time.perf_counter() < end:
            try:
                began, tokens = one_stream(port, route, body, field)
            except (OSError, RuntimeError):
                with lock:
                    errors[0] += 1
                continue
            if start <= began < end:
                with lock:
                    sent.append(began)
                    arrivals.append(tuple(tokens))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, start - time.perf_counter()))
    cpu_before = time.process_time()
    time.sleep(max(0.0, end - time.perf_counter()))
    cpu_s = time.process_time() - cpu_before
    for thread in threads:
        thread.join()
    return sent, arrivals, errors[0], cpu_s


def shard(conn: Connection, port: int, route: str, body: str, field: str, clients: int) -> None:
    """A client process: says it is ready, gets the window (start, end), runs the loop, sends back its results."""
    conn.send("ready")
    start, end = conn.recv()
    conn.send(closed_loop(port, route, body, field, clients, start, end))
    conn.close()
