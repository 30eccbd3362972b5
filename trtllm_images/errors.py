"""The one error type of the host side; `cli` prints it as one line (plus a hint) and exits non-zero."""


class BuildError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class UsageError(BuildError):
    """Bad input on the command line or in matrix.yaml: exit 2."""

    exit_code = 2
