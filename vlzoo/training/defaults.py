"""The papers' training defaults: AdamW, linear warm-up + cosine decay, accumulation, remat.

CLIP (ViT models), open_clip, SPARC, SPARO and Llip train with AdamW
(`beta_1=0.9`, `beta_2=0.98`, `epsilon=1e-6`; Llip `beta_2=0.95`), decoupled
weight decay 0.2 that skips biases, norms, embeddings, learned tokens and
the logit scale/bias, a linear warm-up (2,000 to 5,000 steps) followed by a
per-step cosine decay to 0, and bfloat16 autocast with float32 losses.
FILIP uses LAMB and is not covered by these defaults.

Where each setting lives:

- schedule: `WarmupCosine` (open_clip's `cosine_lr`, with an optional floor).
- weight-decay exclusions: `ContrastiveModel.compile`, which `configure` calls.
- logit-scale clamp: the `ClampLogitScale` constraint of the logit-scale
  variable, applied by every Keras optimizer after each update.
- mixed precision: the model's dtype policy, chosen when it is built
  (`from_preset(..., dtype="mixed_bfloat16")`); the towers compute in
  bfloat16, the logit scale/bias and every loss stay float32.
- gradient accumulation: Keras' own `gradient_accumulation_steps`.
- remat: the towers' `remat` flag (`keras.remat` around every block).
- host memory on CPU: `retain_host_memory()` keeps the memory a step frees
  for the next step instead of faulting it in again.

Example:
>>> model = vlzoo.from_preset("clip_tiny", dtype="mixed_bfloat16")  # doctest: +SKIP
>>> vlzoo.training.configure(model, learning_rate=5e-4, total_steps=10_000, warmup_steps=500,
...                          remat=True)  # doctest: +SKIP
>>> model.fit(dataset, epochs=1)  # doctest: +SKIP
"""

import ctypes
import math
import numbers
import warnings

import keras
from keras import ops

from vlzoo.optimizers import AdamW
from vlzoo.training._models import check_model
from vlzoo.training.locking import lock_tower


