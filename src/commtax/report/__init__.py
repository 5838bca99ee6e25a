"""Human-facing output: rich tables, plots (matplotlib, imported lazily) and HTML."""
