"""Errors by kind (STYLE.md §4): bad user input vs plans that do not fit."""


class SpecError(ValueError):
    """Bad user input: shown as one line naming the field and the fix; the CLI exits 2."""


class InfeasiblePlan(Exception):
    """A valid plan that cannot run on the cluster (e.g. it does not fit GPU memory)."""
