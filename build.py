"""`python build.py …` is the same program as the `trtllm-images` console script."""

from trtllm_images.cli import main

if __name__ == "__main__":
    main()
