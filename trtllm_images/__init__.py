"""Host side of trtllm-images: matrix, checks, Dockerfile rendering, docker builds, KServe manifests."""
