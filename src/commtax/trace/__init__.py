"""``commtax trace``: the measured communication tax of a real job from PyTorch profiler (Kineto) traces.

No torch, no matplotlib: a trace is JSON, read as a stream (``commtax.trace.reader``).
"""

from commtax.trace.analyze import (
    CollectiveStat,
    RankReport,
    StepFigures,
    Straggler,
    TraceReport,
    analyze,
)
from commtax.trace.reader import TraceFormatError

__all__ = ["CollectiveStat", "RankReport", "StepFigures", "Straggler", "TraceFormatError", "TraceReport", "analyze"]
