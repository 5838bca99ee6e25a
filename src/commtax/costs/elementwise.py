"""Elementwise max, min and choice that take plain numbers or NumPy arrays alike.

A formula of the model is written once and read both by ``estimate`` (one plan: plain floats) and by ``search``
(the plan grid: NumPy arrays). On floats these are the builtins (NumPy is not imported: the estimate path does not
load it); on arrays the matching ufuncs, which give the same IEEE result element by element. (The one difference:
on a tie of 0.0 and -0.0 the builtins keep the first argument and the ufuncs may not; the two are equal, and the
model's times are sums of non-negative terms, so no figure shows it: tests/test_priced_step.py.)
"""

from __future__ import annotations

from typing import Any

_PLAIN = frozenset((float, int, bool))


def maximum(a: Any, b: Any) -> Any:
    """``max(a, b)``; ``np.maximum`` on arrays."""
    if type(a) in _PLAIN and type(b) in _PLAIN:
        return b if b > a else a
    import numpy as np

    return _scalar(np.maximum(a, b))


def minimum(a: Any, b: Any) -> Any:
    """``min(a, b)``; ``np.minimum`` on arrays."""
    if type(a) in _PLAIN and type(b) in _PLAIN:
        return b if b < a else a
    import numpy as np

    return _scalar(np.minimum(a, b))


def where(cond: Any, a: Any, b: Any) -> Any:
    """``a if cond else b``; ``np.where`` on arrays."""
    if type(cond) is bool:
        return a if cond else b
    import numpy as np

    return _scalar(np.where(cond, a, b))


def largest(values: Any) -> Any:
    """``max(values)`` (the first of equals), ``maximum`` taken left to right; when the values are arrays of one shape,
    ``np.maximum.reduce`` over them at once (the same IEEE maxima, element by element: no rounding in a maximum)."""
    best = values[0]
    if type(best) not in _PLAIN:
        import numpy as np

        if len(values) > 2 and all(type(v) is np.ndarray and v.shape == best.shape for v in values):
            return _scalar(np.maximum.reduce(values))
    for v in values[1:]:
        best = maximum(best, v)
    return best


def _scalar(x: Any) -> Any:
    """A 0-d array as its NumPy scalar (a float subclass), so scalar callers never hold arrays."""
    return x[()] if getattr(x, "ndim", 1) == 0 else x


def any_true(cond: Any) -> bool:
    """``cond`` for a plain bool; whether any element holds for an array."""
    return cond if type(cond) is bool else bool(cond.any())
