"""The container side's contract as the host needs it: the paths, ports and user that the Dockerfiles (images/*.j2)
and the KServe manifests (kserve.py) must agree on with the image.

The packages never import each other (the image's code does not run on the build machine and vice versa), so
tests/unit/test_render.py compares these values with entrypoints/trtllm_entrypoint/contract.py.
"""

MATRIX_FILE = "/etc/trtllm-images/matrix.json"
MODELS_FILE = "/etc/trtllm-images/models.json"
BUNDLED_APP_DIR = "/opt/trtllm-images/app"  # the backend's files, for base images without /app
CACHE_DIR = "/var/cache/trtllm"
KSERVE_MODEL_DIR = "/mnt/models"  # where KServe's storage initializer puts the model
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002  # Triton's defaults
UID = 1000  # the NGC images' triton-server user
# Where each FRONTEND answers ready: Triton's KServe protocol, and the OpenAI frontend's own route (the probes).
READY_PATHS = {"triton": "/v2/health/ready", "openai": "/health/ready"}
