"""Cross-backend conformance worker: one backend's numbers for the tiny family models.

Run once per backend (the backend is read from `KERAS_BACKEND`):

    KERAS_BACKEND=jax python tests/conformance_worker.py --out jax.npz --save-preset /tmp/p_jax
    KERAS_BACKEND=torch python tests/conformance_worker.py --out torch.npz --load-preset /tmp/p_jax

For each family model (`clip_tiny`, `siglip_tiny`, `filip_tiny`, `sparc_tiny`, `sparo_tiny`, `llip_tiny`, `stair_tiny`,
`flair_tiny`, built with
`load_weights=False`) every weight is overwritten with values drawn from a
numpy RNG seeded by the weight's index, so every backend starts from
bit-identical weights; the inputs (4 images from a seeded RNG, 4 fixed
captions through the model's tokenizer) are identical too. Recorded, under
the key prefix `<preset>/` (e.g. `clip_tiny/encode/image/embeds`):

    weight_names            str (W,): paths of `model.weights` (deterministic order)
    margin/<choice>         how far the inputs keep each discrete choice of the
                            family's training loss from a tie (`tests/margins.py`)
    trainable_index         int (T,): index in `model.weights` of each trainable weight
    init/{i:03d}            weight i as assigned (float32)
    images, token_ids, padding_mask
    encode/image/<key>, encode/text/<key>   every entry of `encode_image(images)` /
                            `encode_text(texts)` (`embeds`, and the family's extras)
    call/<key>              every output of `model(inputs)` (embeddings or
                            token embeddings, logit scale / bias, ...)
    similarity              `similarity(images, texts)`             (4, 4)
    loss                    `compute_loss(y_pred=model(inputs))`, scalar (Keras'
                            default `training=True`: FILIP's token dropping applies,
                            as in `grad_loss`)
    loss_eval               `compute_loss(..., training=False)`
    loss_chunked            (siglip) `siglip_loss(..., num_chunks=2)`
    grad_loss               the loss as computed inside the backend's autodiff
    grad/{j:03d}            d loss / d trainable weight j, dense float32 (j indexes
                            `model.trainable_variables`)
    step/{i:03d}            weight i after ONE `AdamW(1e-3, weight_decay=0.1)` step:
                            `model.compile(optimizer)` (which excludes biases, norms,
                            embeddings and the logit scale/bias from the decay), then
                            `model.optimizer.apply(grads)` with seeded gradients that are
                            identical on every backend (`step_gradients`; jitted
                            `stateless_apply` on JAX)

Gradients come from the backend's own autodiff: `jax.value_and_grad` over
`model.stateless_call` (jitted), `tf.GradientTape`, `torch.autograd.grad`.

Presets: `--save-preset DIR` writes the `clip_tiny` model (fixed weights,
before the optimizer step) with `save_to_preset`, atomically (to
`DIR.partial`, then renamed), so that other workers can wait for it. Each
`--load-preset DIR` (repeatable) is loaded with `vlzoo.from_preset(DIR)` after
the families ran (waiting up to `--wait-presets` seconds for it to appear)
and recorded under `preset{k}/`: `dir`, `weight_names`, `weights/{i:03d}`,
`token_ids`, `padding_mask` (its own tokenizer), `encode/image/embeds`,
`encode/text/embeds`, `similarity`. `--families none` skips the family models.

`meta/*` keys: backend, versions, `TF_ENABLE_ONEDNN_OPTS`, seconds.
Set `VLZOO_CONFORMANCE_VERBOSE=1` to print the phases with timestamps.
"""

import argparse
import math
import os
import shutil
import sys
import time

import numpy as np

from families import TINY_PRESETS
from margins import decision_margins, stair_restricted_to

