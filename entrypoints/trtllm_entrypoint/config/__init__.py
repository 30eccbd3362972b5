"""The settings: the environment's variables parsed once into typed values, and what the image and host are."""
