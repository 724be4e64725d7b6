"""The one exception type that crosses from the proxy model into the HTTP layer."""


class ApiError(Exception):
    """A failure that the API must report with a specific HTTP status.

    The model code raises it so the HTTP layer never has to guess a status from
    an exception class, which keeps the status table of the spec in one place per
    operation.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
