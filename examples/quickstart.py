"""vlzoo quick start: load a preset, embed images and texts, fine-tune, probe binding, save and reload.

    KERAS_BACKEND=jax python examples/quickstart.py      # or tensorflow, torch

Uses the tiny random-init `clip_tiny` preset (32 px) and the synthetic coloured-shapes
dataset `vlzoo.data.shapes`, so it runs in seconds on a CPU and downloads nothing.
Swap in "clip_vit_b16" etc. once you have converted weights.
"""

import os
import tempfile
import warnings

import keras
import numpy as np

import vlzoo
from vlzoo.data import shapes

keras.utils.set_random_seed(0)
print(f"backend: {keras.backend.backend()}")
print("presets:", ", ".join(vlzoo.list_presets()))

# 1. Load a preset: a keras.Model with its tokenizer and image preprocessor attached.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # clip_tiny ships no weights: random init, on purpose
    model = vlzoo.from_preset("clip_tiny")
print(f"{type(model).__name__} with {model.count_params():,} parameters")

# Two synthetic images with their captions: uint8 (2, 48, 48, 3) and "a red square", "a blue square".
raw = shapes.classification(1, image_size=48, colors=["red", "blue"], shapes=["square"])
print("captions", raw["captions"])

# 2. Text -> {"token_ids": int32 (B, T), "padding_mask": bool (B, T)} numpy arrays.
texts = model.tokenizer(raw["captions"])
print("token_ids", texts["token_ids"].shape, texts["token_ids"].dtype)

# 3. Images: uint8 (or float in [0, 1]) of any size -> float32 (B, S, S, 3) pixels.
images = model.preprocessor(raw["images"])  # uint8 (2, 48, 48, 3) -> float32 (2, 32, 32, 3)
print("pixels", images.shape, images.dtype)

# 4. Embeddings and scores (backend tensors; convert for printing).
image_embeds = model.encode_image(images)
text_embeds = model.encode_text(texts)
scores = keras.ops.convert_to_numpy(model.similarity(images, texts))
print("image embeds", tuple(image_embeds.shape), "text embeds", tuple(text_embeds.shape))
print("similarity (images x texts):\n", np.round(scores, 3))

# 5. Fine-tune with model.fit: the family's own loss (CLIP: symmetric InfoNCE), on
#    coloured-shape scenes with captions ("a red circle above a blue square").
train = shapes.generate("train", 64, image_size=32, seed=0)
print("training captions:", train["captions"][:2])
data = shapes.model_inputs(train["images"], train["captions"], model.tokenizer, model.preprocessor)
model.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-3))
history = model.fit(data, batch_size=16, epochs=3, verbose=2)
print("loss", [round(v, 4) for v in history.history["loss"]])

# 6. Binding probe: does the model score "a red circle above a blue square" above the
#    attribute-swapped "a blue circle above a red square"? (Held-out compositions; chance 0.5.)
pairs = shapes.binding_pairs("test", 32, swap="color", seed=0)
accuracy = shapes.binding_accuracy(model, model.preprocessor(pairs["images"]),
                                   pairs["captions"], pairs["swapped_captions"])
print(f"binding accuracy: {accuracy:.3f} ({pairs['captions'][0]!r} vs {pairs['swapped_captions'][0]!r})")

# 7. Save as a preset directory and load it back: identical scores.
with tempfile.TemporaryDirectory() as tmp:
    directory = os.path.join(tmp, "my_clip")
    model.save_to_preset(directory)
    reloaded = vlzoo.from_preset(directory)
    again = keras.ops.convert_to_numpy(reloaded.similarity(images, reloaded.tokenizer(raw["captions"])))
    before = keras.ops.convert_to_numpy(model.similarity(images, texts))
    print("files:", sorted(os.listdir(directory)))
    print("round trip max abs diff:", float(np.max(np.abs(before - again))))
    assert np.allclose(before, again, atol=1e-6)
print("done")
