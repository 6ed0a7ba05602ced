"""The places where vlzoo needs Keras internals, each behind one helper.

Keras 3 has no public API for these jobs, so `keras.src` is imported here and
nowhere else in the package:

- `without_weights()`: build a model whose variables have shapes but no
  values. `keras.StatelessScope(initialize_variables=False)` is public, but it
  records every deferred variable in Keras' global state
  (`keras.src.backend.common.global_state`, key `"uninitialized_variables"`)
  and would initialise them all at the next stateful call; the list has to be
  restored when the scope ends, and only the private module can do that.
- `initialized_for_loading()`: build a model whose weights are loaded next,
  with zeros from host memory instead of its initializers' draws (on JAX each
  initializer shape is a compiled program). The same deferred variables as
  `without_weights()`, then initialised through Keras' private
  `Variable._deferred_initialize` with a host-memory initializer.
- `save_weights_only()`: write a model's weights without its optimizer.
  `Model.save_weights` always includes a compiled model's optimizer variables;
  `keras.src.saving.saving_lib.save_weights_only` takes `objects_to_skip`.
- `call_sublayer()`: call a built sublayer from its parent's `call` without
  `Layer.__call__`'s bookkeeping where that bookkeeping would change nothing.
  On PyTorch, eager calls spend most of their time there (docs/workarounds.md).
  Whether it would change anything depends on the autocast scope in force,
  which only `keras.src.backend` exposes.
- `in_stateless_scope()`: whether a `keras.StatelessScope` is open, so that
  the variables' values are the scope's, not their own (a stateless call, or
  Keras' shape inference). `keras.StatelessScope` is public; the question
  whether one is open is asked through `keras.src.backend`.
- `arange_with_start()`: Keras' JAX `arange(stop)` calls `jnp.arange(stop, None)`,
  which jax2onnx (0.17.1 and before), the converter of Keras' ONNX export from JAX,
  reads as start and stop: every `ops.arange(n)` fails there. Within the scope Keras'
  JAX `arange` passes `(0, stop)`, through its private backend module. Delete when
  jax2onnx reads `jnp.arange(stop, None)` as `jnp.arange(stop)`.
- `import_tensorflow_when_used()`: on JAX and PyTorch, Keras imports
  TensorFlow whenever it is installed: its serialiser asks, for every value of
  every `get_config` (so at every layer's construction), whether it is a
  `tf.TensorShape`, `tf.DType` or `tf.TypeSpec`, and `set_random_seed` seeds
  TensorFlow. Only Keras' private modules hold the names it asks through.
  Applied when this module is imported. Delete when Keras imports TensorFlow
  only where it is used.

Example:

>>> with without_weights():
...     model = vlzoo.CLIP(**config)           # no memory for the weights
...     count = sum(math.prod(v.shape) for v in model.weights)
"""

import contextlib
import importlib.abc
import importlib.util
import random
import sys

import keras
import numpy as np
from keras.src import backend
from keras.src.backend.common import global_state
from keras.src.saving import saving_lib
from keras.src.saving import serialization_lib
from keras.src.utils import rng_utils

_PENDING = "uninitialized_variables"


@contextlib.contextmanager
def _deferred_variables(finish):
    """Creates the block's variables deferred, then calls `finish(variable)` on each; Keras' pending list and
    Python's `random` state are as before the block."""
    pending = list(global_state.get_global_attribute(_PENDING, [], set_to_default=True))
    random_state = random.getstate()
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        created = global_state.get_global_attribute(_PENDING, [])[len(pending):]
        global_state.set_global_attribute(_PENDING, pending)
        for variable in created:
            finish(variable)
        random.setstate(random_state)


def _seed_states_only(variable):
    if variable.name == "seed_generator_state":
        variable._deferred_initialize()


def _host_zeros(shape, dtype=None):
    """Zeros in host memory; a dtype numpy lacks (bfloat16 without ml_dtypes) is cast by the variable."""
    try:
        return np.zeros(shape, dtype=np.dtype(dtype))
    except TypeError:
        return np.zeros(shape, dtype="float32")


