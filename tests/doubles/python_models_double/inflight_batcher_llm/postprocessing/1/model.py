"""Test double of tensorrtllm_backend's `postprocessing` model.py (upstream code may not be copied here, and CI
cannot download it). Like the real one it reads `tokenizer_dir` (and `skip_special_tokens`) from its config's
parameters and decodes each beam's TOKENS_BATCH up to its SEQUENCE_LENGTH to text with transformers'
AutoTokenizer, into one flat list of texts (batch × beam), the shape clients of the real model see. Every other
declared output `OUT_<X>` passes input `<X>` through (zeros when it is absent).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in (config.get("parameters") or {}).items()}
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"])
        self.skip_special_tokens = params.get("skip_special_tokens", "${").lower() != "false"
        self.outputs = [
            (o["name"], pb_utils.triton_string_to_numpy(o["data_type"]), o["dims"]) for o in config["output"]
        ]

    def _decode(self, request):
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()  # [batch, beam, seq]
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()  # [batch, beam]
        texts = [
            self.tokenizer.decode(beam[:length].tolist(), skip_special_tokens=self.skip_special_tokens).encode()
            for batch, batch_lengths in zip(tokens, lengths, strict=True)
            for beam, length in zip(batch, batch_lengths, strict=True)
        ]
        return np.array(texts, dtype=object)

    def execute(self, requests):
        responses = []
        for request in requests:
            tensors = []
            for name, dtype, dims in self.outputs:
                if name == "OUTPUT":
                    value = self._decode(request)
                else:
                    given = pb_utils.get_input_tensor_by_name(request, name.removeprefix("OUT_"))
                    value = (
                        given.as_numpy() if given is not None else np.zeros([1] + [1 if d == -1 else d for d in dims])
                    )
                tensors.append(pb_utils.Tensor(name, value.astype(dtype)))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
