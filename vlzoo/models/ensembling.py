"""Prompt ensembling: how a family turns `K` prompts per class into zero-shot class scores.

Every model names its own through the `prompt_ensembling` property of
`ContrastiveModel`; `vlzoo.evaluation.zero_shot_classifier` uses it.

* `EmbeddingMean()` (the default: CLIP, SigLIP, SPARC, SPARO, STAIR): the
  mean of the normalised global text embeddings (`encode_text(normalize=True)
  ["embeds"]`), renormalised with the model's own `normalize_embeds`
  (SPARO's: per slot), scored with `model.score`.
* `TokenSimilarityMean()` (FILIP): the mean over templates of the token-wise
  similarity `S_I` times `exp(logit_scale)`, the prompts encoded once.
* `ClassTextsMethod()` (Llip): the model's own `encode_class_texts` (mean
  queries and targets), scored with `model.score`.
* `EnsembleScoresMethod()`: the model's own `ensemble_scores(images,
  class_texts)`; the prompts are re-encoded with every image batch.

Example:
>>> model = vlzoo.from_preset("filip_tiny")
>>> type(model.prompt_ensembling).__name__
'TokenSimilarityMean'
"""

from keras import ops

from vlzoo._backends import switches
from vlzoo.losses import filip_ensemble_scores

__all__ = ["ClassTextsMethod", "EmbeddingMean", "EnsembleScoresMethod", "Ensembling", "TokenSimilarityMean"]


def _flatten_prompts(class_texts):
    """`(C, K, T)` token dict -> `(C * K, T)`."""
    return {key: ops.reshape(value, (-1, value.shape[-1])) for key, value in class_texts.items()}


class Ensembling:
    """How a family turns `K` prompts per class into zero-shot class scores.

    Subclasses implement `encode_classes`; `score` defaults to
    `model.score(model.encode_image(images), classes, **score_kwargs)`.
    """

    def encode_classes(self, model, class_texts):
        """Class representation from the prompts of a group of classes.

        Args:
            model: the `ContrastiveModel`.
            class_texts: tokenizer dict whose `token_ids` / `padding_mask`
                have shape `(C, K, T)`: `K` prompts for each of `C` classes.

        Returns:
            A tensor or dict of tensors whose leading axis is `C` (groups of
            classes are concatenated along it).
        """
        raise NotImplementedError

    @switches.untracked_inference
    def score(self, model, images, classes, **score_kwargs):
        """Scores `(B, C)` of float `(B, H, W, 3)` images against `encode_classes`' output.

        An inference call, as the model's: on PyTorch no autograd graph, unless an argument requires a
        gradient (`ContrastiveModel.encode_image`). Subclasses' overrides carry the decorator too.
        """
        return model.score(model.encode_image(images), classes, **score_kwargs)


class EmbeddingMean(Ensembling):
    """CLIP's ensembling: `normalise(mean_k normalise(text_embed[c, k]))` per class.

    Both normalisations are the model's own (`encode_text(normalize=True)`;
    SPARO's normalises every slot, STAIR's guards all-zero vectors), on the
    global embedding `"embeds"`; the class representation is
    `{"embeds": (C, D)}`, which every family whose `score` reads the global
    embeddings takes as `text_embeds`.
    """

    def encode_classes(self, model, class_texts):
        c, k = tuple(class_texts["token_ids"].shape[:2])
        embeds = model.encode_text(_flatten_prompts(class_texts), normalize=True)["embeds"]
        return model.normalize_embeds({"embeds": ops.mean(ops.reshape(embeds, (c, k, -1)), axis=1)})


class TokenSimilarityMean(Ensembling):
    """FILIP's ensembling: the mean over templates of the late-interaction similarity.

    `score[b, c] = exp(logit_scale) * mean_k S_I(image_b, prompt_{c,k})`,
    i.e. `exp(logit_scale) * model.ensemble_scores(images, class_texts)`,
    with the prompt tokens `(C, K, T, D)` encoded once. Takes no score
    arguments (the model's `num_chunks` and `similarity_dtype` apply).
    """

    def encode_classes(self, model, class_texts):
        c, k, t = tuple(class_texts["token_ids"].shape)
        text = model.encode_text(_flatten_prompts(class_texts))
        return {"tokens": ops.reshape(text["tokens"], (c, k, t, -1)), "mask": ops.reshape(text["mask"], (c, k, t))}

    @switches.untracked_inference
    def score(self, model, images, classes):
        scores = filip_ensemble_scores(model.encode_image(images)["tokens"], classes["tokens"], classes["mask"],
                                       **model._chunks())
        return model.logit_scale_value() * scores


class ClassTextsMethod(Ensembling):
    """The model's own `encode_class_texts(class_texts)` (Llip: mean queries and targets), scored with `score`."""

    def encode_classes(self, model, class_texts):
        return model.encode_class_texts(class_texts)


class EnsembleScoresMethod(Ensembling):
    """The model's own `ensemble_scores(images, class_texts, **score_kwargs)`; prompts encoded per call."""

    def encode_classes(self, model, class_texts):
        return class_texts

    @switches.untracked_inference
    def score(self, model, images, classes, **score_kwargs):
        return model.ensemble_scores(images, classes, **score_kwargs)
