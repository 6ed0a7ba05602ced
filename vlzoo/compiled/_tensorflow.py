"""TensorFlow: eager calls as a `tf.function`, traced once per input signature."""

import tensorflow as tf


def inference_function(fn, variables):
    """`fn` as a `tf.function` when called eagerly; `fn` itself inside a graph (`vlzoo.compiled`).

    A traced graph holds the variables it read: one graph is kept per set of variables (`variables()`,
    called at each call), so that after `enable_lora` or `quantize` replace some, the call traces
    again instead of reading the old ones. `reduce_retracing` lets a new batch size reuse a graph
    traced for unknown sizes instead of tracing one per size.
    """
    graphs = {}

    def call(*args):
        if not tf.executing_eagerly():
            return fn(*args)
        key = tuple(id(v) for v in variables())
        if key not in graphs:
            graphs.clear()
            graphs[key] = tf.function(fn, reduce_retracing=True)
        return graphs[key](*args)

    return call
