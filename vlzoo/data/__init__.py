"""Input pipelines (image-text pairs from caption files or webdataset tar shards) and the
synthetic compositional shapes dataset (`vlzoo.data.shapes`, its hard negatives in
`vlzoo.data.shapes_negatives`).

`image_text_dataset` builds a `tf.data.Dataset` of `{"images": float32 (B, H, W, 3),
"token_ids": int32 (B, T), "padding_mask": bool (B, T)}` batches that `model.fit`
consumes on every Keras backend. TensorFlow is imported when a pipeline is built.

Example:
>>> import vlzoo
>>> model = vlzoo.from_preset("clip_tiny")  # doctest: +SKIP
>>> train = vlzoo.data.image_text_dataset(
...     "data/shards/{000..009}.tar", model.tokenizer, model.preprocessor,
...     batch_size=64, training=True, seed=0)  # doctest: +SKIP
>>> model.compile(optimizer="adamw")  # doctest: +SKIP
>>> model.fit(train, epochs=1)  # doctest: +SKIP
"""

from vlzoo.data import shapes
from vlzoo.data.pipeline import image_text_dataset, resolve_source
from vlzoo.data.records import (
    DatasetStats,
    ImageTextRecord,
    expand_shards,
    read_caption_file,
    read_tar_samples,
)

__all__ = [
    "DatasetStats",
    "ImageTextRecord",
    "expand_shards",
    "image_text_dataset",
    "read_caption_file",
    "read_tar_samples",
    "resolve_source",
    "shapes",
]
