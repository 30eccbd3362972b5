#!/bin/sh
# Stand-in for /opt/nvidia/nvidia_entrypoint.sh in NGC images: a banner, then run the command as the main process.
echo "== trtllm-images stand-in for an NGC Triton TensorRT-LLM image (test double, no CUDA) ==" >&2
exec "$@"
