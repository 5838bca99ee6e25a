"""Unions and intersections of time intervals (NumPy, sorted arrays of starts and ends).

A set of intervals is kept as its union: two sorted arrays ``(starts, ends)`` with
``ends[i] < starts[i+1]``. Every measured time of ``commtax trace`` is a length of such a set.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.zeros(0), np.zeros(0))


def union(starts, ends) -> Intervals:
    """Merge possibly overlapping [start, end) intervals into disjoint sorted ones (touching ones join)."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    if s.size == 0:
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum(e[order], s[order])
    reach = np.maximum.accumulate(e)
    # a new group starts where the interval begins after everything before it has ended
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def length(iv: Intervals) -> float:
    return float(np.sum(iv[1] - iv[0]))


def intersection_length(a: Intervals, b: Intervals) -> float:
    """|a ∩ b| without building it: Σ over a's intervals of their overlap with b, via prefix sums of b."""
    (sa, ea), (sb, eb) = a, b
    if sa.size == 0 or sb.size == 0:
        return 0.0
    cum = np.concatenate(([0.0], np.cumsum(eb - sb)))

    def covered(t: np.ndarray) -> np.ndarray:
        """|b ∩ (-inf, t)| for each t."""
        k = np.searchsorted(sb, t, side="right")  # intervals of b starting before t
        inside = np.where(k > 0, np.clip(t - sb[np.maximum(k - 1, 0)], 0.0, None), 0.0)
        partial = np.where(k > 0, np.minimum(inside, (eb - sb)[np.maximum(k - 1, 0)]), 0.0)
        return cum[np.maximum(k - 1, 0)] * (k > 0) + partial

    return float(np.sum(covered(ea) - covered(sa)))
