"""PyTorch: Adam's update of all variables through PyTorch's fused kernel (`torch._fused_adam_`)."""

import math

import torch


class UpdateCount:
    """An optimizer's step count known on the host, so that an update need not wait for the device to read it.

    Read from `optimizer.iterations` at the first update, then counted: Keras adds one to the variable after
    each update, an in-place write that PyTorch counts in the tensor's `_version`. The count is read from
    the device again where the variable was written otherwise in between (assigned, restored from a
    checkpoint), and where `iterations` is a tensor computed afresh at each update rather than the
    variable (Keras' count of updates under gradient accumulation).
    """

    def __init__(self):
        self._last = None  # (the counter tensor, its version and value at the last update)

    def __call__(self, iterations):
        """The value of `iterations` (a `keras.Variable` or a scalar tensor) now."""
        counter = getattr(iterations, "value", iterations)
        last = self._last
        if last is not None and last[0] is counter and counter._version == last[1] + 1:
            value = last[2] + 1  # only Keras' increment since the last update
        else:
            value = int(counter)
        self._last = (counter, counter._version, value)
        return value


def fused_update(optimizer, grads, variables, learning_rate, count):
    """Adam's moment and variable updates of `optimizer` (a `keras.optimizers.Adam` or `AdamW`), one fused
    kernel call per device and dtype; `(gradient, variable)` pairs it cannot take are returned.

    Keras' update is `v -= alpha * m / (sqrt(s) + epsilon)` with
    `alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`; PyTorch's kernel divides
    `sqrt(s)` by `sqrt(1 - beta_2^t)` before adding its epsilon, so it is given
    `epsilon / sqrt(1 - beta_2^t)`: the same update, rounded in one pass
    (with `amsgrad`, both divide by the largest second moment so far).
    Weight decay is not applied here (Keras applies it before the update).
    Nothing is read from the device: the step count, which epsilon depends on
    and the kernel takes as a number, is `count`'s, and the learning rate is
    given to the kernel as a tensor.

    Args:
        optimizer: the optimizer.
        grads: the gradients, one per variable.
        variables: the `keras.Variable`s to update.
        learning_rate: the optimizer's learning rate now, a `keras.Variable` or a scalar tensor.
        count: the optimizer's `UpdateCount`.

    Returns:
        The `(gradient, variable)` pairs left to Keras' own update: those whose gradient's dtype is not
        the variable's.
    """
    step = count(optimizer.iterations) + 1  # Keras counts the update after applying it
    epsilon = optimizer.epsilon / math.sqrt(1.0 - optimizer.beta_2 ** step)
    rate = getattr(learning_rate, "value", learning_rate)
    groups, rest = {}, []
    for grad, variable in zip(grads, variables):
        value = variable.value
        if grad.dtype != value.dtype:
            rest.append((grad, variable))
            continue
        index = optimizer._get_variable_index(variable)
        state = [value, grad, optimizer._momentums[index].value, optimizer._velocities[index].value]
        if optimizer.amsgrad:  # the largest second moment so far, which the update divides by
            state.append(optimizer._velocity_hats[index].value)
        group = groups.setdefault((value.device, value.dtype), [[] for _ in state])
        for items, item in zip(group, state):
            items.append(item)
    with torch.no_grad():
        for (device, _), (values, gradients, momentums, velocities, *largest) in groups.items():
            steps = [torch.full((), step, dtype=torch.float32, device=device)] * len(values)  # no host copy
            torch._fused_adam_(values, gradients, momentums, velocities, largest[0] if largest else [], steps,
                               lr=rate, beta1=optimizer.beta_1, beta2=optimizer.beta_2, weight_decay=0.0,
                               eps=epsilon, amsgrad=optimizer.amsgrad, maximize=False)
    return rest
