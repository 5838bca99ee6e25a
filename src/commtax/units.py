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
