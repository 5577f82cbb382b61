"""The one exception type that reaches the user as a single line: what is wrong and what to do."""


class UserError(Exception):
    """Bad input or a failed precondition. The CLI prints `dstrace: <message>` and exits with `code`."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code
