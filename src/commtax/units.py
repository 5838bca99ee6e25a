"""Unit constants, defined once. SI everywhere inside; names carry units where not SI."""

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2**10
MiB = 2**20
GiB = 2**30
TiB = 2**40

US = 1e-6  # one microsecond in seconds
MS = 1e-3
GBIT = 1e9 / 8  # one gigabit in bytes
TFLOPS = 1e12

SECONDS_PER_DAY = 86_400.0

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": KB,
    "mb": MB,
    "gb": GB,
    "tb": TB,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
    "k": KiB,
    "m": MiB,
    "g": GiB,
    "t": TiB,
}


MAX_BYTES = 2.0**50  # 1 PiB: far beyond any message or memory, below where float sizes lose integers


def parse_bytes(text: str) -> float:
    """'16MiB' -> 16·2^20, '1GB' -> 1e9, '4096' -> 4096 (decimal units are powers of 10, *iB of 2)."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text or "")
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"cannot read size {text!r}: use e.g. 4096, 16MiB, 1GB, 2GiB")
    value = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if value <= 0:
        raise ValueError(f"size must be > 0, got {text!r}")
    if not value <= MAX_BYTES:  # also inf (1e400) and nan
        raise ValueError(f"size must be at most 1 PiB, got {text!r}")
    return value


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def format_duration(seconds: float) -> str:
    """A time in the unit that reads best: '15.0 µs', '1.20 ms', '170 ms', '2.50 s' (3 significant digits)."""
    for unit, size in (("s", 1.0), ("ms", MS), ("µs", US)):
        if abs(seconds) >= size:
            return f"{format_sig(seconds / size)} {unit}"
    return f"{format_sig(seconds / 1e-9)} ns" if seconds else "0 s"


def format_sig(x: float, digits: int = 3) -> str:
    """A number to ``digits`` significant digits without scientific notation: 0.000933, 15.0, 483, 62,102."""
    import math

    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def memory_need(need_GiB: float, cap_GiB: float) -> str:
    """ "24.0 GiB needed per GPU (0.8 MiB over the 24.0 GiB …" never reads as a contradiction: the excess is
    printed in a unit that shows it (GiB to 0.1, else MiB), and the need with enough digits to differ."""
    digits = 1
    while digits < 6 and f"{need_GiB:.{digits}f}" == f"{cap_GiB:.{digits}f}":
        digits += 1
    return f"{need_GiB:.{digits}f} GiB needed per GPU, {memory_excess(need_GiB, cap_GiB)}"


def memory_excess(need_GiB: float, cap_GiB: float) -> str:
    """ "0.8 MiB over the 24.0 GiB": GiB when the excess shows at 0.1 GiB, MiB below that."""
    over = need_GiB - cap_GiB
    excess = f"{over:.1f} GiB" if abs(over) >= 0.1 else f"{over * GiB / MiB:.1f} MiB"
    return f"{excess} over the {cap_GiB:.1f} GiB"
