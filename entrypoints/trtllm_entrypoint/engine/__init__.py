"""The TensorRT engine: its configuration, the cache that holds it, and the build that makes it."""
