"""vlzoo quick start: load a preset, embed images and texts, fine-tune, save and reload.

    KERAS_BACKEND=jax python examples/quickstart.py      # or tensorflow, torch

Uses the tiny random-init `clip_tiny` preset (32 px), so it runs in seconds on a CPU.
Swap in "clip_vit_b16" etc. once you have converted weights.
"""

import os
import tempfile
import warnings

import keras
import numpy as np

import vlzoo

keras.utils.set_random_seed(0)
print(f"backend: {keras.backend.backend()}")
print("presets:", ", ".join(vlzoo.list_presets()))

# 1. Load a preset: a keras.Model with its tokenizer and image preprocessor attached.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # clip_tiny ships no weights: random init, on purpose
    model = vlzoo.from_preset("clip_tiny")
print(f"{type(model).__name__} with {model.count_params():,} parameters")

# 2. Text -> {"token_ids": int32 (B, T), "padding_mask": bool (B, T)} numpy arrays.
texts = model.tokenizer(["a red square", "a blue square"])
print("token_ids", texts["token_ids"].shape, texts["token_ids"].dtype)

# 3. Images: uint8 (or float in [0, 1]) of any size -> float32 (B, S, S, 3) pixels.
raw = np.full((2, 48, 64, 3), 255, np.uint8)
raw[0, 12:36, 20:44] = (220, 40, 40)  # a red square
raw[1, 12:36, 20:44] = (40, 70, 220)  # a blue square
images = model.preprocessor(raw)
print("pixels", images.shape, images.dtype)

# 4. Embeddings and scores (backend tensors; convert for printing).
image_embeds = model.encode_image(images)
text_embeds = model.encode_text(texts)
scores = keras.ops.convert_to_numpy(model.similarity(images, texts))
print("image embeds", tuple(image_embeds.shape), "text embeds", tuple(text_embeds.shape))
print("similarity (images x texts):\n", np.round(scores, 3))

# 5. Fine-tune with model.fit: the family's own loss (CLIP: symmetric InfoNCE).
captions = ["a red square", "a blue square"] * 8
pixels = np.concatenate([images] * 8)
data = {"images": pixels, **model.tokenizer(captions)}
model.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-3))
history = model.fit(data, batch_size=8, epochs=3, verbose=2)
print("loss", [round(v, 4) for v in history.history["loss"]])

# 6. Save as a preset directory and load it back: identical scores.
with tempfile.TemporaryDirectory() as tmp:
    directory = os.path.join(tmp, "my_clip")
    model.save_to_preset(directory)
    reloaded = vlzoo.from_preset(directory)
    again = keras.ops.convert_to_numpy(reloaded.similarity(images, reloaded.tokenizer(["a red square", "a blue square"])))
    before = keras.ops.convert_to_numpy(model.similarity(images, texts))
    print("files:", sorted(os.listdir(directory)))
    print("round trip max abs diff:", float(np.max(np.abs(before - again))))
    assert np.allclose(before, again, atol=1e-6)
print("done")
