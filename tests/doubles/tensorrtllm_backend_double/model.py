"""Test double of TensorRT-LLM's `tensorrtllm` Triton backend (the C++ backend needs a GPU and is not public).

Installed as /opt/tritonserver/backends/tensorrtllm/model.py, a Triton *Python-based backend*: the real Triton
server runs it for every model whose config says `backend: "tensorrtllm"`. It behaves like the real backend where
our images depend on it:
- reads the engine directory from the `gpt_model_path` (or `engine_dir`) parameter and the engine's config.json;
- fails the load when the engine was built for another world size than the MPI job's (OMPI_COMM_WORLD_SIZE) or
  when `rank<N>.engine` for this process's rank is missing;
- answers a prompt longer than the engine's max_input_len with an error response;
- "generates" deterministic tokens: the prompt's ids, last to first, repeated up to the requested length;
- streams one response per token when the model is decoupled and the request asks for `streaming`;
- LoRA as the C++ backend does it from v0.19.0: loads every numeric folder of the `lora_prefetch_dir` parameter at
  start (model.lora_weights.npy and model.lora_config.npy, read with numpy; other names are skipped with a warning),
  refuses a request's `lora_task_id` when the engine was built without the LoRA plugin or when the task is not
  cached ("LoRA task … not found in cache"), and records each request's `lora_task_id` (null without one) as a JSON
  line in $DOUBLE_RECORD_DIR/tensorrtllm_backend.jsonl, for tests to read back;
- returns the outputs the request asks for (all the config declares when it names none), with their declared
  types, as the real backend does. Sending more crashes a Python >= 3.12 stub: the stub drops the outputs nobody asked
  for after it has released the GIL, and 3.12's allocator needs the GIL to free them (a segfault, which Triton reports
  as "Stub process … is not healthy"); an ensemble names only the outputs it maps.
- guided decoding (tensorrtllm_backend v0.19.0 on): with `guided_decoding_backend` and
  `xgrammar_tokenizer_info_path` both set, it reads the tokenizer-info file at load as model_instance_state.cc does
  (it must exist, be JSON and hold `encoded_vocab`, `tokenizer_str` and `stop_token_ids`; a backend other than
  xgrammar fails the load); either unset, guided decoding is off, silently, as upstream's. With DOUBLE_RECORD_DIR
  set, each request's guide inputs go to tensorrtllm_requests.jsonl there, beside whether guided decoding was on:
  what reached the engine through Triton, which enforced the declared names and types on the way.
TRTLLM_ENGINE_DOUBLE_TOKEN_DELAY_S (seconds per token) keeps a request in flight for drain tests and stands for a
model's decode step in benchmarks: in decoupled mode, as the real backend does, execute() hands the requests to an
engine thread and returns at once; each step of that thread (one delay) gives every request in flight its next token
(in-flight batching), so concurrent streams advance together instead of one after the other;
TRTLLM_ENGINE_DOUBLE_LOAD_DELAY_S (seconds) makes the load slow, as a large engine's is, for readiness tests.
TRTLLM_ENGINE_DOUBLE_ECHO=1 answers the prompt's ids first to last instead (repeated up to the requested length), so
that a prompt's characters of several tokens come back whole: the exact-text tests' generated ids are then text.
TRTLLM_ENGINE_DOUBLE_INLINE=1 (decoupled, no delay) sends each request's tokens from execute() itself, as fast as the
stub can: the benchmarks' stand-in for an engine that is not the ceiling (the engine thread tops out at a few thousand
tokens/s, this at tens of thousands), with the same inputs honoured and outputs returned.
"""

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(config, *names):
    for name in names:
        value = (config.get("parameters") or {}).get(name, {}).get("string_value", "")
        if value and not value.startswith("${"):
            return value
    return None


def _engine_world_size(engine_config):
    mapping = (engine_config.get("pretrained_config") or {}).get("mapping") or {}
    if "world_size" in mapping:
        return int(mapping["world_size"])
    return int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1))


