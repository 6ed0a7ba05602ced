"""Exact large contrastive batches in the memory of a micro-batch (gradient caching).

A contrastive loss couples its whole batch: every image is contrasted with every
caption. Keras' gradient accumulation over N micro-batches of B pairs therefore
trains a different objective (each image against B captions, not N B). Gradient
caching (Gao et al., "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup", RepL4NLP 2021) keeps the full batch exact and bounds the memory of
the towers instead:

1. embed all N examples, a micro-batch of m at a time, keeping no activations;
2. compute the loss over the N embeddings and its gradient with respect to them;
3. run each micro-batch forward again and back-propagate its slice of those
   embedding gradients into the towers.

`micro_batched` expresses exactly this to the framework's own autodiff: each
micro-batch's tower call is wrapped in `keras.remat` (`jax.checkpoint`,
`torch.utils.checkpoint`, `tf.recompute_grad`), which keeps only its inputs and
outputs in the forward pass and, in the backward pass, re-runs the micro-batch
and back-propagates the gradient arriving at its outputs, which is step 3. The
loss and the logit scale/bias see all N embeddings, so the gradients are the
full batch's (up to floating-point summation order). Peak activation memory is
one micro-batch's tower activations, plus the N embeddings and the loss's own.
On JAX the micro-batches run in one `scan`, so the compiled step holds one copy
of each tower whatever N / m.

Set through `vlzoo.training.configure(model, micro_batch_size=m)` (or
`model.micro_batch_size = m` before compiling); a training setting, not saved in
the model's config.
"""

import keras
from keras import ops

from vlzoo._backends import switches

__all__ = ["micro_batched"]


def micro_batched(compute, inputs, micro_batch_size):
    """`compute(inputs)` run `micro_batch_size` rows at a time under `keras.remat`, concatenated.

    Args:
        compute: a function of a tensor, or of a dict of tensors, with a batch axis first, to a dict
            of per-example tensors (a model's `_image_features` / `_text_features`); nothing in it may
            couple the examples of a batch.
        inputs: `(B, ...)` tensor or (nested) dict of `(B, ...)` tensors; `B` (static) a multiple of
            `micro_batch_size`.
        micro_batch_size: rows per `compute` call.

    Returns:
        `compute`'s dict for all `B` rows.
    """
    values = keras.tree.flatten(inputs)
    batch = values[0].shape[0]
    if batch is None:
        raise ValueError(
            f"Gradient caching (`micro_batch_size` {micro_batch_size}) needs a batch size known when the step is "
            "traced; it is not here (TensorFlow: feed a tf.data.Dataset batched with drop_remainder=True, as "
            "vlzoo.data pipelines are in training; under a tf.distribute strategy, feed each replica its batches "
            "with `vlzoo.parallel.feed`, or a repeating `distribute_datasets_from_function` and `steps_per_epoch`).")
    if batch % micro_batch_size:
        raise ValueError(f"The batch size ({batch}) must be a multiple of `micro_batch_size` ({micro_batch_size}) "
                         "for gradient caching; choose a batch size it divides.")
    names = []

    def remat_call(chunk):
        # Only floating tensors cross the remat boundary (TensorFlow's `recompute_grad` differentiates
        # every argument); token ids and masks are bound to the chunk's function.
        floating = [k for k, value in enumerate(chunk) if "float" in keras.backend.standardize_dtype(value.dtype)]

        def step(*floats):
            arrays = list(chunk)
            for k, value in zip(floating, floats):
                arrays[k] = value
            outputs = compute(keras.tree.pack_sequence_as(inputs, arrays))
            names[:] = list(outputs)
            return tuple(outputs[name] for name in names)

        return keras.remat(step)(*(chunk[k] for k in floating))

    steps = batch // micro_batch_size
    if switches.scans_micro_batches():
        # One `scan` over the micro-batches (JAX): the towers are traced and compiled once, whatever N / m (a
        # Python loop would put N / m copies of each tower into the compiled step). TensorFlow's
        # `ops.scan` needs outputs shaped like its carry and PyTorch runs eagerly: they loop below.
        stacked = [ops.reshape(value, (steps, micro_batch_size, *value.shape[1:])) for value in values]
        _, outputs = ops.scan(lambda carry, chunk: (carry, remat_call(chunk)), ops.zeros(()), stacked)
        return {name: ops.reshape(out, (batch, *out.shape[2:])) for name, out in zip(names, outputs, strict=True)}
    parts = [remat_call([value[start:start + micro_batch_size] for value in values])
             for start in range(0, batch, micro_batch_size)]
    return {name: ops.concatenate([part[k] for part in parts], axis=0) for k, name in enumerate(names)}
