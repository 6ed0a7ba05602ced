"""TensorFlow: eager calls as a `tf.function`, traced once per input signature."""

import tensorflow as tf


def inference_function(fn, variables):
    """`fn` as a `tf.function` when called eagerly; `fn` itself inside a graph (`vlzoo.compiled`).

    A traced graph holds the variables it read: one graph is kept per set of variables (`variables()`,
    called at each call), so that after `enable_lora` or `quantize` replace some, the call traces
    again instead of reading the old ones. Each input shape gets its own trace: the towers read static
    sizes (the image's height and width, the text's length), which a trace for unknown sizes
    (`reduce_retracing`) would not have.
    """
    graphs = {}

    def call(*args):
        if not tf.executing_eagerly():
            return fn(*args)
        key = tuple(id(v) for v in variables())
        if key not in graphs:
            graphs.clear()
            graphs[key] = tf.function(fn)
        return graphs[key](*args)

    return call