def _record(entry, name="tensorrtllm_backend.jsonl"):
    """One JSON line per request in $DOUBLE_RECORD_DIR/<name> (one write on an O_APPEND descriptor: lines never
    interleave)."""
    directory = os.environ.get("DOUBLE_RECORD_DIR")
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def _prefetch(directory):
    """The LoRA tasks the real backend loads from lora_prefetch_dir at start: folder name -> rows of its config."""
    tasks = {}
    if not directory or not os.path.isdir(directory):
        return tasks
    for entry in sorted(os.listdir(directory)):
        folder = os.path.join(directory, entry)
        if not os.path.isdir(folder):
            continue
        if not entry.isdigit():
            print(f"[TensorRT-LLM][WARNING] lora task name {entry} is invalid, skipping", flush=True)
            continue
        weights = np.load(os.path.join(folder, "model.lora_weights.npy"))
        config = np.load(os.path.join(folder, "model.lora_config.npy"))
        if config.ndim != 3 or config.shape[2] != 3 or weights.shape[:2] != config.shape[:2]:
            raise pb_utils.TritonModelException(
                f"[TensorRT-LLM][ERROR] LoRA task {entry}: weights {weights.shape} and config {config.shape} disagree"
            )
        tasks[int(entry)] = int(config.shape[1])
    return tasks


