"""The one error type of both packages (the host imports this module): a message the user can act on, and a hint.

The boundary (the entrypoint's `main`, the host's `cli`) prints it as one line and exits with its code.
"""


class Error(Exception):
    """Something went wrong that the user can act on. `hint` says what to do about it."""

    exit_code = 1

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class UsageError(Error):
    """Bad input (an environment value, an argument, matrix.yaml): exit 2, and nothing has been written yet."""

    exit_code = 2


# The container side's name for it: its modules raise entrypoint errors.
EntrypointError = Error
