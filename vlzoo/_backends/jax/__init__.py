"""JAX's own code: `compiled` (`jax.jit` of eager calls), `parallel` (`keras.distribution`: nothing
gathered by hand), `kernels` (float32-accumulated bfloat16 products on the CPU, cuDNN attention on
padded inputs on a GPU). Selected by `vlzoo._backends.running`."""