def _first(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor.as_numpy().reshape(-1)[0] if tensor is not None else default


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        engine_dir = _param(config, "gpt_model_path", "engine_dir")
        if engine_dir is None:
            raise pb_utils.TritonModelException("[TensorRT-LLM][ERROR] gpt_model_path is not set")
        engine_config_path = Path(engine_dir) / "config.json"
        try:
            engine_config = json.loads(engine_config_path.read_text())
        except (OSError, ValueError) as exc:
            raise pb_utils.TritonModelException(
                f"[TensorRT-LLM][ERROR] cannot read {engine_config_path}: {exc}"
            ) from None
        world_size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        engine_world = _engine_world_size(engine_config)
        # Orchestrator mode (TRTLLM_ORCHESTRATOR=1, what Triton's OpenAI frontend needs): one process, which spawns
        # the engine's workers itself; every rank's engine file must then be there.
        orchestrator = os.environ.get("TRTLLM_ORCHESTRATOR") == "1" and world_size == 1
        if orchestrator:
            missing = [r for r in range(engine_world) if not (Path(engine_dir) / f"rank{r}.engine").is_file()]
            if missing:
                raise pb_utils.TritonModelException(
                    f"[TensorRT-LLM][ERROR] orchestrator mode: no rank{missing[0]}.engine in {engine_dir}"
                )
            print(f"tensorrtllm backend double: orchestrator for {engine_world} workers", flush=True)
        elif engine_world != world_size:
            raise pb_utils.TritonModelException(
                f"[TensorRT-LLM][ERROR] the engine was built for world size {engine_world}, "
                f"but the MPI world size is {world_size}"
            )
        if not (Path(engine_dir) / f"rank{rank}.engine").is_file():
            raise pb_utils.TritonModelException(f"[TensorRT-LLM][ERROR] no rank{rank}.engine in {engine_dir}")
        self.guided = self._guided_decoding(config)
        build = engine_config.get("build_config") or {}
        self.max_input_len = int(build.get("max_input_len", 1024))
        # The real engine records --lora_plugin in its build_config (plugin_config.lora_plugin); the build double
        # keeps every flag it was given at the top of build_config.
        self.lora_plugin = bool(build.get("lora_plugin") or (build.get("plugin_config") or {}).get("lora_plugin"))
        self.lora_tasks = _prefetch(_param(config, "lora_prefetch_dir"))
        if self.lora_tasks:
            print(f"tensorrtllm backend double: prefetched LoRA tasks {sorted(self.lora_tasks)}", flush=True)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.exclude_input = _param(config, "exclude_input_in_output") == "true"
        self.delay_s = float(os.environ.get("TRTLLM_ENGINE_DOUBLE_TOKEN_DELAY_S") or 0)
        self.inline = os.environ.get("TRTLLM_ENGINE_DOUBLE_INLINE") == "1" and not self.delay_s
        # A C++ engine answers many requests at once; the stub's send waits for tritonserver without the GIL, so
        # one sending thread per request in flight keeps the round trips from adding up.
        self.senders = ThreadPoolExecutor(max_workers=64) if self.inline else None
        self.outputs = [
            (o["name"], pb_utils.triton_string_to_numpy(o["data_type"]), o["dims"]) for o in config["output"]
        ]
        self.in_flight = []  # [request, sender, streaming, tokens, steps left]: the engine thread's batch
        self.wake = threading.Condition()
        if self.decoupled and not self.inline:
            threading.Thread(target=self._engine_loop, daemon=True).start()
        time.sleep(float(os.environ.get("TRTLLM_ENGINE_DOUBLE_LOAD_DELAY_S") or 0))
        print(f"tensorrtllm backend double: rank {rank}/{world_size} loaded {engine_dir}", flush=True)

    @staticmethod
    def _guided_decoding(config):
        """Whether guided decoding is on, checked as the C++ backend checks its parameters at load."""
        backend = _param(config, "guided_decoding_backend")
        info_path = _param(config, "xgrammar_tokenizer_info_path")
        if not backend or not info_path:
            return False
        if backend != "xgrammar":
            raise pb_utils.TritonModelException(
                "[TensorRT-LLM][ERROR] Guided decoding is currently supported with 'xgrammar' backend. "
                "Invalid guided_decoding_backend parameter provided."
            )
        try:
            info = json.loads(Path(info_path).read_text())
        except (OSError, ValueError) as exc:
            raise pb_utils.TritonModelException(
                f"[TensorRT-LLM][ERROR] Xgrammar's tokenizer info path at {info_path} cannot be read: {exc}"
            ) from None
        shapes = {"encoded_vocab": list, "tokenizer_str": str, "stop_token_ids": list}
        if not all(isinstance(info.get(key), kind) for key, kind in shapes.items()):
            raise pb_utils.TritonModelException(f"[TensorRT-LLM][ERROR] {info_path} lacks {', '.join(shapes)}")
        return True

    def _record_guides(self, request):
        if not os.environ.get("DOUBLE_RECORD_DIR"):
            return
        entry = {"guided_decoding": self.guided}
        for name in ("guided_decoding_guide_type", "guided_decoding_guide"):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                value = tensor.as_numpy().reshape(-1)[0]
                entry[name] = value.decode() if isinstance(value, bytes) else str(value)
        _record(entry, "tensorrtllm_requests.jsonl")

    def _response(self, request, tokens, wanted=None):
        """One response holding `tokens` as output_ids; every other output the request asks for (or `wanted`)
        zero-filled."""
        wanted = set(request.requested_output_names()) if wanted is None else wanted
        known = {
            "output_ids": np.array(tokens, dtype=np.int32).reshape(1, 1, -1),
            "sequence_length": np.array([[len(tokens)]], dtype=np.int32),
        }
        tensors = []
        for name, dtype, dims in self.outputs:
            if name not in wanted:
                continue
            value = known.get(name)
            if value is None:
                value = np.zeros([1] + [1 if d == -1 else d for d in dims], dtype=dtype)
            tensors.append(pb_utils.Tensor(name, value.astype(dtype)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _generate(self, request, streaming=False, delay_s=None):
        """The request's tokens one at a time (a stream never repeats the prompt), or raise ValueError for a
        request the real backend rejects. Generation ends before a token equal to the request's end_id, which is not
        returned, as the real engine stops at the end token."""
        ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1).tolist()
        ids = ids[: int(_first(request, "input_lengths", len(ids)))]
        task = _first(request, "lora_task_id", None)
        task = None if task is None else int(task)
        _record({"lora_task_id": task, "input_ids": len(ids), "pid": os.getpid()})
        if task is not None and not self.lora_plugin:
            raise ValueError(f"[TensorRT-LLM][ERROR] lora_task_id {task} given, but the engine has no LoRA plugin")
        if task is not None and task not in self.lora_tasks:
            raise ValueError(
                f"[TensorRT-LLM][ERROR] LoRA task {task} not found in cache. Please send LoRA weights with request"
            )
        if len(ids) > self.max_input_len:
            raise ValueError(
                f"[TensorRT-LLM][ERROR] the prompt has {len(ids)} tokens, more than the engine's "
                f"max_input_len {self.max_input_len}"
            )
        wanted = int(_first(request, "request_output_len", 16))
        exclude = bool(_first(request, "exclude_input_in_output", self.exclude_input))
        if not (exclude or streaming):
            yield from ids
        pattern = (ids if os.environ.get("TRTLLM_ENGINE_DOUBLE_ECHO") == "1" else list(reversed(ids))) or [0]
        end_id = _first(request, "end_id", None)
        delay_s = self.delay_s if delay_s is None else delay_s
        for i in range(wanted):
            if delay_s:  # even sleep(0) is a system call per token, which the fast stand-in cannot afford
                time.sleep(delay_s)
            token = pattern[i % len(pattern)]
            if end_id is not None and token == end_id:
                return
            yield token

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                self._admit(request)
            return None
        responses = []
        for request in requests:
            self._record_guides(request)
            try:
                if bool(_first(request, "streaming", False)):
                    raise ValueError("[TensorRT-LLM][ERROR] streaming is only supported in decoupled mode")
                responses.append(self._response(request, list(self._generate(request))))
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))))
        return responses

    def _admit(self, request):
        """Check the request and add it to the engine thread's batch (an invalid one is answered at once)."""
        sender = request.get_response_sender()
        self._record_guides(request)
        try:
            streaming = bool(_first(request, "streaming", False))
            tokens = list(self._generate(request, streaming=streaming, delay_s=0))
            exclude = streaming or bool(_first(request, "exclude_input_in_output", self.exclude_input))
            steps = len(tokens) - (0 if exclude else int(_first(request, "input_lengths", 0)))
        except ValueError as exc:
            sender.send(
                pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        if self.inline:
            # Only what a step computes for this request: a C++ engine builds responses at no cost to a Python stub,
            # so the stand-in leaves out the zero-filled logits and statistics, or building them would be its ceiling.
            per_step = {"output_ids", "sequence_length"}
            if bool(_first(request, "return_log_probs", False)):
                per_step |= {"output_log_probs", "cum_log_probs"}
            wanted = per_step & set(request.requested_output_names())
            self.senders.submit(self._send_all, request, sender, streaming, tokens, steps, wanted)
            return
        with self.wake:
            self.in_flight.append([request, sender, streaming, tokens, steps])
            self.wake.notify()

    def _send_all(self, request, sender, streaming, tokens, steps, wanted):
        """One request's responses, in order, as fast as the stub sends them (TRTLLM_ENGINE_DOUBLE_INLINE)."""
        if streaming:
            for token in tokens[len(tokens) - steps :]:
                sender.send(self._response(request, [token], wanted))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            sender.send(self._response(request, tokens), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _engine_loop(self):
        """One step per delay: every request in flight gets its next token; a finished one its final flag. Only
        this thread sends, so responses of one request never race each other."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        step_at = time.monotonic()
        while True:
            with self.wake:
                if not self.in_flight:
                    while not self.in_flight:
                        self.wake.wait()
                    step_at = time.monotonic()
                batch = list(self.in_flight)
            # A step lasts `delay` in all, sending included, as a GPU step does whatever the batch size.
            step_at += self.delay_s
            time.sleep(max(0.0, step_at - time.monotonic()))
            for item in batch:
                request, sender, streaming, tokens, steps = item
                if streaming and steps > 0:
                    sender.send(self._response(request, [tokens[len(tokens) - steps]]))
                item[4] = steps = steps - 1
                if steps <= 0:
                    if streaming:
                        sender.send(flags=final)
                    else:
                        sender.send(self._response(request, tokens), flags=final)
                    with self.wake:
                        self.in_flight.remove(item)

    def finalize(self):
        print("tensorrtllm backend double: unloaded", flush=True)
