"""Expected failures: one line telling the user what to do, no traceback."""


class UserError(Exception):
    """An expected failure (port in use, bad setting, unreadable path ...)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