FAMILIES = TINY_PRESETS
CAPTIONS = (
    "a photo of a cat",
    "a red circle on a white background",
    "two dogs playing in the snow",
    "a diagram of a neural network, drawn by hand",
)
BATCH = 4
IMAGE_SIZE = 32
IMAGE_SEED = 1234
WEIGHT_SEED = 20240607
STEP_SEED = 777
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.1
LOGIT_SCALE = math.log(10.0)
LOGIT_BIAS = -5.0
# STAIR's embeddings are restricted to the captions' words and these 32 ids (`margins.stair_restricted_to`):
# over all 30,522 entries the fixed weights put two pooled candidates 7.4e-7 of their scale apart, which the
# backends' summation orders may decide differently. With these, every choice keeps 2.8e-4 of its scale.
STAIR_EXTRA_IDS = range(2096, 2128)

_T0 = time.perf_counter()


def _phase(label):
    if os.environ.get("VLZOO_CONFORMANCE_VERBOSE"):
        print(f"  [{time.perf_counter() - _T0:7.2f}s] {label}", file=sys.stderr, flush=True)


def _full_precision(backend):
    """No TF32 / reduced-precision matmuls on GPUs (a no-op on CPU)."""
    if backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)
    elif backend == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def fixed_value(index, variable):
    """The value weight `index` gets, from a numpy RNG seeded by the index."""
    shape = tuple(int(d) for d in variable.shape)
    name = variable.path.split("/")[-1]
    if name == "logit_scale":
        return np.full(shape, LOGIT_SCALE, "float32")
    if name == "logit_bias":
        return np.full(shape, LOGIT_BIAS, "float32")
    if "int" in str(variable.dtype):  # counters (STAIR's training steps): a fixed step
        return np.full(shape, 1000 + index, variable.dtype)
    noise = np.random.default_rng([WEIGHT_SEED, index]).standard_normal(shape).astype("float32")
    if name == "gamma":
        return (1.0 + 0.05 * noise).astype("float32")
    return (0.05 * noise).astype("float32")


def fixed_images():
    rng = np.random.default_rng(IMAGE_SEED)
    return rng.standard_normal((BATCH, IMAGE_SIZE, IMAGE_SIZE, 3)).astype("float32")


def to_numpy(x):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(x))


def _dense_numpy(grad):
    """A backend gradient (maybe sparse: `tf.IndexedSlices`) -> numpy float32, or None."""
    if grad is None:
        return None
    if type(grad).__name__ == "IndexedSlices":
        import tensorflow as tf

        grad = tf.convert_to_tensor(grad)
    if hasattr(grad, "detach"):
        grad = grad.detach().cpu()
    return np.asarray(grad).astype("float32")


def run_forward(model, fn):
    """`fn()` (a dict of tensors computed from the model's variables) as numpy.

    On JAX the function is jitted over the variables' values (one XLA
    compilation instead of one per op, as `predict` does); elsewhere it runs
    eagerly.
    """
    import keras

    if keras.backend.backend() == "jax":
        import jax

        variables = model.variables

        def pure(values):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return fn()

        result = jax.jit(pure)([v.value for v in variables])
    else:
        result = fn()
    return {key: to_numpy(value) for key, value in result.items()}


def loss_and_grads(model, inputs):
    """`(loss, grads)`: the family loss and its gradient w.r.t. each of
    `model.trainable_variables` (dense numpy float32), by the backend's autodiff."""
    import keras

    backend = keras.backend.backend()
    trainable = model.trainable_variables
    if backend == "jax":
        import jax

        def loss_fn(trainable_values, non_trainable_values):
            # As Keras' own train step: state updates made by the loss (STAIR's
            # step counters) stay inside the scope.
            mapping = list(zip(trainable, trainable_values))
            mapping += list(zip(model.non_trainable_variables, non_trainable_values))
            with keras.StatelessScope(state_mapping=mapping):
                return model.compute_loss(y_pred=model(inputs, training=True))

        loss, grads = jax.jit(jax.value_and_grad(loss_fn))(
            [v.value for v in trainable], [v.value for v in model.non_trainable_variables]
        )
    elif backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = model.compute_loss(y_pred=model(inputs, training=True))
        grads = tape.gradient(loss, trainable)
    elif backend == "torch":
        import torch

        loss = model.compute_loss(y_pred=model(inputs, training=True))
        grads = torch.autograd.grad(loss, [v.value for v in trainable], allow_unused=True)
        loss = loss.detach()
    else:
        raise NotImplementedError(f"conformance worker: backend {backend!r}")
    dense = []
    for v, g in zip(trainable, grads):
        g = _dense_numpy(g)
        dense.append(np.zeros(tuple(v.shape), "float32") if g is None else g)
    return float(to_numpy(loss)), dense


