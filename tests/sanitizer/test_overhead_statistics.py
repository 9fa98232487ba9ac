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


class _Clock:
    """A clock that advances only when a window 'runs'."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_pairs_alternate_which_arm_runs_first(bench):
    order = []
    plain = lambda: order.append("plain") or 1.0  # noqa: E731
    checked = lambda: order.append("checked") or 2.0  # noqa: E731
    plain_times, checked_times = bench.alternate_pairs(plain, checked, repeats=3)
    assert order == ["plain", "checked", "checked", "plain", "plain", "checked"]
    assert (plain_times, checked_times) == ([1.0] * 3, [2.0] * 3)


def test_a_time_boxed_cell_runs_pairs_until_its_time_is_up_and_never_fewer_than_an_interval_needs(bench):
    clock = _Clock()

    def window() -> float:
        clock.now += 0.5
        return 1.0

    plain_times, _ = bench.alternate_pairs(window, window, repeats=3, seconds=10.0, clock=clock)
    assert len(plain_times) == 10  # a pair takes 1 s: the tenth starts at 9 s, before the 10 s are up
    clock.now = 0.0
    plain_times, _ = bench.alternate_pairs(window, window, repeats=3, seconds=0.1, clock=clock)
    assert len(plain_times) == bench.MIN_PAIRS
    assert bench.median_interval([1.0] * bench.MIN_PAIRS)[1] is not None
    assert bench.median_interval([1.0] * (bench.MIN_PAIRS - 1))[1] is None


def test_a_window_sized_in_time_holds_as_many_steps_as_fit(bench):
    clock = _Clock()

    def step() -> None:
        clock.now += 0.002

    assert bench.steps_for_window(step, lambda: None, 0.3, clock=clock) == 150


def test_tight_targets_get_the_longer_cells(bench):
    import argparse

    options = argparse.Namespace(cell_seconds=40.0, tight_cell_seconds=200.0)
    assert bench.cell_seconds(options, 1.03) == 200.0
    assert bench.cell_seconds(options, 1.05) == 200.0
    assert bench.cell_seconds(options, 1.5) == 40.0
    assert bench.cell_seconds(options, None) == 40.0
    assert bench.cell_seconds(argparse.Namespace(cell_seconds=None, tight_cell_seconds=None), 1.03) is None


def test_thread_switches_count_the_calling_thread_giving_up_the_cpu(bench):
    import threading
    import time

    before = bench.thread_switches()
    if before is None:
        pytest.skip("this OS does not count a thread's context switches")
    for _ in range(20):
        time.sleep(0.001)  # each sleep gives the CPU up once at least
    assert bench.thread_switches() - before >= 20
    seen = []
    worker = threading.Thread(target=lambda: seen.append(bench.thread_switches()))
    worker.start()
    worker.join()
    assert seen[0] < 20  # a fresh thread's own count, not the process's
