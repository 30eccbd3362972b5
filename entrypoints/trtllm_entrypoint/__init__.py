"""Container side of trtllm-images: runs inside the serving and builder images (stdlib only)."""
