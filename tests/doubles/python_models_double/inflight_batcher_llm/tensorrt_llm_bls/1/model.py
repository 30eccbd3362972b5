"""Test double of tensorrtllm_backend's `tensorrt_llm_bls` model.py (upstream code may not be copied here; the
upstream one also imports torch). Like the real one it calls preprocessing, the engine model named by its
`tensorrt_llm_model_name` parameter, and postprocessing in turn (business logic scripting), then answers with
`text_output` and every other declared output (zeros). One response per request: no token streaming.
"""

import json
import re
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

# (model input, where its value comes from): the tensor names every template version shares.
PREPROCESSING = {
    "QUERY": "text_input",
    "REQUEST_OUTPUT_LEN": "max_tokens",
    "BAD_WORDS_DICT": "bad_words",
    "STOP_WORDS_DICT": "stop_words",
}
ENGINE = {
    "input_ids": "INPUT_ID",
    "input_lengths": "REQUEST_INPUT_LEN",
    "request_output_len": "REQUEST_OUTPUT_LEN",
    "end_id": "OUT_END_ID",
    "pad_id": "OUT_PAD_ID",
    "stop_words_list": "STOP_WORDS_IDS",
    "bad_words_list": "BAD_WORDS_IDS",
}
POSTPROCESSING = {
    "TOKENS_BATCH": "output_ids",
    "SEQUENCE_LENGTH": "sequence_length",
    "CUM_LOG_PROBS": "cum_log_probs",
    "OUTPUT_LOG_PROBS": "output_log_probs",
}


def _call(model, wiring, source, repository):
    """Run `model` with its inputs taken from `source` (name -> Tensor) through `wiring`, limited to the tensors
    its config declares (they differ between template versions); its outputs by name."""
    declared = set(re.findall(r'name:\s*"(\w+)"', (repository / model / "config.pbtxt").read_text()))
    inputs = [
        pb_utils.Tensor(name, source[origin].as_numpy())
        for name, origin in wiring.items()
        if origin in source and name in declared
    ]
    response = pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=[]).exec()
    if response.has_error():
        raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
    return {t.name(): t for t in response.output_tensors()}


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        name = config.get("parameters", {}).get("tensorrt_llm_model_name", {}).get("string_value", "")
        self.engine = name if name and not name.startswith("${") else "tensorrt_llm"  # older templates lack it
        self.repository = Path(args["model_repository"]).parent
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.outputs = [
            (o["name"], pb_utils.triton_string_to_numpy(o["data_type"]), o["dims"]) for o in config["output"]
        ]

    def _answer(self, request):
        given = {t.name(): t for t in request.inputs()}
        tensors = _call("preprocessing", PREPROCESSING, given, self.repository)
        tensors.update(_call(self.engine, ENGINE, tensors, self.repository))
        text = _call("postprocessing", POSTPROCESSING, tensors, self.repository)["OUTPUT"].as_numpy().reshape(-1)
        outputs = []
        for name, dtype, dims in self.outputs:
            value = text if name == "text_output" else np.zeros([1 if d == -1 else d for d in dims])
            outputs.append(pb_utils.Tensor(name, value.astype(dtype)))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                response = self._answer(request)
            except pb_utils.TritonModelException as exc:
                response = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc)))
            if not self.decoupled:
                responses.append(response)
                continue
            request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None if self.decoupled else responses
