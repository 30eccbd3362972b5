"""Closed-loop load on a Triton server with tritonclient's asyncio gRPC client: unary `infer` on the ensemble, and
streaming through gRPC ModelStreamInfer (a decoupled ensemble answers once per token).

Every client is a coroutine in one event loop of this process, so the load generator costs one core at most; the
numbers are what the server does with the other. A warm-up window runs first and is not counted.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from benchmarks.serving_stats import StreamRun, UnaryRun
from harness.tiny_checkpoint import PROMPT

ENSEMBLE, ENGINE = "ensemble", "tensorrt_llm"
MAX_TOKENS = 16  # generated per request; the prompt is the tiny checkpoint's 6 tokens


def _tensor(name: str, value: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


def request_inputs(model: str, stream: bool) -> list[grpcclient.InferInput]:
    """The ensemble's text_input and max_tokens (plus `stream`: the engine streams only when asked), or the engine
    model's own inputs (the prompt's token ids), to time the engine without pre- and postprocessing."""
    if model == ENGINE:
        ids = np.arange(3, 3 + len(PROMPT.split()), dtype=np.int32).reshape(1, -1)
        inputs = [
            _tensor("input_ids", ids, "INT32"),
            _tensor("input_lengths", np.array([[ids.shape[1]]], dtype=np.int32), "INT32"),
            _tensor("request_output_len", np.array([[MAX_TOKENS]], dtype=np.int32), "INT32"),
        ]
        flag = "streaming"
    else:
        inputs = [
            _tensor("text_input", np.array([[PROMPT.encode()]], dtype=object), "BYTES"),
            _tensor("max_tokens", np.array([[MAX_TOKENS]], dtype=np.int32), "INT32"),
        ]
        flag = "stream"
    if stream:
        inputs.append(_tensor(flag, np.array([[True]]), "BOOL"))
    return inputs


async def _unary(url: str, model: str, concurrency: int, warmup_s: float, measure_s: float) -> UnaryRun:
    client = grpcaio.InferenceServerClient(url)
    inputs = request_inputs(model, stream=False)
    outputs = [grpcclient.InferRequestedOutput("text_output" if model == ENSEMBLE else "output_ids")]
    start = time.perf_counter() + warmup_s
    end = start + measure_s
    latencies: list[float] = []
    errors = 0

    async def user() -> None:
        nonlocal errors
        while (sent := time.perf_counter()) < end:
            try:
                await client.infer(model, inputs, outputs=outputs)
            except grpcaio.InferenceServerException:
                errors += 1
                continue
            done = time.perf_counter()
            if sent >= start and done <= end:
                latencies.append(done - sent)

    try:
        await asyncio.gather(*(user() for _ in range(concurrency)))
    finally:
        await client.close()
    return UnaryRun(concurrency, measure_s, tuple(latencies), errors)


async def _streaming(url: str, model: str, concurrency: int, warmup_s: float, measure_s: float) -> StreamRun:
    client = grpcaio.InferenceServerClient(url)
    inputs = request_inputs(model, stream=True)
    start = time.perf_counter() + warmup_s
    end = start + measure_s
    sent_at: list[float] = []
    arrivals: list[tuple[float, ...]] = []
    errors = 0

    async def user(index: int) -> None:
        """One gRPC stream; the next request goes out when the last one's last token is in. The ensemble does not
        pass on the engine's empty final response, so a request is complete after MAX_TOKENS tokens (the engine
        double never stops early) or a response flagged final."""
        nonlocal errors
        queue: asyncio.Queue = asyncio.Queue()

        async def requests():
            while (item := await queue.get()) is not None:
                yield item

        responses = client.stream_infer(requests())
        number = 0
        while (sent := time.perf_counter()) < end:
            number += 1
            await queue.put({"model_name": model, "inputs": inputs, "request_id": f"{index}-{number}"})
            tokens: list[float] = []
            async for result, error in responses:
                if error is not None:
                    errors += 1
                    break
                response = result.get_response()
                if response.outputs:
                    tokens.append(time.perf_counter())
                if len(tokens) == MAX_TOKENS or response.parameters["triton_final_response"].bool_param:
                    break
            if sent >= start and tokens and tokens[-1] <= end:
                sent_at.append(sent)
                arrivals.append(tuple(tokens))
        await queue.put(None)
        responses.cancel()

    try:
        await asyncio.gather(*(user(i) for i in range(concurrency)))
    finally:
        await client.close()
    return StreamRun(concurrency, measure_s, tuple(sent_at), tuple(arrivals), errors)


def unary(url: str, model: str, concurrency: int, warmup_s: float, measure_s: float) -> UnaryRun:
    return asyncio.run(_unary(url, model, concurrency, warmup_s, measure_s))


def streaming(url: str, model: str, concurrency: int, warmup_s: float, measure_s: float) -> StreamRun:
    return asyncio.run(_streaming(url, model, concurrency, warmup_s, measure_s))
