"""TensorFlow's own code: `compiled` (`tf.function` of eager calls), `parallel` (`tf.distribute`
strategies: the replica context's `all_gather`). Selected by `vlzoo._backends.running`."""
