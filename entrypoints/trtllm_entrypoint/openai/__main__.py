"""`python3 -m trtllm_entrypoint.openai`: one worker of the OpenAI front (server.py)."""

from trtllm_entrypoint.openai.server import main

main()
