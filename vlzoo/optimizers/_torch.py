"""PyTorch: Adam's update of all variables through PyTorch's fused kernel (`torch._fused_adam_`)."""

import math

import torch


def fused_update(optimizer, grads, variables, learning_rate):
    """Adam's moment and variable updates of `optimizer` (a `keras.optimizers.Adam` or `AdamW`), one fused
    kernel call per device and dtype; `(gradient, variable)` pairs it cannot take are returned.

    Keras' update is `v -= alpha * m / (sqrt(s) + epsilon)` with
    `alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`; PyTorch's kernel divides
    `sqrt(s)` by `sqrt(1 - beta_2^t)` before adding its epsilon, so it is given
    `epsilon / sqrt(1 - beta_2^t)`: the same update, rounded in one pass
    (with `amsgrad`, both divide by the largest second moment so far).
    Weight decay is not applied here (Keras applies it before the update).
    The step count and the learning rate are read on the host (the kernel
    takes epsilon as a number): on a GPU, a wait for the device per update.

    Returns:
        The `(gradient, variable)` pairs left to Keras' own update: those whose gradient's dtype is not
        the variable's.
    """
    step = int(optimizer.iterations) + 1  # Keras counts the update after applying it
    epsilon = optimizer.epsilon / math.sqrt(1.0 - optimizer.beta_2 ** step)
    rate = float(learning_rate)
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
            steps = [torch.tensor(float(step), device=device)] * len(values)
            torch._fused_adam_(values, gradients, momentums, velocities, largest[0] if largest else [], steps,
                               lr=rate, beta1=optimizer.beta_1, beta2=optimizer.beta_2, weight_decay=0.0,
                               eps=epsilon, amsgrad=optimizer.amsgrad, maximize=False)
    return rest
