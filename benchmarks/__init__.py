"""Benchmarks of trtllm-images: entrypoint start-up, engine cache reuse, image builds, static checks."""
