"""Test double of tensorrtllm_backend's `preprocessing` model.py (upstream code may not be copied here, and CI
cannot download it). Like the real one it reads `tokenizer_dir` (and `add_special_tokens`) from its config's
parameters and tokenizes QUERY with transformers' AutoTokenizer; it returns every output its config.pbtxt declares,
with the declared type: the prompt's ids and length, the stop/bad word lists in the backend's [2, N] format, the
end/pad ids, and an empty tensor for each multimodal or feature output it does not implement.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer


def _text(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    return [v.decode() if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in (config.get("parameters") or {}).items()}
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"])
        self.add_special_tokens = params.get("add_special_tokens", "${").lower() != "false"
        eos = self.tokenizer.eos_token_id
        self.end_id = eos if eos is not None else 0
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.end_id
        self.outputs = [
            (o["name"], pb_utils.triton_string_to_numpy(o["data_type"]), o["dims"]) for o in config["output"]
        ]

    def _encode(self, text):
        return self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)

    def _word_list(self, words):
        """Words in the backend's format: row 0 the concatenated ids, row 1 each word's end offset, -1 padded."""
        ids, offsets = [], []
        for word in (w for w in words if w):
            ids += self._encode(word)
            offsets.append(len(ids))
        width = max(len(ids), 1)
        return np.array([[ids + [0] * (width - len(ids)), offsets + [-1] * (width - len(offsets))]])

    def _tensors(self, request):
        ids = [self._encode(q) for q in _text(request, "QUERY")][0]
        decoder = [self._encode(q) for q in _text(request, "DECODER_QUERY") if q]
        decoder_ids = decoder[0] if decoder else []
        output_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy()
        end_id = pb_utils.get_input_tensor_by_name(request, "END_ID")
        pad_id = pb_utils.get_input_tensor_by_name(request, "PAD_ID")
        return {
            "INPUT_ID": np.array([ids]),
            "REQUEST_INPUT_LEN": np.array([[len(ids)]]),
            "DECODER_INPUT_ID": np.array([decoder_ids]),
            "REQUEST_DECODER_INPUT_LEN": np.array([[len(decoder_ids)]]),
            "BAD_WORDS_IDS": self._word_list(_text(request, "BAD_WORDS_DICT")),
            "STOP_WORDS_IDS": self._word_list(_text(request, "STOP_WORDS_DICT")),
            "REQUEST_OUTPUT_LEN": output_len.reshape(1, -1),
            "OUT_END_ID": end_id.as_numpy().reshape(1, 1) if end_id is not None else np.array([[self.end_id]]),
            "OUT_PAD_ID": pad_id.as_numpy().reshape(1, 1) if pad_id is not None else np.array([[self.pad_id]]),
            "OUT_PROMPT_TABLE_EXTRA_IDS": np.zeros((1, len(ids))),
        }

    def execute(self, requests):
        responses = []
        for request in requests:
            known = self._tensors(request)
            tensors = []
            for name, dtype, dims in self.outputs:
                value = known.get(name)
                if value is None:  # a feature this double does not implement: an empty tensor of the right rank
                    value = np.zeros([1] + [0 if d == -1 else d for d in dims])
                tensors.append(pb_utils.Tensor(name, value.astype(dtype)))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
