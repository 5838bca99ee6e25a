"""Numbers as users read them: adaptive time units and significant digits (issue 11)."""

from commtax.units import format_duration, format_sig


def test_durations_take_the_unit_that_reads_best():
    assert format_duration(170_186.8e-6) == "170 ms"  # was printed as "170,186.8 µs"
    assert format_duration(15.0e-6) == "15.0 µs"
    assert format_duration(1.2e-3) == "1.20 ms"
    assert format_duration(62.1) == "62.1 s"
    assert format_duration(0.5e-9) == "0.500 ns"


def test_significant_digits_never_round_small_bandwidths_to_zero():
    assert format_sig(0.000533) == "0.000533"
    assert format_sig(0.0249) == "0.0249"  # was "0.02"
    assert format_sig(483.4) == "483"
    assert format_sig(62102.2) == "62,102"
    assert format_sig(0.0) == "0"
