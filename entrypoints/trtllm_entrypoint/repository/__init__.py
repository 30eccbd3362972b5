"""The Triton model repository: filled from the backend's templates, written once, checked."""