def step_gradients(model):
    """Seeded gradients, identical on every backend, for the optimizer-step check.

    The backends' own gradients already agree to ~1e-6 (checked above), but Adam's
    first update `lr * g / (|g| + eps)` amplifies their float noise by up to
    `lr / eps` = 1e4 where a gradient is near zero. Feeding every backend the same
    gradients checks the update path itself (AdamW, the decay exclusions, the
    logit-scale constraint) instead of that noise.
    """
    return [
        (0.01 * np.random.default_rng([STEP_SEED, j]).standard_normal(tuple(v.shape))).astype("float32")
        for j, v in enumerate(model.trainable_variables)
    ]


def optimizer_step(model, grads):
    """One `AdamW(1e-3, weight_decay=0.1)` step of `model` with the given numpy gradients."""
    import keras

    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY))
    optimizer = model.optimizer
    trainable = model.trainable_variables
    if keras.backend.backend() == "jax":
        import jax

        optimizer.build(trainable)
        new_values, _ = jax.jit(optimizer.stateless_apply)(
            [v.value for v in optimizer.variables], [jax.numpy.asarray(g) for g in grads],
            [v.value for v in trainable],
        )
        for v, value in zip(trainable, new_values):
            v.assign(value)
    else:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], trainable)


def save_preset_atomically(model, directory):
    partial = f"{directory}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    model.save_to_preset(partial)
    os.rename(partial, directory)


def _flat(prefix, value):
    """A tensor or a dict of tensors (the family's encodings / outputs) as
    `{prefix: tensor}` or `{prefix/key: tensor}`."""
    if isinstance(value, dict):
        return {f"{prefix}/{key}": v for key, v in value.items()}
    return {prefix: value}


def run_family(name, record, save_preset=None):
    import vlzoo
    from vlzoo.losses import siglip_loss

    model = vlzoo.from_preset(name, load_weights=False)
    if model.family == "stair":
        words = model.tokenizer(list(CAPTIONS))["token_ids"]
        model = vlzoo.from_preset(name, load_weights=False, **stair_restricted_to(words, STAIR_EXTRA_IDS))
    weights = model.weights
    index_of = {id(v): i for i, v in enumerate(weights)}
    record["weight_names"] = np.array([v.path for v in weights])
    record["trainable_index"] = np.array([index_of[id(v)] for v in model.trainable_variables], "int64")
    for i, v in enumerate(weights):
        value = fixed_value(i, v)
        v.assign(value)
        record[f"init/{i:03d}"] = value
    for i, v in enumerate(weights):  # the assignment must be exact on every backend
        if not np.array_equal(to_numpy(v), record[f"init/{i:03d}"]):
            raise AssertionError(f"{name}: weight {v.path} does not read back what was assigned")
    _phase(f"{name}: weights set")

    images = fixed_images()
    tokens = model.tokenizer(list(CAPTIONS))
    token_ids = np.asarray(to_numpy(tokens["token_ids"]))
    padding_mask = np.asarray(to_numpy(tokens["padding_mask"]))
    record["images"], record["token_ids"], record["padding_mask"] = images, token_ids, padding_mask
    texts = {"token_ids": token_ids, "padding_mask": padding_mask}
    inputs = {"images": images, **texts}
    _phase(f"{name}: tokenized")
    for choice, margin in decision_margins(model, inputs).items():
        record[f"margin/{choice}"] = np.float64(margin)

    def forward():
        outputs = model(inputs, training=False)
        result = {
            **_flat("encode/image", model.encode_image(images)),
            **_flat("encode/text", model.encode_text(texts)),
            **_flat("call", outputs),
            "similarity": model.similarity(images, texts),
            "loss": model.compute_loss(y_pred=outputs),
            "loss_eval": model.compute_loss(y_pred=outputs, training=False),
        }
        if model.family == "siglip":
            result["loss_chunked"] = siglip_loss(
                outputs["image_embeds"], outputs["text_embeds"], outputs["logit_scale"],
                outputs["logit_bias"], num_chunks=2,
            )
        return result

    state = [to_numpy(v) for v in model.non_trainable_variables]
    record.update(run_forward(model, forward))
    _phase(f"{name}: forward")

    grad_loss, grads = loss_and_grads(model, inputs)
    # A training-mode loss may advance non-trainable state (STAIR's step
    # counters) on the eager backends only: put it back for the step check.
    for v, value in zip(model.non_trainable_variables, state):
        v.assign(value)
    record["grad_loss"] = np.float32(grad_loss)
    for j, g in enumerate(grads):
        record[f"grad/{j:03d}"] = g
    _phase(f"{name}: gradients")

    if save_preset:
        save_preset_atomically(model, save_preset)
        _phase(f"{name}: saved to {save_preset}")

    optimizer_step(model, step_gradients(model))
    for i, v in enumerate(model.weights):
        record[f"step/{i:03d}"] = to_numpy(v)
    _phase(f"{name}: optimizer step")


