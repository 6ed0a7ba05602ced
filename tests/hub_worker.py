"""Loads hub handles in a fresh process, as a user would, and records what happened.

    HF_ENDPOINT=http://127.0.0.1:PORT HF_HUB_CACHE=DIR python tests/hub_worker.py REQUEST.json OUT.json

`huggingface_hub` reads `HF_ENDPOINT`, `HF_HUB_CACHE` and `HF_HUB_OFFLINE` when it is imported,
so the tests start this process with them set rather than patch the library. The request names
the handles, the texts to tokenize and an optional `.npz` of inputs (`images`, `token_ids`,
`padding_mask`). For each handle, in order, the result holds `error` and `message` when loading
failed, else the sha256 of its weights (`weights`) and the normalised embeddings: `texts` (of the
model's own tokenizer, with its `ids`;
absent when the model has none), `images` and `token_ids` (of the inputs).
"""

import hashlib
import json
import sys

import keras
import numpy as np

import vlzoo
from vlzoo.tokenizers import UnavailableTokenizer


def _numpy(x):
    return keras.ops.convert_to_numpy(x).tolist()


def weights_digest(model):
    """sha256 of every weight's bytes, in the model's order: equal digests are bit-identical weights."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()


def embed(model, texts, inputs):
    result = {"class": type(model).__name__, "preprocessor": model.preprocessor.get_config(),
              "weights": weights_digest(model)}
    if not isinstance(model.tokenizer, UnavailableTokenizer):
        tokens = model.tokenizer(texts)
        result["ids"] = np.asarray(tokens["token_ids"]).tolist()
        result["texts"] = _numpy(model.encode_text(tokens, normalize=True)["embeds"])
    if inputs is not None:
        result["images"] = _numpy(model.encode_image(inputs["images"], normalize=True)["embeds"])
        ids = {"token_ids": inputs["token_ids"], "padding_mask": inputs["padding_mask"]}
        result["token_ids"] = _numpy(model.encode_text(ids, normalize=True)["embeds"])
    return result


def main(request_file, out):
    request = json.loads(open(request_file).read())
    inputs = dict(np.load(request["inputs"])) if request.get("inputs") else None
    results = []
    for handle in request["handles"]:
        try:
            results.append(embed(vlzoo.from_preset(handle), request["texts"], inputs))
        except Exception as error:  # recorded for the test to assert on
            results.append({"error": type(error).__name__, "message": str(error)})
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