def _zeros_from_host(variable):
    if variable.name != "seed_generator_state":
        variable._initializer = _host_zeros
    variable._deferred_initialize()


def without_weights():
    """Creates variables inside the block with their shapes only; no value is ever allocated.

    Models built here can be counted, traced with `keras.KerasTensor` inputs
    and serialised, but not called on data. Keras' list of variables waiting
    for initialisation is restored on exit, so a later eager call does not
    try to initialise them. The states of random generators
    (`keras.random.SeedGenerator`, two integers each, never among a model's
    weights) are initialised on exit: loading weights does not assign them.
    Python's `random`, from which Keras draws the seed of every unseeded
    initializer it constructs, is restored on exit: no value was drawn, so a
    seeded caller's stream is left as it was.
    """
    return _deferred_variables(_seed_states_only)


def initialized_for_loading():
    """Creates variables inside the block as zeros taken from host memory, for a model whose every weight is
    loaded next.

    No initializer runs: no random value is drawn (Python's `random` is left as it was) and, on JAX, no
    initializer program is compiled per weight shape. The states of random generators
    (`keras.random.SeedGenerator`) are initialised as usual.

    Example:
    >>> with initialized_for_loading():
    ...     model = vlzoo.CLIP(**config)  # doctest: +SKIP
    >>> model.load_weights("model.weights.h5")  # doctest: +SKIP
    """
    return _deferred_variables(_zeros_from_host)


def in_stateless_scope():
    """Whether a `keras.StatelessScope` is open (then variables read the values it maps them to)."""
    return backend.in_stateless_scope()


def save_weights_only(model, path):
    """`model.save_weights(path)` without the optimizer's variables (twice the weights again for Adam)."""
    skip = [model.optimizer] if getattr(model, "optimizer", None) is not None else None
    saving_lib.save_weights_only(model, str(path), objects_to_skip=skip)


def call_sublayer(layer, *args, **kwargs):
    """`layer(*args, **kwargs)` from inside a parent layer's `call`: the same outputs, with less host work.

    `Layer.__call__` converts inputs to the layer's dtype, builds it, resolves
    `training`, opens a name scope and an autocast scope, relays the output
    under a distribution, tracks masks and records nodes for functional
    models. For a built sublayer called on tensors already in its input
    dtype, inside the autocast scope its own call would open, with no
    distribution, quantization or rematerialisation mode set, none of that
    changes the result, and `layer.call` runs directly. Otherwise it falls
    back to `layer(...)`. Meant for sublayers whose `call` takes no
    `training` argument (it is not resolved here).

    Args:
        layer: a built `keras.layers.Layer`.
        *args: its call's tensor arguments.
        **kwargs: its call's other arguments.

    Returns:
        What `layer(*args, **kwargs)` returns.
    """
    if calls_directly(layer, args + tuple(kwargs.values())):
        return layer.call(*args, **kwargs)
    return layer(*args, **kwargs)


# Keras' name of each backend dtype met (`standardize_dtype` parses it anew at every call).
_DTYPE_NAMES = {}


def _dtype_name(dtype):
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = backend.standardize_dtype(dtype)
    return name


