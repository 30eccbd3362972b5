from trtllm_entrypoint.main import main

main()
