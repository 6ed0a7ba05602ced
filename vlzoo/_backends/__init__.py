"""What differs per Keras backend, and vlzoo's workarounds of Keras' and the backends' gaps, fenced here.

The public modules `vlzoo.compiled`, `vlzoo.parallel`, `vlzoo.optimizers` and `vlzoo.kernels` are
backend-neutral facades over it. Each entry says what differs per backend, why, and when it can be
deleted.

- `running`: the one place that selects the running backend's modules (`compiled`, `parallel`,
  `kernels`, `optimizers`; None where the backend has none).
- `jax/`, `tensorflow/`, `torch/`: each backend's own code, together: `compiled` (eager calls run
  as one program), `parallel` (a step over several processes or devices), JAX's `kernels` (faster
  routes for the dense layers and attention), PyTorch's `optimizers` (Adam's fused update).
- `workarounds`: the model class's workarounds of Keras' and the backends' gaps.
- `keras_internals`: the only imports of Keras internals (`keras.src`), each behind one helper.

This package imports nothing of vlzoo but itself and the leaf helpers (`vlzoo._arrays`): the layers
above it import it, never the reverse. Importing this package itself imports no backend module;
`running` does. docs/workarounds.md lists every workaround with what it buys.
"""
