"""Loads hub handles in a fresh process, as a user would, and records what happened.

    HF_ENDPOINT=http://127.0.0.1:PORT HF_HUB_CACHE=DIR python tests/hub_worker.py OUT.json TEXTS.json HANDLE...

`huggingface_hub` reads `HF_ENDPOINT`, `HF_HUB_CACHE` and `HF_HUB_OFFLINE` when it is imported,
so the tests start this process with them set rather than patch the library. For each handle,
in order: `{"embeddings": encode_text(tokenizer(texts))}` or `{"error": type, "message": ...}`.
"""

import json
import sys

import keras

import vlzoo


def main(out, texts_file, *handles):
    texts = json.loads(open(texts_file).read())
    results = []
    for handle in handles:
        try:
            model = vlzoo.from_preset(handle)
            embeddings = keras.ops.convert_to_numpy(model.encode_text(model.tokenizer(texts)))
            results.append({"embeddings": embeddings.tolist()})
        except Exception as error:  # recorded for the test to assert on
            results.append({"error": type(error).__name__, "message": str(error)})
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
