"""Decisions over the model: plan search, cluster comparison, advice, cost of a run, validation, the demo."""
