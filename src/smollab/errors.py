"""The exception types a user sees, each printed by the CLI as one line."""


class UserError(Exception):
    """Bad input (config key, value, file): reported as one line, exit code 2, nothing written."""


class RunFailed(Exception):
    """A run failed once its directory existed: recorded there as status `failed` (the one-line
    evidence in summary.json, the traceback in training.log); the CLI prints this line, exits 1.
    The exception that failed it is `__cause__`."""

    def __init__(self, evidence: str, log_path: object = None):
        where = f"; traceback in {log_path}" if log_path else ""
        super().__init__(f"{evidence}{where}")
        self.evidence = evidence
