"""`AdamW`: Keras' AdamW, whose update runs as one fused kernel on PyTorch.

Keras' AdamW on PyTorch updates the variables with ten `torch._foreach_*`
passes over the weights and five temporaries the size of the model; on the
CPU, where PyTorch's foreach operations loop over the tensors one by one, it
is much slower than PyTorch's own AdamW (docs/workarounds.md). This
subclass hands the update to PyTorch's fused Adam kernel, which reads and
writes each weight, gradient and moment once: the same update (Keras'
epsilon placement, weight decay and exclusions), rounded in one pass. On JAX
and TensorFlow it is Keras' AdamW.

Example:

>>> model.compile(optimizer=vlzoo.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.1))
>>> model.compile()  # the same class, Keras' defaults: `optimizer="adamw"`
"""

import keras

from vlzoo._backends.running import optimizers as _fused

# PyTorch's fused update (`vlzoo._backends.torch.optimizers`); None on the backends without one.
UpdateCount = None if _fused is None else _fused.UpdateCount
fused_update = None if _fused is None else _fused.fused_update


@keras.saving.register_keras_serializable(package="vlzoo")
class AdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW`, with the update through PyTorch's fused Adam kernel on PyTorch.

    Takes `keras.optimizers.AdamW`'s arguments. For a gradient in another
    dtype than its variable, the update is Keras' own.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._update_count = None if UpdateCount is None else UpdateCount()

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if fused_update is None:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        rest = fused_update(self, grads, trainable_variables, learning_rate, self._update_count)
        if rest:
            super()._backend_update_step(*map(list, zip(*rest)), learning_rate)


__all__ = ["AdamW"]
