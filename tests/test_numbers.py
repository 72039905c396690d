"""`loopscale.numbers`: the one formatter per kind that `fit`, `plan`, `sweep plan` and the report share."""

from __future__ import annotations

import math

from loopscale import numbers as n


def test_counts_take_the_unit_that_fits_them():
    assert [n.count(x) for x in (24_576, 35_389_440, 2.0e6, 1.2e9, 3.1e12, 999, 0)] == [
        "24.6k",
        "35.4M",
        "2.00M",
        "1.20B",
        "3.10T",
        "999",
        "0",
    ]
    assert [n.count(x, trim=True) for x in (1e6, 2e7, 1.5e3, 850e3)] == ["1M", "20M", "1.5k", "850k"]
    assert n.count(None) == n.count(math.nan) == n.MISSING


def test_flops_are_compact():
    assert [n.flops(x) for x in (4.64e17, 1e19, 2.15e19, 600.0)] == ["4.64e17", "1e19", "2.15e19", "600"]


def test_phi_prints_fixed_point_with_its_ci_in_its_own_digits():
    assert n.phi_ci(0.4612, (0.41, 0.5302)) == "0.461 [0.410, 0.530]"
    assert n.phi_ci(0.0004, [0.0, 0.001]) == "0.000 [0.000, 0.001]"  # never scientific: φ lives in [-3, 3]
    assert n.phi_ci(0.46, None) == n.phi_ci(0.46, [None, None]) == "0.460"
    assert n.phi_ci(None, (0.1, 0.2)) == n.phi(None) == n.UNDETERMINED
    assert n.phi_ci(0.46, (0.41, 0.53), digits=2) == "0.46 [0.41, 0.53]"
    assert n.phi_interval(None) == n.MISSING


def test_coefficients_and_differences():
    assert [n.num(x) for x in (0.4612, 12.5, 2.5e4, 1e-5, None, math.inf)] == [
        "0.4612",
        "12.50",
        "2.500e+04",
        "1.000e-05",
        n.MISSING,
        n.MISSING,
    ]
    assert n.interval((0.1, 0.2)) == "[0.1000, 0.2000]"
    assert n.interval((-0.02, 0.03), 3, is_signed=True) == "[-0.020, +0.030]"
    assert n.interval(None) == n.interval((0.1, None)) == n.MISSING
    assert n.signed(0.0283) == "+0.0283" and n.signed(None) == n.MISSING
