"""The test time budget's check (`tests/budget.py`): a pass over its scaled share fails, naming its slowest files."""

import collections
import types

import pytest

import budget
from backend_utils import ONCE_BACKEND, run_once

pytestmark = run_once  # arithmetic on durations; the calibration runs in a process of its own


def _seconds(**files):
    return collections.Counter({f"tests/{name}.py": value for name, value in files.items()})


def test_a_pass_within_its_share_passes_and_says_its_figures(monkeypatch):
    monkeypatch.setitem(budget.BUDGET, "jax", 1000.0)
    monkeypatch.setitem(budget.REFERENCE_CALIBRATION, "jax", 2.0)
    within, message = budget.verdict(_seconds(test_a=600.0, test_b=350.0), "jax", calibration=2.0)
    assert within and message.startswith("jax pass: 950 worker-seconds of 1,000 allowed")


def test_the_share_scales_with_the_hosts_speed(monkeypatch):
    monkeypatch.setitem(budget.BUDGET, "torch", 1000.0)
    monkeypatch.setitem(budget.REFERENCE_CALIBRATION, "torch", 2.0)
    seconds = _seconds(test_a=600.0, test_b=350.0)
    # A host twice as fast as the reference gets half the worker-seconds: 950 is over 500 there.
    within, message = budget.verdict(seconds, "torch", calibration=1.0)
    assert not within
    assert "950 worker-seconds of 500 allowed" in message and "x 0.50" in message and "by 450 s" in message
    assert "The slowest files: tests/test_a.py 600 s, tests/test_b.py 350 s." in message
    assert budget.verdict(seconds, "torch", calibration=4.0)[0]  # twice as slow: 2,000 allowed


def test_only_the_slowest_files_are_named(monkeypatch):
    monkeypatch.setitem(budget.BUDGET, "tensorflow", 10.0)
    monkeypatch.setitem(budget.REFERENCE_CALIBRATION, "tensorflow", 1.0)
    seconds = _seconds(**{f"test_{i:02d}": float(i) for i in range(20)})
    within, message = budget.verdict(seconds, "tensorflow", calibration=1.0)
    named = message.split("The slowest files: ")[1]
    assert not within and named.count("tests/") == budget.SLOWEST
    assert named.startswith("tests/test_19.py 19 s, tests/test_18.py 18 s") and "test_11.py" not in named


def test_the_clock_sums_setup_call_and_teardown_by_file():
    clock = budget.PassClock()
    for nodeid, duration in (("tests/test_a.py::test_x", 1.5), ("tests/test_a.py::test_y[p]", 2.0),
                             ("tests/test_b.py::test_z", 0.25)):
        for phase in (duration, 0.5):  # two phases of each test
            clock.add(types.SimpleNamespace(nodeid=nodeid, duration=phase))
    assert clock.seconds == {"tests/test_a.py": 4.5, "tests/test_b.py": 0.75} and clock.total == pytest.approx(5.25)


def test_the_calibration_loop_runs_in_a_process_of_the_backend():
    seconds = budget.calibrate(ONCE_BACKEND, repeats=1)
    assert 0.0 < seconds < 600.0
