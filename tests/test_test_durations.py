"""tools/test_durations.py sums a `make test` log's `--durations=0` lines per pass and test file; the file it
writes is the one the suite orders its test files by (tests/conftest.py)."""

import json

import pytest
from backend_utils import load_tool, run_once

# Reads text: nothing of a backend, checked in one pass.
pytestmark = run_once

LOG = """\
make: Entering directory 'vlzoo'
=== KERAS_BACKEND=jax ===
============================= slowest durations =============================
12.50s call     tests/test_properties.py::test_finite_values_and_gradients[clip]
2.25s setup    tests/test_degenerate.py::test_zero_embeddings_train_finitely[clip]
0.75s call     tests/test_properties.py::test_chunked_equals_unchunked[siglip]
0.10s teardown tests/test_degenerate.py::test_zero_embeddings_train_finitely[clip]

(120 durations < 0.005s hidden.  Use -vv to show these durations.)
=== KERAS_BACKEND=torch ===
3.00s call     tests/test_cli.py::test_list[a::b]
1 passed in 3.10s
"""


@pytest.fixture
def tool():
    return load_tool("test_durations")


def test_seconds_are_summed_per_pass_and_file(tool):
    assert tool.file_seconds(LOG.splitlines()) == {
        "jax": {"tests/test_degenerate.py": 2.4, "tests/test_properties.py": 13.2},  # 2.25 + 0.10; 12.50 + 0.75
        "torch": {"tests/test_cli.py": 3.0},
    }


def test_a_log_without_durations_is_refused(tool):
    with pytest.raises(ValueError, match="--durations=0"):
        tool.file_seconds(["=== KERAS_BACKEND=jax ===", "1 passed in 3.10s"])


def test_the_suites_own_figures_cover_every_pass(repo_root):
    with open(f"{repo_root}/tests/durations.json", encoding="utf-8") as f:
        seconds = json.load(f)
    assert sorted(seconds) == ["jax", "tensorflow", "torch"]
    assert all(path.startswith("tests/test_") and value >= 0 for files in seconds.values() for path, value in files.items())
