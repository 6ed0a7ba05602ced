"""The running backend's modules: the one place in vlzoo that selects them.

- `compiled`: eager calls run as one compiled program (`vlzoo.compiled`);
- `parallel`: one training step over several processes or devices (`vlzoo.parallel`);
- `kernels`: faster kernels for the dense layers and attention (`vlzoo.kernels`); JAX's, None elsewhere;
- `optimizers`: Adam's update through a fused kernel (`vlzoo.optimizers.AdamW`); PyTorch's, None elsewhere.

The backend is Keras' (`KERAS_BACKEND`), read once when this module is imported, as Keras reads it.

Example:
>>> from vlzoo._backends.running import parallel
>>> parallel.world_size()  # training alone
1
"""

import keras

BACKEND = keras.backend.backend()

if BACKEND == "jax":
    from vlzoo._backends.jax import compiled, kernels, parallel

    optimizers = None
elif BACKEND == "tensorflow":
    from vlzoo._backends.tensorflow import compiled, parallel

    kernels = optimizers = None
elif BACKEND == "torch":
    from vlzoo._backends.torch import compiled, optimizers, parallel

    kernels = None
else:  # Keras' other backends, which vlzoo does not test: the modules the public packages picked for them before
    from vlzoo._backends.jax import parallel
    from vlzoo._backends.torch import compiled

    kernels = optimizers = None

__all__ = ["BACKEND", "compiled", "kernels", "optimizers", "parallel"]
