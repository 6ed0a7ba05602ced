"""Backend-agnostic test helpers (the tests may import the backends)."""

import contextlib
import fcntl
import importlib.util
import json
import os
import shlex
import subprocess
import time

import keras
import numpy as np
import pytest

# Tests that start their own process per backend, or whose subject does not depend on the
# backend of the pass (the demo, the notebooks), run once: in the pass of the backend whose
# own suite is fastest, which keeps `make test`'s three passes balanced.
ONCE_BACKEND = "torch"
# A reference step that a test compares a traced step with runs eagerly on TensorFlow, where tracing a tiny model's
# step takes seconds and an eager step a fraction of one; JAX compiles it (its eager ops compile one by one), and
# PyTorch's step is eager anyway.
EAGER_REFERENCE = keras.backend.backend() == "tensorflow"
run_once = pytest.mark.skipif(keras.backend.backend() != ONCE_BACKEND,
                              reason=f"backend-independent or starts its own backend processes; runs in the "
                                     f"{ONCE_BACKEND} pass")


def value_and_grad(fn, *arrays, jit=False):
    """Value and gradients of a scalar function, computed by the backend.

    Args:
        fn: callable taking backend tensors (one per array) and returning a
            scalar tensor; it may use `keras.ops`.
        *arrays: numpy arrays or python floats, the points to differentiate
            at (float dtypes are kept: float16 inputs give float16 grads).
        jit: JAX only: compile the gradient with `jax.jit` (pays off for
            big functions called repeatedly with the same `fn` object).

    Returns:
        `(value, grads)`: `value` a numpy scalar, `grads` a list of numpy
        arrays, one per input, with the input's shape.
    """
    arrays = [np.asarray(a) for a in arrays]
    arrays = [a if a.dtype.kind == "f" else a.astype("float32")
              for a in arrays]
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        tensors = [jax.numpy.asarray(a) for a in arrays]
        vg = jax.value_and_grad(fn, argnums=tuple(range(len(tensors))))
        value, grads = (jax.jit(vg) if jit else vg)(*tensors)
        return np.asarray(value), [np.asarray(g) for g in grads]
    if backend == "tensorflow":
        import tensorflow as tf

        tensors = [tf.constant(a) for a in arrays]
        with tf.GradientTape() as tape:
            for t in tensors:
                tape.watch(t)
            value = fn(*tensors)
        grads = tape.gradient(value, tensors)
        grads = [np.zeros_like(a) if g is None else np.asarray(g)
                 for a, g in zip(arrays, grads)]
        return np.asarray(value), grads
    if backend == "torch":
        import torch

        tensors = [keras.ops.convert_to_tensor(a).detach().clone()
                   .requires_grad_(True) for a in arrays]
        value = fn(*tensors)
        grads = torch.autograd.grad(value, tensors, allow_unused=True)
        grads = [np.zeros_like(a) if g is None else
                 g.detach().cpu().float().numpy().astype(a.dtype)
                 for a, g in zip(arrays, grads)]
        return value.detach().cpu().numpy(), grads
    raise NotImplementedError(f"value_and_grad: backend {backend!r}")


def to_numpy(x):
    """Backend tensor (or anything array-like) -> numpy."""
    return np.asarray(keras.ops.convert_to_numpy(x))


@contextlib.contextmanager
def full_precision_matmul():
    """Disables TF32 / reduced-precision matmuls on GPUs for the block, so
    float32 results can be compared to float64 references at ~1e-6.
    A no-op on CPU."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        with jax.default_matmul_precision("highest"):
            yield
    elif backend == "tensorflow":
        import tensorflow as tf

        old = tf.config.experimental.tensor_float_32_execution_enabled()
        tf.config.experimental.enable_tensor_float_32_execution(False)
        try:
            yield
        finally:
            tf.config.experimental.enable_tensor_float_32_execution(old)
    elif backend == "torch":
        import torch

        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    else:
        yield


def finite_difference(f, args, i, h=1e-6):
    """Central-difference gradient of scalar `f(*args)` with respect to `args[i]` (float64)."""
    args = [np.array(a, dtype=np.float64) for a in args]
    grad = np.zeros_like(args[i])
    for idx in np.ndindex(grad.shape):
        plus = [a.copy() for a in args]
        minus = [a.copy() for a in args]
        plus[i][idx] += h
        minus[i][idx] -= h
        grad[idx] = (f(*plus) - f(*minus)) / (2 * h)
    return grad


def shared_subprocess(tmp_path_factory, name, argv, env, timeout):
    """Starts `argv` once per test run, in the background; returns a function that waits for its JSON.

    The first xdist worker to call this starts the process (under a file lock in the run's
    shared temporary directory); later calls, from any worker, only get the waiting function.
    Calling it early (a session fixture, `conftest._start_background_subprocesses`) lets a
    minutes-long subprocess run while both workers go on with other tests, instead of one
    worker computing it and the other waiting on the lock. The returned function blocks until
    the process has exited and returns its last stdout line parsed as JSON, failing with the
    end of its stderr if it exited with an error or ran past `timeout` seconds.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker has its own basetemp under the run's
        root = root.parent
    out, err, status = (root / f"{name}.{suffix}" for suffix in ("out", "err", "status"))
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            script = f'{shlex.join(argv)} > {shlex.quote(str(out))} 2> {shlex.quote(str(err))}; ' \
                     f'echo $? > {shlex.quote(str(status))}.tmp && mv {shlex.quote(str(status))}.tmp ' \
                     f'{shlex.quote(str(status))}'
            out.touch()
            _BACKGROUND.append(subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True))

    def wait():
        deadline = time.monotonic() + timeout
        while not status.exists():
            assert time.monotonic() < deadline, f"{name}: no result after {timeout} s"
            time.sleep(0.5)
        assert status.read_text().strip() == "0", err.read_text()[-5000:]
        return json.loads(out.read_text().strip().splitlines()[-1])

    return wait


_BACKGROUND = []  # started processes, kept so that they are reaped


def load_tool(name):
    """`tools/<name>.py` as a module (tools/ is no package)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
