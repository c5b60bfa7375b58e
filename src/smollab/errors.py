"""The one exception type a user sees: the CLI prints its message as one line and exits 2."""


class UserError(Exception):
    """Bad input (config key, value, file): reported as one line, exit code 2, nothing written."""
