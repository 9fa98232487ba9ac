"""The overhead bench's verdicts: a distribution-free interval for the median of paired ratios."""
from __future__ import annotations

import importlib.util
import pathlib
import random
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "sanitizer_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("sanitizer_overhead", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)  # stdlib only at import: torch is imported inside the children
    return module


def test_the_interval_is_the_order_statistics_the_binomial_tail_allows(bench):
    # n = 16: P(Binom(16, 1/2) <= 3) = 0.0106 <= 0.025 < P(<= 4) = 0.0384, so k = 4.
    median, low, high, coverage = bench.median_interval([float(v) for v in reversed(range(16))])
    assert (median, low, high) == (7.5, 3.0, 12.0)
    assert coverage == pytest.approx(1 - 2 * (1 + 16 + 120 + 560) / 2 ** 16)


def test_too_few_pairs_give_no_interval(bench):
    assert bench.median_interval([1.0, 1.1, 0.9, 1.2, 1.05])[1:] == (None, None, None)


@pytest.mark.parametrize("n", [6, 16, 24, 40])
def test_the_interval_holds_the_true_median_at_least_95_percent_of_the_time_on_skewed_noise(bench, n):
    rng = random.Random(n)
    true_median = 1.0 + 0.1 * 0.6931471805599453  # 1 + scale * ln 2: the median of 1 + Exp(mean 0.1)
    trials, held = 4000, 0
    for _ in range(trials):
        _, low, high, _ = bench.median_interval([1.0 + rng.expovariate(10.0) for _ in range(n)])
        held += low <= true_median <= high
    assert held / trials >= 0.95 - 0.01  # three standard errors below 0.95 at most


@pytest.mark.parametrize("low, high, expected", [
    (0.98, 1.02, "met"), (1.04, 1.09, "over"), (0.97, 1.06, "unresolved"), (None, None, ""),
])
def test_the_verdict_needs_the_whole_interval_on_one_side_of_the_target(bench, low, high, expected):
    assert bench.verdict(1.03, low, high) == expected


def test_baseline_2_is_paired_with_itself_and_csan_is_not(bench):
    modes = {mode.name: mode for mode in bench.MODES}
    assert modes["baseline-2"].is_paired() and modes["baseline-2"].checks is None
    assert modes["sync+memory"].is_paired()
    assert not modes["csan"].is_paired() and not modes["baseline"].is_paired()
