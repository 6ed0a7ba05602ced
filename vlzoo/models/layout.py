"""What a model declares about its own sharding, below `vlzoo.distribution`.

- `TOWER_RULES`: `(path pattern, axes)` of the towers' Megatron-style splits,
  matched with `re.fullmatch` on `variable.path`; `MODEL_AXIS` ("model") marks
  the dimension split over the mesh's model axis. A family adds its own
  `extra_layout_rules` (`ContrastiveModel.layout_rules`).
- `check_backend(what)`: `keras.distribution` runs on JAX only in Keras 3.15;
  building or compiling under a distribution on another backend raises.

`vlzoo.distribution.layout_map` turns these rules into a Keras `LayoutMap`.
"""

import keras

MODEL_AXIS = "model"
_M = MODEL_AXIS  # the placeholder in the rules, replaced by the mesh's model axis

# (path pattern, axes) shared by every family's towers; `re.fullmatch` on `variable.path`.
TOWER_RULES = (
    (r".*/attention/(query|key|value)/kernel", (None, _M)),
    (r".*/attention/(query|key|value)/bias", (_M,)),
    (r".*/attention/output/kernel", (_M, None)),
    (r".*/mlp/fc1/kernel", (None, _M)),
    (r".*/mlp/fc1/bias", (_M,)),
    (r".*/mlp/fc2/kernel", (_M, None)),
    (r".*/(token|position)_embedding/embeddings", (None, _M)),
    (r".*/patch_embedding/conv/kernel", (None, None, None, _M)),
    (r"(.*/)?\w*projection/kernel", (_M, None)),
)


def check_backend(what="keras.distribution"):
    """Raises `NotImplementedError` unless the backend is JAX (see the module docstring)."""
    backend = keras.backend.backend()
    if backend != "jax":
        raise NotImplementedError(
            f"{what} needs the JAX backend: keras.distribution (DataParallel, ModelParallel) runs on JAX only "
            f"in Keras {keras.__version__}. On {backend}, train on several devices with its own engine "
            "(torchrun and torch.distributed, or a tf.distribute strategy: docs/distributed.md) and unset the "
            "distribution (keras.distribution.set_distribution(None)), or run with KERAS_BACKEND=jax."
        )
