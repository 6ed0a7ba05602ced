"""What differs per Keras backend, and vlzoo's workarounds of Keras' and the backends' gaps, fenced here.

Outside this package no code path is chosen by the backend: the public modules `vlzoo.compiled`,
`vlzoo.parallel`, `vlzoo.optimizers` and `vlzoo.kernels` are backend-neutral facades over it, the
layers, losses, models, data pipelines and command line call its named switches, and elsewhere the
backend's name is only reported, used as a cache key, or passed to `vlzoo.serving.unsupported` (the
table of what Keras' exporters support on each backend). Each entry says what differs per backend,
why, and when it can be deleted.

- `running`: the one place that selects the running backend's modules (`compiled`, `parallel`,
  `kernels`, `optimizers`; None where the backend has none).
- `jax/`, `tensorflow/`, `torch/`: each backend's own code, together: `compiled` (eager calls run
  as one program), `parallel` (a step over several processes or devices), JAX's `kernels` (faster
  routes for the dense layers and attention), PyTorch's `optimizers` (Adam's fused update).
- `switches`: the small per-backend decisions of the layers, losses, models, data pipelines and
  command line, one named function each.
- `workarounds`: the model class's workarounds of Keras' and the backends' gaps.
- `keras_internals`: the only imports of Keras internals, each behind one helper.

This package imports nothing of vlzoo but itself and the leaf helpers (`vlzoo._arrays`): the layers
above it import it, never the reverse. Importing this package itself imports no backend module;
`running` does. docs/workarounds.md lists every workaround with what it buys.
"""