def calls_directly(layer, values):
    """Whether `layer.call` does exactly what `layer.__call__` would on these argument `values` (`call_sublayer`)."""
    if not layer.built or getattr(layer, "quantization_mode", None) is not None or layer._remat_mode:
        return False
    input_dtype = layer.input_dtype
    # One level of tuples or lists (the rotary embedding's `(sin, cos)`); cheaper than `keras.tree.flatten`.
    values = [item for value in values for item in (value if isinstance(value, (tuple, list)) else (value,))]
    for value in values:
        if value is None or isinstance(value, (bool, int, float, str)):
            continue
        if not backend.is_tensor(value):
            return False  # symbolic or foreign inputs `__call__` converts or records
        dtype = _dtype_name(value.dtype)
        if dtype != input_dtype and backend.is_float_dtype(dtype):
            return False  # inputs `__call__` would cast
    if keras.distribution.distribution() is not None:
        return False
    scope = backend.get_autocast_scope()
    current = None if scope is None else scope.dtype
    compute = layer.compute_dtype
    if scope is not None:  # the scope `Layer.__call__` would run `call` in
        wanted = compute if layer.autocast and backend.is_float_dtype(compute) else None
    else:
        wanted = compute if compute != layer.variable_dtype else None
    return wanted == current


class _TensorFlowOnceImported:
    """Keras' lazy `tensorflow` module, available only once TensorFlow has been imported: a TensorFlow value
    (`tf.TensorShape`, `tf.DType`, `tf.TypeSpec`) exists only then, so the isinstance checks guarded by `available`
    answer as before without importing it."""

    def __init__(self, lazy):
        self._lazy = lazy

    @property
    def available(self):
        return "tensorflow" in sys.modules and self._lazy.available

    def __getattr__(self, name):
        return getattr(self._lazy, name)


class _TensorFlowSeededOnImport(_TensorFlowOnceImported):
    """The same for `keras.utils.set_random_seed`: a TensorFlow not imported yet is seeded when it is
    (with Keras' global seed at that moment), as `set_random_seed` would have seeded it."""

    @property
    def available(self):
        if "tensorflow" in sys.modules:
            return self._lazy.available
        if importlib.util.find_spec("tensorflow") is not None and not any(
                isinstance(finder, _SeedAfterImport) for finder in sys.meta_path):
            sys.meta_path.insert(0, _SeedAfterImport())
        return False


class _SeedAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `tensorflow` through the other finders and, once its module has run, seeds it with Keras' global
    seed; removes itself from `sys.meta_path` at its first use."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self._loader
        self._loader.exec_module(module)
        seed = global_state.get_global_attribute(rng_utils.GLOBAL_RANDOM_SEED)
        if seed is not None:
            module.random.set_seed(seed)


@contextlib.contextmanager
def arange_with_start():
    """On JAX, Keras' `arange(stop)` calls `jnp.arange(0, stop)` inside the block instead of
    `jnp.arange(stop, None)`: the same values, a call jax2onnx converts. Nothing changes elsewhere.

    jax2onnx replaces `jnp.arange` while it converts a function and reads two positional arguments
    as start and stop, so Keras' ONNX export from JAX fails at the first `ops.arange(n)` (a
    `None` stop). Keras' JAX `arange` is looked up in its backend module at every call; that
    module's entry is swapped for the block.

    Example:
    >>> with arange_with_start():
    ...     encoder.export("image.onnx", format="onnx")  # doctest: +SKIP
    """
    if keras.backend.backend() != "jax":
        yield
        return
    from keras.src.backend.jax import numpy as jax_numpy

    arange = jax_numpy.arange

    def with_start(start, stop=None, step=None, dtype=None):
        if stop is None:
            start, stop = 0, start
        return arange(start, stop, step=step, dtype=dtype)

    jax_numpy.arange = with_start
    try:
        yield
    finally:
        jax_numpy.arange = arange


def import_tensorflow_when_used():
    """On JAX and PyTorch, Keras' serialiser and `set_random_seed` leave
    TensorFlow unimported until something else imports it (a `tf.data` pipeline, the user); nothing else
    changes. Called when this module is imported (every vlzoo layer imports it). Does nothing on TensorFlow,
    or when called again."""
    if keras.backend.backend() == "tensorflow" or isinstance(rng_utils.tf, _TensorFlowOnceImported):
        return
    serialization_lib.tf = _TensorFlowOnceImported(serialization_lib.tf)
    rng_utils.tf = _TensorFlowSeededOnImport(rng_utils.tf)


import_tensorflow_when_used()
