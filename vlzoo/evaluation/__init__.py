"""Evaluation of contrastive models.

Exported here: zero-shot classification with each family's prompt ensembling
(`zero_shot_classifier`, `zero_shot_accuracy`), retrieval recall@K (`recall_at_k`,
`retrieval_recall`), the same as `fit` callbacks (`ZeroShotCallback`, `RetrievalCallback`) and
the prompt templates (`IMAGENET_TEMPLATES`, `SIMPLE_TEMPLATES`, `DEFAULT_TEMPLATES`,
`build_prompts`). Submodules: `benchmarks`, `selection`, `imagenet`, `aro`, `segmentation`,
`phrase_grounding` (published benchmarks read from disk), `results` (clip_benchmark's schema),
`slots` (SPARO's slot selection), `grounding`, and the offline shapes suites `shapes_benchmark`,
`shapes_compositional`, `shapes_grounding`. Overview: docs/evaluation.md.

Example:
>>> from vlzoo.evaluation import SIMPLE_TEMPLATES, retrieval_recall, zero_shot_accuracy
>>> zero_shot_accuracy(model, images, labels, ["cat", "dog"], SIMPLE_TEMPLATES)  # doctest: +SKIP
{'top1': ..., 'top5': ...}
>>> retrieval_recall(model, images, captions, image_ids=caption_image_ids)  # doctest: +SKIP
{'i2t_r@1': ..., ..., 't2i_r@10': ...}
"""

from vlzoo.evaluation.callbacks import RetrievalCallback, ZeroShotCallback
from vlzoo.evaluation.retrieval import recall_at_k, retrieval_recall
from vlzoo.evaluation.templates import DEFAULT_TEMPLATES, IMAGENET_TEMPLATES, SIMPLE_TEMPLATES, build_prompts
from vlzoo.evaluation.zeroshot import (
    ClassTextsMethod, EmbeddingMean, EnsembleScoresMethod, Ensembling, TokenSimilarityMean,
    ZeroShotClassifier, zero_shot_accuracy, zero_shot_classifier,
)

__all__ = [
    "DEFAULT_TEMPLATES", "IMAGENET_TEMPLATES", "SIMPLE_TEMPLATES", "ClassTextsMethod",
    "EmbeddingMean", "EnsembleScoresMethod", "Ensembling", "RetrievalCallback", "TokenSimilarityMean",
    "ZeroShotCallback", "ZeroShotClassifier", "build_prompts", "recall_at_k",
    "retrieval_recall", "zero_shot_accuracy", "zero_shot_classifier",
]
