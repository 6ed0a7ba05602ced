"""Evaluation of contrastive models: zero-shot classification, retrieval recall@K, training callbacks.

* `zero_shot_classifier` / `zero_shot_accuracy`: prompt-template zero-shot
  classification with each family's own ensembling (`zeroshot` module
  docstring; each model names its own `prompt_ensembling`).
* `recall_at_k` / `retrieval_recall`: image -> text and text -> image
  recall@K with several captions per image and documented tie handling.
* `ZeroShotCallback` / `RetrievalCallback`: the same during `fit`, logged as
  `val_zeroshot_top1`, `val_i2t_r@1`, ...
* `benchmarks`: SugarCrepe, Winoground, MMVP-VLM, COCO / Flickr30k (Karpathy)
  and CIFAR read from their published layouts, scored by `evaluate_selection`
  (`selection`: the per-item scores and the benchmarks' metrics, with documented
  tie handling), `evaluate_retrieval` and `evaluate_classification`;
  `imagenet` (ImageNet-1k, V2, Sketch, A, R), `aro` (VG-Relation,
  VG-Attribution, COCO / Flickr30k-Order) and `segmentation` (PASCAL VOC 2012
  zero-shot segmentation from per-patch embeddings); `results`:
  clip_benchmark's result schema and a Markdown table.
* `slots` (SPARO's per-slot zero-shot accuracy and post-hoc slot selection),
  `shapes_benchmark` (what the bundled `*_shapes` presets report) and
  `shapes_compositional` (SugarCrepe's and ARO's negative types on shapes scenes): modules.
* `grounding` (the pointing game and the mass inside of each word's map over the
  patches, from the family's own alignment) and `shapes_grounding` (those per kind
  of word on shapes scenes with exact object masks): modules.
* `IMAGENET_TEMPLATES` (CLIP's 80), `SIMPLE_TEMPLATES` (CLIP's 7),
  `DEFAULT_TEMPLATES`, `build_prompts`.

Example:
>>> from vlzoo.evaluation import SIMPLE_TEMPLATES, retrieval_recall, zero_shot_accuracy
>>> zero_shot_accuracy(model, images, labels, ["cat", "dog"], SIMPLE_TEMPLATES)
{'top1': ..., 'top5': ...}
>>> retrieval_recall(model, images, captions, image_ids=caption_image_ids)
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
