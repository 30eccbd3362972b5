"""Test double of TensorRT-LLM's LLM-API Triton model (`llmapi/tensorrt_llm/1/model.py`; upstream code may not be
copied here, and the real one needs TensorRT-LLM and a GPU). Like the real one it takes max_batch_size and the
decoupled policy from the `triton_config` of the model.yaml beside it through Triton's auto-complete, loads the
tokenizer of model.yaml's `model`, and answers `text_input` with `text_output`, streamed one token per response when
decoupled and asked to: each response holds the whole text so far (a character not yet complete waits for its last
token, as the LLM API's incremental decoding holds it), as the real model sends the LLM API's
`output.text` (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py, `_create_response`, at TensorRT-LLM commits
b35ac1b6 and 044a90d2). The "generated" tokens are the prompt's, last to first, repeated up to
`sampling_param_max_tokens` (first to last with TRTLLM_ENGINE_DOUBLE_ECHO=1, as the engine double), decoded as
the LLM API does by default (skip_special_tokens); every other declared output is zero. `sampling_param_stop` works
as in the LLM API (tensorrt_llm/executor/result.py, sampling_params.py): each stop string's token ids (encoded
without special tokens) end generation where the tokens end with them, and are trimmed from the ids; streamed, the
last response decodes what is left after the ids sent before, which is nothing, so its text is the previous one
(a stop of several tokens keeps the text of those sent before its last).
"""

import json
import os
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml
from transformers import AutoTokenizer

MODEL_YAML = Path(__file__).with_name("model.yaml")


def _first(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor.as_numpy().reshape(-1)[0] if tensor is not None else default


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        triton = yaml.safe_load(MODEL_YAML.read_text()).get("triton_config") or {}
        auto_complete_model_config.set_max_batch_size(int(triton.get("max_batch_size", 0)))
        auto_complete_model_config.set_model_transaction_policy({"decoupled": bool(triton.get("decoupled"))})
        return auto_complete_model_config

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.tokenizer = AutoTokenizer.from_pretrained(yaml.safe_load(MODEL_YAML.read_text())["model"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.outputs = [(o["name"], pb_utils.triton_string_to_numpy(o["data_type"])) for o in config["output"]]

    def _text(self, tokens):
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _response(self, text):
        text = text.encode()
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor(name, np.array([text], dtype=object) if name == "text_output" else np.zeros(1, dtype))
                for name, dtype in self.outputs
            ]
        )

    def _tokens(self, request):
        """The generated ids, and how many of them at the end are a stop string's (0: none ended them)."""
        prompt = _first(request, "text_input", b"")
        ids = self.tokenizer.encode(prompt.decode() if isinstance(prompt, bytes) else str(prompt))
        pattern = (ids if os.environ.get("TRTLLM_ENGINE_DOUBLE_ECHO") == "1" else list(reversed(ids))) or [0]
        stops = pb_utils.get_input_tensor_by_name(request, "sampling_param_stop")
        words = (
            []
            if stops is None
            else [s.decode() if isinstance(s, bytes) else str(s) for s in stops.as_numpy().reshape(-1)]
        )
        stop_ids = [self.tokenizer.encode(word, add_special_tokens=False) for word in words if word]
        tokens = []
        for i in range(int(_first(request, "sampling_param_max_tokens", 16))):
            tokens.append(pattern[i % len(pattern)])
            hit = next((ids for ids in stop_ids if ids and tokens[-len(ids) :] == ids), None)
            if hit is not None:
                return tokens, len(hit)
        return tokens, 0

    @staticmethod
    def _kept(tokens, stop):
        return tokens[: len(tokens) - stop]

    def execute(self, requests):
        if not self.decoupled:
            return [
                self._response(self._text(self._kept(*self._tokens(request))))
                if not _first(request, "streaming", False)
                else pb_utils.InferenceResponse(error=pb_utils.TritonError("streaming needs a decoupled model"))
                for request in requests
            ]
        for request in requests:
            sender = request.get_response_sender()
            tokens, stop = self._tokens(request)
            if _first(request, "streaming", False):
                # The LLM API's text only grows: a character not yet complete (`�` at the end) waits for its bytes.
                sent = ""
                for count in range(1, len(tokens) + (0 if stop else 1)):
                    text = self._text(tokens[:count])
                    if text.endswith("\ufffd") and count < len(tokens):
                        text = sent
                    sender.send(self._response(text))
                    sent = text
                if stop:  # the stop's last token came, its ids were trimmed: the last text is the one before
                    sender.send(self._response(sent))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(
                    self._response(self._text(self._kept(tokens, stop))),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
        return None
