"""`trtllm-entrypoint`, with the one path that only exists inside an image pointed at the tritonserver double.

The images have tritonserver at contract.TRITONSERVER (/opt/tritonserver/bin); the host that runs the benchmarks
does not, and must not be changed. Everything else is the console script's code path, unchanged.
Run as a script (`python serve_shim.py serve`) with BENCH_TRITONSERVER set.
"""

import os

from trtllm_entrypoint import contract
from trtllm_entrypoint.main import main

if __name__ == "__main__":
    contract.TRITONSERVER = os.environ["BENCH_TRITONSERVER"]
    main()
