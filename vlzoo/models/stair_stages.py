"""STAIR's three-stage schedule inside one `fit`: stage lengths, per-stage optimizers, the stop at a boundary.

`STAIR.fit` splits a run of `T` steps into the paper's stages (300K, 300K and
600K steps: fractions 0.25, 0.25, 0.5 by default) and trains each with a fresh
optimizer built from the compiled one: new moments and step count, the
learning rate times the stage's factor (stage 3 uses 1e-4 for 1e-3: 0.1), and
a learning-rate schedule that has a `total_steps` rebuilt over the stage's
own length, so that each stage warms up and decays as a run of its own.

    lengths = stage_lengths(240, (0.25, 0.25, 0.5))   # (60, 60, 120)
    optimizer = stage_optimizer(model.optimizer, factor=0.1, length=120)
"""

import math

import keras

STAGE_FRACTIONS = (0.25, 0.25, 0.5)
STAGE_LEARNING_RATE_FACTORS = (1.0, 1.0, 0.1)
# Keys of a learning-rate schedule's config holding its peak rate (vlzoo's WarmupCosine, Keras' schedules).
_PEAK_KEYS = ("peak_learning_rate", "initial_learning_rate")


def _check_three(values, name, allow_zero):
    """`values` as a tuple of 3 floats, each > 0 (or >= 0 with `allow_zero`)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) != 3:
        raise ValueError(f"`{name}` must hold 3 numbers, one per stage; received {values!r}.")
    try:
        values = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must hold 3 numbers, one per stage; received {values!r}.") from None
    if not all(math.isfinite(v) and (v >= 0 if allow_zero else v > 0) for v in values):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"`{name}` must hold 3 finite numbers {bound}; received {values!r}.")
    return values


def check_stage_fractions(fractions):
    """`stage_fractions`: None (stages by hand) or 3 shares of the run, each > 0, summing to 1.

    Example:
    >>> check_stage_fractions([0.5, 0.25, 0.25])
    (0.5, 0.25, 0.25)
    """
    if fractions is None:
        return None
    fractions = _check_three(fractions, "stage_fractions", allow_zero=False)
    if abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"`stage_fractions` must sum to 1; received {fractions!r} (sum {sum(fractions):g}).")
    return fractions


def check_learning_rate_factors(factors):
    """`stage_learning_rate_factors`: 3 multipliers of the compiled learning rate, each > 0."""
    return _check_three(factors, "stage_learning_rate_factors", allow_zero=False)


def stage_lengths(total_steps, fractions):
    """Steps of each stage: the boundaries `round(T * (f_1))`, `round(T * (f_1 + f_2))`.

    Args:
        total_steps: `T`, training steps of the whole run.
        fractions: the 3 stage shares (`check_stage_fractions`).

    Returns:
        `(L_1, L_2, L_3)`, ints summing to `T`, each >= 1.

    Example:
    >>> stage_lengths(240, (0.25, 0.25, 0.5))
    (60, 60, 120)
    """
    first = round(total_steps * fractions[0])
    second = round(total_steps * (fractions[0] + fractions[1]))
    lengths = (first, second - first, total_steps - second)
    if min(lengths) < 1:
        raise ValueError(
            f"STAIR's stage schedule `stage_fractions={fractions}` gives stages of {lengths} steps for a run of "
            f"{total_steps} steps; every stage needs at least one: train longer, change the fractions, or set "
            "`model.stage_fractions = None` and switch stages with `set_stage`."
        )
    return lengths


def steps_per_epoch(x, batch_size=None, steps_per_epoch=None, validation_split=0.0):
    """Training steps per epoch of `fit(x, ...)`, or None when the data does not say.

    `steps_per_epoch` when given; else `ceil(N / batch_size)` for a dict of
    arrays of `N` rows (`batch_size` 32 by default, less the
    `validation_split`), `len(x)` for a sized batch source (a
    `keras.utils.PyDataset`), or a `tf.data.Dataset`'s known cardinality.
    """
    if steps_per_epoch is not None:
        return int(steps_per_epoch)
    if isinstance(x, dict):
        rows = len(next(iter(x.values())))
        rows = int(math.floor(rows * (1.0 - validation_split)))
        return -(-rows // (batch_size or 32))
    if hasattr(x, "cardinality"):  # tf.data: -1 infinite, -2 unknown
        cardinality = int(x.cardinality())
        return cardinality if cardinality >= 0 else None
    if hasattr(x, "__len__"):
        return len(x)
    return None


def stage_optimizer(template, factor, length):
    """A fresh optimizer of `template`'s class and config for one stage.

    Its state and `iterations` start anew; a float learning rate is
    multiplied by `factor`; a schedule's peak (`peak_learning_rate` or
    `initial_learning_rate`) is multiplied by `factor`, and a schedule with a
    `total_steps` runs over the stage's `length` steps (its optimizer updates:
    `length / N` under the schedule's `gradient_accumulation_steps` N).

    Args:
        template: the compiled optimizer.
        factor: the stage's learning-rate multiplier.
        length: the stage's steps (batches).
    """
    config = template.get_config()
    rate = config["learning_rate"]
    if isinstance(rate, dict):  # a serialised schedule
        schedule = dict(rate, config=dict(rate["config"]))
        inner = schedule["config"]
        peak = next((key for key in _PEAK_KEYS if key in inner), None)
        if peak is None and factor != 1.0:
            raise ValueError(
                f"`stage_learning_rate_factors` needs a learning rate it can scale: a float or a schedule with "
                f"one of {_PEAK_KEYS}; the compiled optimizer's schedule is {schedule.get('class_name')!r}."
            )
        if peak is not None:
            inner[peak] = inner[peak] * factor
        if "total_steps" in inner:
            # The schedule counts optimizer updates (`WarmupCosine`): N batches each under N-step accumulation.
            updates = int(length) // int(inner.get("gradient_accumulation_steps", 1))
            if inner.get("warmup_steps", 0) >= updates:
                raise ValueError(
                    f"The learning-rate schedule's warm-up ({inner['warmup_steps']} updates) must be shorter than "
                    f"each STAIR stage, which restarts it; the shortest stage has {length} steps, {updates} updates."
                )
            inner["total_steps"] = updates
        config["learning_rate"] = schedule
    else:
        config["learning_rate"] = float(rate) * factor
    return type(template).from_config(config)


class StopAfter(keras.callbacks.Callback):
    """Stops `fit` after `steps` training steps (the end of a stage).

    Counts from the batch indices `fit` reports, so it reads no weights
    (JAX holds them outside the model while it trains).
    """

    def __init__(self, steps):
        super().__init__()
        self.steps = steps
        self.done = 0
        self._epoch_start = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self.done

    def on_train_batch_end(self, batch, logs=None):
        self.done = self._epoch_start + batch + 1
        if self.done >= self.steps:
            self.model.stop_training = True


def merged_history(model, parts):
    """One `History` of the stages' `(stage, history)` parts, epochs numbered on, with a `stage` entry."""
    history = keras.callbacks.History()
    history.set_model(model)
    history.epoch, history.history = [], {"stage": []}
    for stage, part in parts:
        for key, values in part.history.items():
            history.history.setdefault(key, []).extend(values)
        history.history["stage"].extend([stage] * len(part.epoch))
        history.epoch.extend(range(len(history.epoch), len(history.epoch) + len(part.epoch)))
    return history