@keras.saving.register_keras_serializable(package="vlzoo")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak_learning_rate`, then cosine decay to `alpha * peak_learning_rate`.

    For optimizer update `s` (0 for the first), with `W = warmup_steps` and
    `S = total_steps`:

        lr(s) = peak * (s + 1) / W                                   if s < W
        lr(s) = peak * (alpha + (1 - alpha) * (1 + cos(pi * p)) / 2)  otherwise,
                p = min(1, (s - W) / (S - W))

    This is open_clip's `cosine_lr` (used by CLIP reproductions, SPARO and
    Llip) when `alpha=0`: the warm-up line starts from 0 at step -1, so the
    first update already moves the weights, and the rate reaches 0 at step
    `S` and stays at `alpha * peak` after it.

    Args:
        peak_learning_rate: the rate at the end of warm-up, > 0.
        total_steps: `S`, optimizer updates over the whole run, > `warmup_steps`.
        warmup_steps: `W`, linear warm-up updates, >= 0.
        alpha: final rate as a fraction of the peak, in `[0, 1]`.
        gradient_accumulation_steps: the optimizer's accumulation `N` (or 1).
            Keras calls a schedule with its batch count, which under
            accumulation advances `N` times per update; the schedule divides
            it by `N` (rounding down) so that `s` counts updates.
        name: name of the schedule.

    Raises:
        ValueError: an argument outside the ranges above, or a step count that is not an integer.

    Example:
    >>> schedule = WarmupCosine(1e-3, total_steps=100, warmup_steps=10)
    >>> [round(float(schedule(s)), 6) for s in (0, 9, 10, 55, 100)]
    [0.0001, 0.001, 0.001, 0.0005, 0.0]
    """

    def __init__(
        self, peak_learning_rate, total_steps, warmup_steps=0, alpha=0.0, gradient_accumulation_steps=1,
        name="warmup_cosine",
    ):
        if not peak_learning_rate > 0:
            raise ValueError(f"`peak_learning_rate` must be > 0; received {peak_learning_rate!r}.")
        if not (isinstance(warmup_steps, numbers.Integral) and warmup_steps >= 0):
            raise ValueError(f"`warmup_steps` must be an integer >= 0; received {warmup_steps!r}.")
        if not (isinstance(total_steps, numbers.Integral) and total_steps > warmup_steps):
            raise ValueError(
                f"`total_steps` must be an integer > `warmup_steps` ({warmup_steps}); received {total_steps!r}."
            )
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"`alpha` must be in [0, 1]; received {alpha!r}.")
        if not (isinstance(gradient_accumulation_steps, numbers.Integral) and gradient_accumulation_steps >= 1):
            raise ValueError(
                "`gradient_accumulation_steps` must be an integer >= 1; "
                f"received {gradient_accumulation_steps!r}."
            )
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.alpha = float(alpha)
        self.gradient_accumulation_steps = int(gradient_accumulation_steps)
        self.name = name

    def __call__(self, step):
        step = ops.floor(ops.cast(step, "float32") / self.gradient_accumulation_steps)
        peak, warmup = self.peak_learning_rate, self.warmup_steps
        progress = ops.clip((step - warmup) / (self.total_steps - warmup), 0.0, 1.0)
        cosine = 0.5 * (1.0 + ops.cos(math.pi * progress))
        decayed = peak * (self.alpha + (1.0 - self.alpha) * cosine)
        if not warmup:
            return decayed
        return ops.where(step < warmup, peak * (step + 1.0) / warmup, decayed)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate, "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps, "alpha": self.alpha,
            "gradient_accumulation_steps": self.gradient_accumulation_steps, "name": self.name,
        }


def training_optimizer(
    learning_rate=5e-4, total_steps=None, warmup_steps=0, alpha=0.0, weight_decay=0.2,
    beta_1=0.9, beta_2=0.98, epsilon=1e-6, gradient_accumulation_steps=None, clipnorm=None,
):
    """AdamW with CLIP's hyper-parameters and an optional warm-up + cosine schedule.

    The weight-decay exclusions need the model's variables: they are set
    when the optimizer is passed to `model.compile` (or by `configure`).

    Args:
        learning_rate: the peak rate (float), or any Keras schedule when
            `total_steps` is None.
        total_steps: optimizer updates of the run; when set, the rate follows
            `WarmupCosine(learning_rate, total_steps, warmup_steps, alpha)`;
            when None the rate is `learning_rate` as given.
        warmup_steps: linear warm-up updates (needs `total_steps`).
        alpha: final rate as a fraction of the peak (needs `total_steps`).
        weight_decay: decoupled decay coefficient (the update is
            `w -= lr * weight_decay * w`, as PyTorch's AdamW).
        beta_1, beta_2, epsilon: Adam's moments and epsilon (CLIP: 0.9, 0.98,
            1e-6; Llip uses `beta_2=0.95`).
        gradient_accumulation_steps: `N >= 2` to average the gradients of `N`
            consecutive batches and update once every `N` steps (Keras' own
            mechanism: the weights stay unchanged for `N - 1` steps, then the
            mean gradient is clipped, decayed and applied once). The schedule
            and Adam's step count advance once per update, so
            `total_steps`/`warmup_steps` count updates, not batches. `None`
            or 1: no accumulation. Each micro-batch's loss contrasts only
            its own `B` pairs: not the gradient of an `N * B` batch.
        clipnorm: optional per-variable gradient norm bound (None: no
            clipping, as the papers).

    Returns:
        a `vlzoo.optimizers.AdamW` (Keras' AdamW, its update fused on PyTorch).

    Raises:
        ValueError: `gradient_accumulation_steps` not None or an integer >= 1; `warmup_steps` or
            `alpha` without `total_steps`; a schedule as `learning_rate` with `total_steps`; or
            `WarmupCosine`'s own checks.

    Example:
    >>> optimizer = training_optimizer(1e-3, total_steps=10_000, warmup_steps=500)
    >>> model.compile(optimizer=optimizer)  # doctest: +SKIP
    """
    if gradient_accumulation_steps is None:
        gradient_accumulation_steps = 1
    if not (isinstance(gradient_accumulation_steps, numbers.Integral) and gradient_accumulation_steps >= 1):
        raise ValueError(
            "`gradient_accumulation_steps` must be None or an integer >= 1; "
            f"received {gradient_accumulation_steps!r}."
        )
    if total_steps is None:
        if warmup_steps or alpha:
            raise ValueError(
                "`warmup_steps` and `alpha` shape the cosine schedule and need `total_steps`; "
                f"received warmup_steps={warmup_steps!r}, alpha={alpha!r} with total_steps=None."
            )
        schedule = learning_rate
    else:
        if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                "With `total_steps`, `learning_rate` is the peak rate of the warm-up + cosine schedule "
                f"and must be a float; received the schedule {learning_rate!r}."
            )
        schedule = WarmupCosine(learning_rate, total_steps, warmup_steps, alpha, gradient_accumulation_steps)
    return AdamW(
        learning_rate=schedule, weight_decay=weight_decay, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon, clipnorm=clipnorm,
        gradient_accumulation_steps=int(gradient_accumulation_steps) if gradient_accumulation_steps > 1 else None,
    )


def configure(model, *, remat=None, jit_compile="auto", micro_batch_size=None, lock_image=False,
              lock_image_unlocked_groups=0, lock_text=False, lock_text_unlocked_groups=0, **optimizer_args):
    """Compiles a vlzoo model for training with the papers' defaults, in one call.

    Sets the optimizer (`training_optimizer(**optimizer_args)`, with the
    family's weight-decay exclusions through `model.compile`), `jit_compile`,
    the towers' `remat` flag, `micro_batch_size` and tower locks. Mixed
    precision is the model's dtype policy, chosen when it is built.

    Args:
        model: a vlzoo model (`ContrastiveModel`).
        remat: True/False sets `remat` on the image and text towers
            (recompute each block's activations in the backward pass);
            None keeps what the towers were built with. A training setting,
            not part of the model's saved config.
        jit_compile: passed to `model.compile` (`"auto"`, True or False).
        micro_batch_size: gradient caching (`vlzoo.models.micro_batching`): the
            towers run this many pairs at a time, holding one micro-batch's
            activations, while the loss contrasts the whole batch exactly;
            the batch size must be a multiple of it. None: the whole batch.
            (docs/finetuning.md compares it with gradient accumulation.)
        lock_image, lock_text: lock that tower (LiT), all of it but its last
            `lock_image_unlocked_groups` / `lock_text_unlocked_groups` groups
            (open_clip's `--lock-image --lock-image-unlocked-groups N`;
            `vlzoo.training.locking`). Locked variables end `fit` unchanged.
        **optimizer_args: arguments of `training_optimizer` (`learning_rate`,
            `total_steps`, `warmup_steps`, `alpha`, `weight_decay`, `beta_1`,
            `beta_2`, `epsilon`, `gradient_accumulation_steps`, `clipnorm`).

    Returns:
        the model's optimizer.

    Raises:
        TypeError: `model` is not a vlzoo model, or `remat` is not a bool or None.
        ValueError: `micro_batch_size` not a positive int or None; `lock_*_unlocked_groups`
            without `lock_*=True`; or `training_optimizer`'s checks.

    Warns:
        UserWarning: `gradient_accumulation_steps > 1` (it averages separate small batches'
            losses; `micro_batch_size` gives the exact large contrastive batch).

    Example:
    >>> model = vlzoo.from_preset("clip_tiny", dtype="mixed_bfloat16")  # doctest: +SKIP
    >>> configure(model, learning_rate=5e-4, total_steps=1000, warmup_steps=100, remat=True)  # doctest: +SKIP
    >>> model.fit(dataset)  # doctest: +SKIP
    """
    check_model(model)
    if remat is not None:
        if not isinstance(remat, bool):
            raise TypeError(f"`remat` must be True, False or None; received {remat!r}.")
        model.vision.remat = remat
        model.text.remat = remat
    if micro_batch_size is not None and (isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int)
                                         or micro_batch_size < 1):
        raise ValueError(f"`micro_batch_size` must be a positive int or None; received {micro_batch_size!r}.")
    model.micro_batch_size = micro_batch_size
    if (optimizer_args.get("gradient_accumulation_steps") or 1) > 1:
        warnings.warn(
            "gradient_accumulation_steps averages the losses of separate batches: each contrasts its own pairs "
            "only, so the contrastive batch stays the micro-batch. For an exact large contrastive batch, give "
            "fit the whole batch and set `micro_batch_size` (gradient caching) instead.",
            stacklevel=2,
        )
    for tower, lock, unlocked_groups in (("image", lock_image, lock_image_unlocked_groups),
                                         ("text", lock_text, lock_text_unlocked_groups)):
        if lock:
            lock_tower(model, tower, unlocked_groups)
        elif unlocked_groups:
            raise ValueError(f"`lock_{tower}_unlocked_groups` needs `lock_{tower}=True`.")
    model.compile(optimizer=training_optimizer(**optimizer_args), jit_compile=jit_compile)
    return model.optimizer


# glibc's mallopt(3) parameters.
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def retain_host_memory():
    """Keeps the host memory a training step frees for the next step (glibc's malloc, Linux).

    Sets, through `mallopt(3)`, one malloc arena (`M_ARENA_MAX=1`), no mapped blocks
    (`M_MMAP_MAX=0`) and no trimming (`M_TRIM_THRESHOLD` at its maximum), so that the memory a
    step frees stays in the process for the next step instead of being faulted in again. The same
    as starting Python with
    `GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=18446744073709551615`.
    Call it first, before the backend's first computation (building a model is one): threads that
    have already allocated keep their own arenas. Afterwards the process's resident memory stays
    at its peak, and all threads allocate from one arena. Why and what it saves:
    docs/benchmarks.md, *Eager calls, predict and the process-wide CPU settings*.

    Returns:
        True when the settings were applied; False, with a warning, where
        the C library is not glibc (macOS, Windows, musl): nothing changes.

    Warns:
        UserWarning: when it returns False.

    Example:
    >>> import vlzoo
    >>> vlzoo.training.retain_host_memory()  # first thing, then build and fit
    True
    """
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only)
    except (OSError, AttributeError, TypeError):
        warnings.warn("retain_host_memory: the C library is not glibc; host memory is left as it is.", stacklevel=2)
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # A trim threshold of -1 is SIZE_MAX for glibc (the value is taken as a size_t): never trim.
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
    # A list, not a generator: every setting is applied even if an earlier one is refused.
    return all([mallopt(parameter, value) == 1 for parameter, value in settings])
