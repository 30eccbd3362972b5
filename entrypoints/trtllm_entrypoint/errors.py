"""The one error type of the container side; `main` turns it into a message and an exit code."""


class EntrypointError(Exception):
    """Something went wrong that the user can act on. `hint` says what to do about it."""

    exit_code = 1

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class UsageError(EntrypointError):
    """Bad input (an environment value, an argument): exit 2, and nothing has been written yet."""

    exit_code = 2
