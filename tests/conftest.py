"""Shared fixtures: tiny model builders and inputs (the suite runs once per backend)."""

import gc
import json
import os

import vlzoo  # noqa: F401  (before Keras, as in a user's program: it sets TensorFlow's CPU defaults)
import keras  # noqa: I001
import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import settings

from vlzoo.host import describe_host

import budget

# Property tests (tests/test_properties.py): the same generated cases on every run, none stored, besides the
# named edge cases. `make test` draws few (JAX compiles every drawn case, a new shape, so it draws fewer);
# `make test-numerics` sets VLZOO_HYPOTHESIS_EXAMPLES to draw many more, under each of its perturbations.
_EXAMPLES = os.environ.get("VLZOO_HYPOTHESIS_EXAMPLES", "4" if keras.backend.backend() == "jax" else "10")
settings.register_profile(
    "vlzoo", max_examples=int(_EXAMPLES), deadline=None,
    derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
)
settings.load_profile("vlzoo")

TINY_VISION = dict(image_size=32, patch_size=8, hidden_dim=32, num_layers=2, num_heads=4, intermediate_dim=64)
TINY_TEXT = dict(vocabulary_size=64, sequence_length=12, hidden_dim=32, num_layers=2, num_heads=4, intermediate_dim=64)
TWO_BLOCKS = dict(vision=dict(num_layers=2), text=dict(num_layers=2))
"""`tiny_model`'s overrides for the tests that count, lock or wrap each block of a tower."""

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json"), encoding="utf-8") as _file:
    _DURATIONS = json.load(_file)
"""`{backend: {test file: seconds}}` of a timed `make test` (`tools/test_durations.py`)."""


def pytest_report_header(config):
    """The host's CPU model and vector units (they select the backends' kernels, and so the rounding)."""
    return [f"vlzoo host: {describe_host()}", f"keras {keras.__version__}, backend {keras.backend.backend()}"]


def pytest_configure(config):
    config.addinivalue_line("markers", "conformance: spawns one subprocess per backend (run once, see backend_utils.run_once)")


def pytest_collection_modifyitems(config, items):
    """`slow` tests (learning runs, big builds: nothing backend-specific) run in one pass only, and the test
    files go out longest first.

    Every backend's own numerics are checked by the conformance test and by the fast tests of
    each pass; a learning test costs 20-60 s of compilation on JAX and TensorFlow, seconds on
    PyTorch's eager path. `@pytest.mark.slow(backend=...)` names another pass where that one
    is cheapest.

    `make test` hands whole files to its workers (`--dist loadfile`: a file's module fixtures are built
    once); ordered by the seconds each took in this backend's pass (`tests/durations.json`, written by
    `tools/test_durations.py`; a file not listed there counts as the longest), the last file to start is
    a short one. The order within a file is kept.
    """
    from backend_utils import ONCE_BACKEND

    for item in items:
        marker = item.get_closest_marker("slow")
        if marker is None:
            continue
        backend = marker.kwargs.get("backend", ONCE_BACKEND)
        if keras.backend.backend() != backend:
            item.add_marker(pytest.mark.skip(reason=f"slow: runs in the {backend} pass only"))
    seconds = _DURATIONS.get(keras.backend.backend(), {})
    unknown = max(seconds.values(), default=0.0)
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], unknown))


_CLOCK = budget.PassClock()


def pytest_runtest_logreport(report):
    _CLOCK.add(report)  # in the xdist controller: every worker's reports


def pytest_sessionfinish(session):
    """With `VLZOO_TEST_BUDGET=1` (`make test`), the pass fails when its worker-seconds exceed its share of the
    test time budget on this host (`tests/budget.py`), naming its slowest files."""
    if os.environ.get("VLZOO_TEST_BUDGET") != "1" or hasattr(session.config, "workerinput"):
        return
    backend = keras.backend.backend()
    within, message = budget.verdict(_CLOCK.seconds, backend, budget.calibrate(backend))
    session.config.get_terminal_writer().line(message, red=not within, bold=not within)
    if not within and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def _start_background_subprocesses(request, tmp_path_factory):
    """Starts the minutes-long subprocesses of the selected test modules when the run begins.

    A module opts in with a function `start_background_subprocesses(tmp_path_factory)` (see
    `backend_utils.shared_subprocess`): its subprocess then runs while the xdist workers go on
    with other tests, and the tests that need its result wait for it at most for what is left.
    """
    for module in {item.module for item in request.session.items}:
        start = getattr(module, "start_background_subprocesses", None)
        if start is not None:
            start(tmp_path_factory)


@pytest.fixture(scope="module", autouse=True)
def _release_each_files_models():
    """Frees what a test file built (its models, the functions Keras compiled for them, the backend's graphs)
    when the file ends, with `keras.utils.clear_session`: a worker runs many files in turn, and on TensorFlow a
    worker otherwise grew to 10 GB by the end of its pass. What outlives that full collection (the modules
    imported, the session's fixtures and caches) is then frozen (`gc.freeze`): the collections that follow,
    Keras' own and Python's, skip it instead of walking the whole process again (a second each by mid-pass)."""
    yield
    keras.utils.clear_session(free_memory=True)
    gc.freeze()


def tiny_model(family="clip", **overrides):
    """A tiny model of `family` with a 64-token vocabulary and one block per tower (fast to build and train;
    `vision={"num_layers": 2}` and the like where a test needs more)."""
    from vlzoo.models import CLIP, SigLIP

    cls = {"clip": CLIP, "siglip": SigLIP}[family]
    config = dict(vision=dict(TINY_VISION, num_layers=1), text=dict(TINY_TEXT, num_layers=1), embed_dim=16)
    for key, value in overrides.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    return cls(**config)


def shipped_presets():
    """The registered presets vlzoo ships (`vlzoo.list_presets()` also names those a family registered by
    the tests defines in code, `tests/extension_family.py`, once a test of this process imported it)."""
    return [name for name in vlzoo.list_presets() if not vlzoo.presets.catalogue.defined_in_code(name)]


def tiny_batch(batch_size=4, seed=0, image_size=32, sequence_length=12, vocabulary_size=64):
    """Random paired inputs: images, token ids ending with an end token (the max id), masks."""
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(batch_size, image_size, image_size, 3)).astype("float32")
    lengths = rng.integers(3, sequence_length + 1, size=batch_size)
    ids = np.zeros((batch_size, sequence_length), "int32")
    mask = np.zeros((batch_size, sequence_length), bool)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, vocabulary_size - 1, size=n)
        ids[i, n - 1] = vocabulary_size - 1  # end token: the largest id, as in CLIP's BPE
        mask[i, :n] = True
    return {"images": images, "token_ids": ids, "padding_mask": mask}


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def fit_and_measure(model, batch, epochs=25, training=False):
    """Compiles `model` with AdamW(2e-3, wd 0.1), fits `batch` for `epochs` full-batch
    steps and returns the loss `(before, after)` (`compute_loss(..., training=training)`);
    the fit's own losses must be finite."""
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=2e-3, weight_decay=0.1))

    def loss():
        return float(to_numpy(model.compute_loss(y_pred=model(batch), training=training)))

    before = loss()
    history = model.fit(batch, batch_size=len(batch["images"]), epochs=epochs, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"]).all()
    return before, loss()


@pytest.fixture
def backend():
    return keras.backend.backend()


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)


@pytest.fixture
def repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
