"""The OpenAI front: its own worker processes (`python3 -m trtllm_entrypoint.openai`), with the libraries of
contract.FRONT_DIR on their path. Only `plan` is standard library only: the entrypoint builds the plan, the front
reads it."""
