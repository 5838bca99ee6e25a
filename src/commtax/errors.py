"""Errors by kind (STYLE.md §4). A plan that does not fit memory is a result (Breakdown.fits), not an error."""


class SpecError(ValueError):
    """Bad user input: shown as one line naming the field and the fix; the CLI exits 2."""
