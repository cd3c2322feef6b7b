"""Errors petal raises for bad input; the CLI prints them as one line and exits non-zero."""


class PetalError(ValueError):
    """Bad input or a refused operation. The message names the file or argument and the fix."""
