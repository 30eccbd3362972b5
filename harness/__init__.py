"""The test harness: what tests/ and benchmarks/ share to run our code against real or stand-in NVIDIA programs.

It starts the real tritonserver (`realtriton`) and Triton's OpenAI front (`realfront`, `realopenai`), builds the
stand-in NGC images (`build_standin`), makes tiny checkpoints (`tiny_checkpoint`), a fake Hugging Face hub
(`fake_hub`), the image's data files (`image_data`), finds upstream's files (`upstream_files`), installs the NVIDIA
doubles and reads back what they recorded (`doubles`), and lays out an image directory the entrypoint runs in
(`image`).

The doubles' programs themselves stay under tests/doubles: a double is test code, lives under tests/ and says so in
its name. The harness refers to them by path and ships nothing of its own into a product image.
"""