def run_preset(directory, record, wait=0.0):
    import vlzoo

    deadline = time.monotonic() + wait
    while not os.path.isdir(directory):
        if time.monotonic() > deadline:
            raise FileNotFoundError(f"preset directory {directory} did not appear within {wait:.0f}s")
        time.sleep(0.2)
    model = vlzoo.from_preset(directory)
    _phase(f"preset {directory}: loaded")
    record["dir"] = np.array(str(directory))
    record["weight_names"] = np.array([v.path for v in model.weights])
    for i, v in enumerate(model.weights):
        record[f"weights/{i:03d}"] = to_numpy(v)
    images = fixed_images()
    tokens = model.tokenizer(list(CAPTIONS))
    texts = {"token_ids": np.asarray(to_numpy(tokens["token_ids"])),
             "padding_mask": np.asarray(to_numpy(tokens["padding_mask"]))}
    record["token_ids"], record["padding_mask"] = texts["token_ids"], texts["padding_mask"]
    record.update(run_forward(model, lambda: {
        **_flat("encode/image", model.encode_image(images)),
        **_flat("encode/text", model.encode_text(texts)),
        "similarity": model.similarity(images, texts),
    }))
    _phase(f"preset {directory}: forward")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the .npz file to write")
    parser.add_argument("--save-preset", help="save the clip_tiny model (fixed weights) to this directory")
    parser.add_argument("--load-preset", action="append", default=[],
                        help="load this preset directory and record its outputs (repeatable)")
    parser.add_argument("--wait-presets", type=float, default=0.0,
                        help="seconds to wait for each --load-preset directory to appear")
    parser.add_argument("--families", default=",".join(FAMILIES),
                        help="comma-separated family presets to run, or 'none'")
    args = parser.parse_args(argv)

    import keras

    backend = keras.backend.backend()
    _full_precision(backend)
    families = [] if args.families in ("", "none") else args.families.split(",")
    if args.save_preset and "clip_tiny" not in families:
        parser.error("--save-preset needs clip_tiny among --families")

    out = {
        "meta/backend": np.array(backend),
        "meta/keras_version": np.array(keras.__version__),
        "meta/tf_enable_onednn_opts": np.array(os.environ.get("TF_ENABLE_ONEDNN_OPTS", "")),
        "meta/families": np.array(families, dtype=str),
        "meta/num_presets": np.int64(len(args.load_preset)),
    }
    _phase(f"{backend}: imported")
    for name in families:
        record = {}
        run_family(name, record, save_preset=args.save_preset if name == "clip_tiny" else None)
        out.update({f"{name}/{k}": v for k, v in record.items()})
    for k, directory in enumerate(args.load_preset):
        record = {}
        run_preset(directory, record, wait=args.wait_presets)
        out.update({f"preset{k}/{key}": v for key, v in record.items()})
    out["meta/seconds"] = np.float64(time.perf_counter() - _T0)
    np.savez(args.out, **out)
    print(f"[{backend}] wrote {args.out} ({len(out)} arrays) in {out['meta/seconds']:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
