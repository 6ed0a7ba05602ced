"""Weight-space ensembles of two models of one geometry (WiSE-FT).

WiSE-FT (Wortsman et al., "Robust fine-tuning of zero-shot models", CVPR 2022) mixes a zero-shot
model's weights `theta_0` with those of the same model after fine-tuning, `theta_1`:

    theta(alpha) = (1 - alpha) * theta_0 + alpha * theta_1,   0 <= alpha <= 1

computed in float32 (float64 for float64 variables), so that `alpha = 0` and `alpha = 1` give
`theta_0` and `theta_1` exactly. Integer variables (counters such as STAIR's step counts) are
taken from the fine-tuned model. The paper finds intermediate values (often 0.5) keep most of the
fine-tuned accuracy in distribution and most of the zero-shot robustness under shift.

Example:
>>> zero_shot = vlzoo.from_preset("clip_shapes")  # doctest: +SKIP
>>> mixed = interpolate(zero_shot, finetuned, 0.5)  # finetuned: zero_shot's copy after fit  # doctest: +SKIP
>>> interpolation_sweep(zero_shot, finetuned, [0, 0.5, 1],
...                     lambda m: {"acc": evaluate(m)})  # doctest: +SKIP
[{'alpha': 0.0, 'acc': ...}, {'alpha': 0.5, 'acc': ...}, {'alpha': 1.0, 'acc': ...}]
"""

import math
import numbers

import keras
import numpy as np

from vlzoo.training._models import blank_copy, check_model

__all__ = ["interpolate", "interpolation_sweep"]


def _check_alpha(alpha):
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha) \
            or not 0 <= alpha <= 1:
        raise ValueError(f"`alpha` must be a number in [0, 1]; received {alpha!r}.")
    return float(alpha)


def _check_geometry(zero_shot, finetuned):
    """Both models of one class and config (the dtype policy and the training state, such as STAIR's
    stage, aside), with the same variables."""
    if type(zero_shot) is not type(finetuned):
        raise ValueError(f"`zero_shot` is a {type(zero_shot).__name__} and `finetuned` a "
                         f"{type(finetuned).__name__}: interpolation needs two models of one family.")
    ignored = ("dtype", "name", "trainable", *type(finetuned).training_state_config_keys)
    configs = [{k: v for k, v in m.get_config().items() if k not in ignored} for m in (zero_shot, finetuned)]
    if configs[0] != configs[1]:
        differing = sorted(k for k in configs[0].keys() | configs[1].keys()
                           if configs[0].get(k) != configs[1].get(k))
        raise ValueError(f"`zero_shot` and `finetuned` differ in geometry (config entries {differing}); "
                         "interpolation needs two models of one geometry.")
    for a, b in zip(zero_shot.weights, finetuned.weights, strict=True):
        if a.path != b.path or tuple(a.shape) != tuple(b.shape):
            raise ValueError(f"Variable {a.path} {tuple(a.shape)} of `zero_shot` has no match in `finetuned` "
                             f"(found {b.path} {tuple(b.shape)}).")


def _mix(theta_0, theta_1, alpha):
    """`(1 - alpha) * theta_0 + alpha * theta_1` for floating arrays; `theta_1` for counters."""
    theta_0, theta_1 = np.asarray(theta_0), np.asarray(theta_1)
    if not np.issubdtype(theta_0.dtype, np.floating) and theta_0.dtype.name != "bfloat16":
        return theta_1
    wide = np.float64 if theta_0.dtype == np.float64 else np.float32
    mixed = (1 - alpha) * theta_0.astype(wide) + alpha * theta_1.astype(wide)
    return mixed.astype(theta_0.dtype)


def interpolate(zero_shot, finetuned, alpha):
    """A new model whose weights are `(1 - alpha) * zero_shot's + alpha * finetuned's`.

    Args:
        zero_shot: the model before fine-tuning (a vlzoo model).
        finetuned: the same family and geometry after fine-tuning.
        alpha: the mixing coefficient in [0, 1]; 0 gives `zero_shot`'s
            weights and 1 `finetuned`'s, bit for bit.

    Returns:
        A new model of `finetuned`'s config and dtype policy, with its
        tokenizer and preprocessor; neither input changes.

    Raises:
        TypeError: an input is not a vlzoo model.
        ValueError: `alpha` outside [0, 1]; the models differ in family,
            geometry or variables.

    Example:
    >>> interpolate(zero_shot, finetuned, 0.5).get_config() == finetuned.get_config()  # doctest: +SKIP
    True
    """
    check_model(zero_shot, "zero_shot")
    check_model(finetuned, "finetuned")
    alpha = _check_alpha(alpha)
    _check_geometry(zero_shot, finetuned)
    mixed = blank_copy(finetuned)
    for target, a, b in zip(mixed.weights, zero_shot.weights, finetuned.weights, strict=True):
        target.assign(_mix(keras.ops.convert_to_numpy(a.value), keras.ops.convert_to_numpy(b.value), alpha))
    return mixed


def interpolation_sweep(zero_shot, finetuned, alphas, evaluate):
    """`evaluate(interpolate(zero_shot, finetuned, alpha))` for each alpha: the WiSE-FT curve.

    Args:
        zero_shot, finetuned: as for `interpolate`.
        alphas: a non-empty sequence of numbers in [0, 1].
        evaluate: a callable from a model to a dict of metrics (str -> number),
            e.g. in-distribution and shifted accuracy.

    Returns:
        A list of `{"alpha": alpha, **evaluate(model)}`, one per alpha in order.

    Raises:
        TypeError: an input is not a vlzoo model, or `evaluate` is not callable.
        ValueError: no alphas or one outside [0, 1], `interpolate`'s checks, or `evaluate`
            returning something other than a dict without an `"alpha"` key.

    Example:
    >>> interpolation_sweep(zero_shot, finetuned, [0, 1], lambda m: {"n": 1})  # doctest: +SKIP
    [{'alpha': 0.0, 'n': 1}, {'alpha': 1.0, 'n': 1}]
    """
    alphas = [_check_alpha(a) for a in alphas]
    if not alphas:
        raise ValueError("`alphas` must name at least one value in [0, 1].")
    if not callable(evaluate):
        raise TypeError(f"`evaluate` must be a callable from a model to a dict; received {type(evaluate).__name__}.")
    rows = []
    for alpha in alphas:
        metrics = evaluate(interpolate(zero_shot, finetuned, alpha))
        if not isinstance(metrics, dict) or "alpha" in metrics:
            raise ValueError("`evaluate` must return a dict of metrics without an `alpha` key; "
                             f"received {metrics!r:.80}.")
        rows.append({"alpha": alpha, **metrics})
    return rows
