"""Keras callbacks that run zero-shot classification and retrieval during `fit`.

Each callback evaluates the model at the end of epochs `n, 2n, ...` (`every_n_epochs=n`) and
writes its metrics into that epoch's `logs` (the progress bar, `History`, and later callbacks
such as `ModelCheckpoint(monitor="val_zeroshot_top1")` see them). As with Keras'
`validation_freq`, other epochs have no entry. Arguments are checked when the callback is built.

Example:
>>> history = model.fit(train, epochs=10, callbacks=[
...     ZeroShotCallback(val_images, val_labels, class_names, SIMPLE_TEMPLATES, every_n_epochs=2),
...     RetrievalCallback(val_images, val_captions, image_ids=val_caption_image_ids),
... ])  # doctest: +SKIP
>>> len(history.history["val_zeroshot_top1"]), len(history.history["val_t2i_r@5"])  # doctest: +SKIP
(5, 10)
"""

import keras

from vlzoo.evaluation._common import check_ks, check_positive_int, check_ties
from vlzoo.evaluation.retrieval import retrieval_recall
from vlzoo.evaluation.templates import DEFAULT_TEMPLATES, build_prompts
from vlzoo.evaluation.zeroshot import zero_shot_accuracy

__all__ = ["RetrievalCallback", "ZeroShotCallback"]


class _PeriodicEvaluation(keras.callbacks.Callback):
    """Adds `prefix + name` for every metric of `evaluate()` to the logs of every `every_n_epochs`-th epoch."""

    def __init__(self, every_n_epochs, prefix):
        super().__init__()
        self.every_n_epochs = check_positive_int(every_n_epochs, "every_n_epochs")
        self.prefix = prefix

    def evaluate(self):
        """The metrics of `self.model` now, `{name: float}`."""
        raise NotImplementedError

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or (epoch + 1) % self.every_n_epochs:
            return
        logs.update({self.prefix + name: value for name, value in self.evaluate().items()})


class ZeroShotCallback(_PeriodicEvaluation):
    """Zero-shot top-k accuracy during `fit`: logs `val_zeroshot_top1`, `val_zeroshot_top5`.

    The class representations are rebuilt at every evaluation (the text
    tower trains). See `zero_shot_accuracy` for the metric.

    Args:
        images: float `(N, H, W, 3)` preprocessed pixels.
        labels: int `(N,)` in `[0, C)`.
        class_names: `C` class names.
        templates: `K` prompt templates (default `("a photo of a {}.",)`).
        every_n_epochs: evaluate at the end of epochs `n, 2n, ...`.
        top_k: an int or a sequence of ints.
        batch_size: images (and prompts) per forward pass.
        ties: "pessimistic" (default) or "optimistic".
        prefix: log name prefix, `"val_zeroshot_"` -> `val_zeroshot_top1`.
        verbose: progress bars while evaluating.
        **score_kwargs: passed to every score (`slots=` for SPARO...).

    Raises:
        ValueError, TypeError: bad class names or templates (`build_prompts`), or a bad `top_k`,
            `ties`, `batch_size` or `every_n_epochs`, when built. `labels`' checks run at the
            first evaluation (`ZeroShotClassifier.accuracy`).

    Example:
    >>> history = model.fit(data, epochs=4,
    ...                     callbacks=[ZeroShotCallback(images, labels, ["cat", "dog"])])  # doctest: +SKIP
    >>> len(history.history["val_zeroshot_top1"])  # doctest: +SKIP
    4
    """

    def __init__(self, images, labels, class_names, templates=DEFAULT_TEMPLATES, every_n_epochs=1,
                 top_k=(1, 5), batch_size=64, ties="pessimistic", prefix="val_zeroshot_", verbose=False,
                 **score_kwargs):
        super().__init__(every_n_epochs, prefix)
        build_prompts(class_names, templates)  # fail now, not after the first epoch
        self.images, self.labels = images, labels
        self.class_names, self.templates = class_names, templates
        self.top_k, self.ties = check_ks(top_k, "top_k"), check_ties(ties)
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.verbose, self.score_kwargs = verbose, score_kwargs

    def evaluate(self):
        return zero_shot_accuracy(
            self.model, self.images, self.labels, self.class_names, self.templates, top_k=self.top_k,
            batch_size=self.batch_size, ties=self.ties, verbose=self.verbose, **self.score_kwargs,
        )


class RetrievalCallback(_PeriodicEvaluation):
    """Retrieval recall@K during `fit`: logs `val_i2t_r@1`, ..., `val_t2i_r@10`.

    See `retrieval_recall` for the metric.

    Args:
        images: float `(N_images, H, W, 3)` preprocessed pixels.
        texts: caption strings or the tokenizer's dict, `N_texts` rows.
        image_ids: int `(N_texts,)`, the image of every caption; None: one
            caption per image, same index.
        every_n_epochs: evaluate at the end of epochs `n, 2n, ...`.
        ks: an int or a sequence of ints.
        batch_size: images (and captions) per forward pass.
        ties: "pessimistic" (default) or "optimistic".
        prefix: log name prefix, `"val_"` -> `val_i2t_r@1`.
        verbose: progress bars while evaluating.
        **score_kwargs: passed to `model.score`.

    Raises:
        ValueError: a bad `ks`, `ties`, `batch_size` or `every_n_epochs`, when built;
            `retrieval_recall`'s checks at the first evaluation.

    Example:
    >>> history = model.fit(data, epochs=4, callbacks=[
    ...     RetrievalCallback(images, captions, every_n_epochs=2)])  # doctest: +SKIP
    >>> len(history.history["val_t2i_r@1"])  # epochs 2 and 4  # doctest: +SKIP
    2
    """

    def __init__(self, images, texts, image_ids=None, every_n_epochs=1, ks=(1, 5, 10), batch_size=64,
                 ties="pessimistic", prefix="val_", verbose=False, **score_kwargs):
        super().__init__(every_n_epochs, prefix)
        self.images, self.texts, self.image_ids = images, texts, image_ids
        self.ks, self.ties = check_ks(ks, "ks"), check_ties(ties)
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.verbose, self.score_kwargs = verbose, score_kwargs

    def evaluate(self):
        return retrieval_recall(
            self.model, self.images, self.texts, self.image_ids, ks=self.ks, batch_size=self.batch_size,
            ties=self.ties, verbose=self.verbose, **self.score_kwargs,
        )
