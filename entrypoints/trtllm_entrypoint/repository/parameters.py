"""The tables behind the templates' parameters: which placeholders stay `${x}` on purpose, which backend defaults are
written out, and the setting behind each optional parameter. repository/fill.py fills the templates with them."""

from __future__ import annotations

# Parameter placeholders we leave as `${x}` on purpose: the backend then uses its own default (the C++ model wraps
# each optional parameter in try/catch, the Python models treat `${…}` as not given). Feature knobs we do not
# expose (LoRA, speculative decoding, multimodal, guided decoding, stats) and tuning whose default is right.
INTENTIONALLY_UNSET = frozenset(
    {
        "batch_scheduler_policy",
        "cancellation_check_period_ms",
        "cross_kv_cache_fraction",
        "cuda_graph_cache_size",
        "cuda_graph_mode",
        "decoding_mode",
        "eagle_choices",
        "enable_chunked_context",
        "enable_context_fmha_fp32_acc",
        "enable_trt_overlap",
        "encoder_engine_dir",
        "gpu_device_ids",
        "gpu_weights_percent",
        "guided_decoding_backend",
        "hf_model_path",
        "iter_stats_max_iterations",
        "kv_cache_host_memory_bytes",
        "kv_cache_onboard_blocks",
        "lookahead_ngram_size",
        "lookahead_verification_set_size",
        "lookahead_window_size",
        "lora_cache_gpu_memory_fraction",
        "lora_cache_host_memory_bytes",
        "lora_cache_max_adapter_size",
        "lora_cache_optimal_adapter_size",
        "lora_prefetch_dir",
        "max_attention_window_size",
        "max_kv_cache_length",
        "max_num_images",
        "max_num_sequences",
        "max_tokens_in_paged_kv_cache",
        "medusa_choices",
        "multi_block_mode",
        "multimodal_encoders_name",
        "multimodal_model_path",
        "normalize_log_probs",
        "num_nodes",
        "participant_ids",
        "request_stats_max_iterations",
        "sink_token_length",
        "speculative_decoding_fast_logits",
        "stats_check_period_ms",
        "tensorrt_llm_draft_model_name",
        "visual_model_path",
        "xgrammar_tokenizer_info_path",
    }
)

# Parameters whose backend default we serve with, written out: left as `${x}`, the Python models fall back to the
# same value but print "[TensorRT-LLM][WARNING] Don't setup 'x' correctly (set value is ${x})", which reads like a
# fill bug. Every template that has the placeholder (add_special_tokens from tensorrtllm_backend v0.9.0,
# skip_special_tokens from v0.11.0, and TensorRT-LLM's triton_backend) pairs it with a model.py whose fallback is
# True; tests/unit/test_fill_defaults.py reads each stored model.py and fails when one says otherwise.
BACKEND_DEFAULTS = {
    "add_special_tokens": "true",  # preprocessing: the tokenizer adds BOS/EOS as the model was trained with
    "skip_special_tokens": "true",  # postprocessing: no special tokens in the returned text
}
# Left as `${x}` although model.py warns about it: max_num_images (preprocessing from v0.15.0) defaults to "no
# limit", which no value can say, so model.py warns with it and without it; only multimodal requests read it
# (docs/troubleshooting.md).
NO_VALUE_SAYS_THE_DEFAULT = frozenset({"max_num_images"})

# The setting behind each optional parameter that one sets (engine templates; llmapi's model.yaml, flattened): the
# start-up log names a parameter when its variable was set, and leaves the rest to LOG_LEVEL=debug and `check`.
PARAMETER_SETTINGS = {
    "max_beam_width": "max_beam_width",
    "kv_cache_free_gpu_mem_fraction": "kv_cache_free_gpu_mem_fraction",
    "enable_kv_cache_reuse": "enable_kv_cache_reuse",
    "engine_dir": "engine_dir",
    "model": "model_id",
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "dtype": "dtype",
    "max_batch_size": "max_batch_size",
    "max_num_tokens": "max_num_tokens",
    "max_seq_len": "max_seq_len",
    "kv_cache_config.free_gpu_memory_fraction": "kv_cache_free_gpu_mem_fraction",
    "kv_cache_config.enable_block_reuse": "enable_kv_cache_reuse",
    "triton_config.decoupled": "decoupled",
}
