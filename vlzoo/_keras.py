"""The two places where vlzoo needs Keras internals, each behind one helper.

Keras 3 has no public API for either job, so `keras.src` is imported here and
nowhere else in the package:

- `without_weights()`: build a model whose variables have shapes but no
  values. `keras.StatelessScope(initialize_variables=False)` is public, but it
  records every deferred variable in Keras' global state
  (`keras.src.backend.common.global_state`, key `"uninitialized_variables"`)
  and would initialise them all at the next stateful call; the list has to be
  restored when the scope ends, and only the private module can do that.
- `save_weights_only()`: write a model's weights without its optimizer.
  `Model.save_weights` always includes a compiled model's optimizer variables;
  `keras.src.saving.saving_lib.save_weights_only` takes `objects_to_skip`.

Example:

>>> with without_weights():
...     model = vlzoo.CLIP(**config)           # no memory for the weights
...     count = sum(math.prod(v.shape) for v in model.weights)
"""

import contextlib

import keras
from keras.src.backend.common import global_state
from keras.src.saving import saving_lib

_PENDING = "uninitialized_variables"


@contextlib.contextmanager
def without_weights():
    """Creates variables inside the block with their shapes only; no value is ever allocated.

    Models built here can be counted, traced with `keras.KerasTensor` inputs
    and serialised, but not called on data. Keras' list of variables waiting
    for initialisation is restored on exit, so a later eager call does not
    try to initialise them. The states of random generators
    (`keras.random.SeedGenerator`, two integers each, never among a model's
    weights) are initialised on exit: loading weights does not assign them.
    """
    pending = list(global_state.get_global_attribute(_PENDING, [], set_to_default=True))
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        created = global_state.get_global_attribute(_PENDING, [])[len(pending):]
        global_state.set_global_attribute(_PENDING, pending)
        for variable in created:
            if variable.name == "seed_generator_state":
                variable._deferred_initialize()


def save_weights_only(model, path):
    """`model.save_weights(path)` without the optimizer's variables (twice the weights again for Adam)."""
    skip = [model.optimizer] if getattr(model, "optimizer", None) is not None else None
    saving_lib.save_weights_only(model, str(path), objects_to_skip=skip)
