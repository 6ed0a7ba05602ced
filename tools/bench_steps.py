"""What each `tools/bench.py` case computes: its step functions and their inputs.

`CASE_BUILDERS[entry](case)` returns the case's `[(step, args)]`: the measured step first,
then its baselines (CLIP's step on the same towers, open_clip's equivalent, ...), which
`bench.run_case` times alternately. Each builder imports its framework when called, so this
module loads in the launcher's process without one.
"""

import numpy as np

from bench_device import accelerator, to_accelerator

# Per-family arguments on top of the CLIP towers (dicts merge into the tower's).
STEP_FAMILY_ARGS = {
    "sparo": dict(embed_dim=None),  # the encoding is L * V = 64 * 64 (sparo_clip_vit_b16, docs/families/sparo.md §Presets)
    "llip": dict(vision=dict(num_prefix_tokens=32)),  # K = 32 mixture tokens (the target)
    "stair": dict(embed_dim=None),  # the embedding is the vocabulary
}

def _grad_fn(loss, num_args):
    """`f(*arrays) -> (value, grads)` compiled by the active backend."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.jit(jax.value_and_grad(loss, argnums=tuple(range(num_args))))
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=True)
        def step(*args):
            with tf.GradientTape() as tape:
                tape.watch(args)
                value = loss(*args)
            return value, tape.gradient(value, args)

        return step
    import torch

    def step(*args):
        args = [a.detach().requires_grad_(True) for a in args]
        value = loss(*args)
        return value, torch.autograd.grad(value, args)

    return step


def block(result):
    """Waits for `result` (any backend's tensors, torch's too): its leaves as numpy arrays."""
    import keras

    def to_numpy(x):
        if hasattr(x, "detach"):  # a torch tensor (open_clip's); numpy has no bfloat16
            return x.detach().float().cpu().numpy() if x.is_floating_point() else x.detach().cpu().numpy()
        return keras.ops.convert_to_numpy(x)

    return [to_numpy(x) for x in keras.tree.flatten(result)]


def _filip_loss_step(case):
    """FILIP loss value and gradients w.r.t. both token sets: `(step, args)`."""
    import keras

    from vlzoo.losses import filip_loss

    b, p, t, d = case["B"], case["P"], case["T"], case["D"]
    rng = np.random.default_rng(0)
    image = keras.ops.convert_to_tensor(rng.normal(size=(b, p, d)).astype("float32"))
    text = keras.ops.convert_to_tensor(rng.normal(size=(b, t, d)).astype("float32"))
    lengths = rng.integers(5, t + 1, size=b)
    mask = keras.ops.convert_to_tensor(np.arange(t)[None] < lengths[:, None])
    def loss(image_tokens, text_tokens):
        return filip_loss(image_tokens, text_tokens, mask, 100.0, num_chunks=case["num_chunks"])

    return _grad_fn(loss, 2), (image, text)


def _stair_pool_step(case):
    """STAIR's vocabulary pooling, forward + backward w.r.t. features, tied table and bias: `(step, args)`.

    `num_chunks=None` materialises the `(B, S, V)` logits `features @ table.T + bias` and pools them
    with `stair_pool`; an int has `stair_head_pool` reduce that many vocabulary blocks, each
    rematerialised in the backward pass.
    """
    import keras

    from vlzoo.losses import stair_head_pool, stair_pool

    b, s, v, d = case["B"], case["S"], case["V"], case["D"]
    rng = np.random.default_rng(0)
    features = keras.ops.convert_to_tensor(rng.normal(size=(b, s, d)).astype("float32"))
    table = keras.ops.convert_to_tensor((0.02 * rng.normal(size=(v, d))).astype("float32"))
    bias = keras.ops.convert_to_tensor(np.zeros((v,), "float32"))
    chunks = case["num_chunks"]

    def loss(features, table, bias):
        if chunks is None:
            pooled = stair_pool(keras.ops.matmul(features, keras.ops.transpose(table)) + bias)
        else:
            pooled = stair_head_pool(features, table, bias, num_chunks=chunks)
        return keras.ops.sum(pooled)

    return _grad_fn(loss, 3), (features, table, bias)


def _random_inputs(seed=0):
    """`(normal(*shape), text_mask(batch, length))`: float32 normal tensors and bool masks of 5 .. length real
    tokens, from one generator."""
    import keras

    rng = np.random.default_rng(seed)

    def normal(*shape):
        return keras.ops.convert_to_tensor(rng.normal(size=shape).astype("float32"))

    def text_mask(batch, length):
        return keras.ops.convert_to_tensor(np.arange(length)[None] < rng.integers(5, length + 1, (batch, 1)))

    return normal, text_mask


def _loss_memory_step(case):
    """One loss of MEMORY_LOSSES at batch `B`, forward + backward w.r.t. its inputs: `(step, args)`."""
    from vlzoo.losses import clip_loss, filip_loss
    from vlzoo.losses.llip import llip_loss

    b = case["B"]
    normal, text_mask = _random_inputs()

    if case["loss"] == "clip":
        return _grad_fn(lambda i, t: clip_loss(i, t, 100.0), 2), (normal(b, case["D"]), normal(b, case["D"]))
    if case["loss"] == "filip":
        mask = text_mask(b, case["T"])

        def loss(image_tokens, text_tokens):
            return filip_loss(image_tokens, text_tokens, mask, 100.0, num_chunks=case["num_chunks"])

        return _grad_fn(loss, 2), (normal(b, case["P"], case["D"]), normal(b, case["T"], case["D"]))
    k, m, d = case["K"], case["M"], case["D"]

    def loss(queries, keys, values, text):
        return llip_loss(queries, keys, values, text, 1 / 0.07, -10.0, 5.0, num_chunks=case["num_chunks"])

    return _grad_fn(loss, 4), (normal(b, m, d // m), normal(b, k, m, d // m), normal(b, k, m, d), normal(b, d))


def _share_memory_step(case):
    """One replica's share (`rows=`) of a loss of SHARE_LOSSES in a step over `replicas` replicas of
    the global batch `B`, forward + backward w.r.t. its inputs: those the share reads across replicas hold
    the global batch, the others (the family's `replica_local_outputs`) this replica's rows. `(step, args)`."""
    import keras

    from vlzoo.layers import TextConditionedPooling
    from vlzoo.losses import clip_loss, filip_loss, flair_caption_indices, flair_loss, flair_pair_logits
    from vlzoo.losses import llip_loss, siglip_loss

    b, replicas = case["B"], case["replicas"]
    local = b // replicas
    normal, text_mask = _random_inputs()

    if case["loss"] == "clip":
        return _grad_fn(lambda i, t: clip_loss(i, t, 100.0, rows=(0, local)), 2), (normal(b, case["D"]),
                                                                                 normal(b, case["D"]))
    if case["loss"] == "siglip":  # the texts in `replicas` chunks: blocks of local x local logits
        return (_grad_fn(lambda i, t: siglip_loss(i, t, 10.0, -10.0, rows=(0, local), num_chunks=replicas), 2),
                (normal(local, case["D"]), normal(b, case["D"])))
    if case["loss"] == "filip":
        mask = text_mask(b, case["T"])

        def loss(image_tokens, text_tokens):
            return filip_loss(image_tokens, text_tokens, mask, 100.0, num_chunks=case["num_chunks"], rows=(0, local))

        return _grad_fn(loss, 2), (normal(b, case["P"], case["D"]), normal(b, case["T"], case["D"]))
    if case["loss"] == "flair":  # K = 1 caption per image: each image pooled on the B captions
        pooling = TextConditionedPooling(case["D"], num_heads=case["M"])
        indices = flair_caption_indices(np.zeros((b, b - 1), "int32"), 1)[:local]

        def flair(texts, image_tokens, image_embeds):
            sampled = keras.ops.take(texts, indices, axis=0)
            conditioned = flair_pair_logits(pooling(sampled, image_tokens), sampled, 10.0, -10.0)
            return flair_loss(conditioned, 1, keras.ops.matmul(image_embeds, keras.ops.transpose(texts)), rows=(0, local))

        return _grad_fn(flair, 3), (normal(b, case["D"]), normal(local, case["P"], case["D"]),
                                    normal(local, case["D"]))
    k, m, d = case["K"], case["M"], case["D"]

    def llip(queries, keys, values, text):
        return llip_loss(queries, keys, values, text, 1 / 0.07, -10.0, 5.0, num_chunks=case["num_chunks"],
                         rows=(0, local))

    return _grad_fn(llip, 4), (normal(b, m, d // m), normal(local, k, m, d // m), normal(local, k, m, d),
                               normal(b, d))


def exchange_counts(case):
    """Megabytes one replica sends in a training step of `case["family"]` on the towers of `case["towers"]`
    at local batch `case["batch_size"]`, for each world size W of `case["world_sizes"]`, counted from the
    family's outputs and weights.

    Per step, a replica sends its rows of every output the loss reads across replicas to each of the W - 1
    others (the all-gather), the gradients of the others' rows back to them (the all-gather's backward, a
    reduce-scatter; float outputs only), and 2 (W - 1) / W of the weights' gradients (a ring all-reduce,
    as DistributedDataParallel's and NCCL's). Returns, in bytes, `gathered_per_row` and `local_per_row`
    (the outputs read at the replica's own rows only, `replica_local_outputs`, never sent), `gradients`,
    and per W `outputs_w{W}` (the outputs and their gradients) and `sent_w{W}` (and the weights' gradients).
    """
    import keras

    model = _family_model(case["family"], case["towers"])
    outputs = model(_random_batch(2, model.vision.image_size, model.text.sequence_length,
                                  model.text.vocabulary_size), training=True)
    local = set(model.replica_local_outputs)

    def row_bytes(keys, floats_only=False):
        total = 0
        for key in keys:
            value = outputs[key]
            dtype = keras.backend.standardize_dtype(value.dtype)
            if len(value.shape) and not (floats_only and "float" not in dtype):
                total += int(np.prod(value.shape[1:])) * np.dtype(dtype).itemsize
        return total

    gathered = [key for key in outputs if key not in local]
    weights = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    result = {"gathered_per_row": row_bytes(gathered), "local_per_row": row_bytes(local), "gradients": weights}
    for w in case["world_sizes"]:
        rows = (w - 1) * case["batch_size"]
        result[f"outputs_w{w}"] = rows * (row_bytes(gathered) + row_bytes(gathered, floats_only=True))
        result[f"sent_w{w}"] = result[f"outputs_w{w}"] + 2 * (w - 1) * weights // w
    return result


def same_towers_config(family, towers):
    """`family`'s constructor arguments on the tower geometry of the CLIP preset `towers`.

    CLIP itself keeps its preset config; every other family takes the same
    widths, depths, heads, patch, image size, vocabulary and context, with
    its own defaults for the rest (pooling, CLS, activation) plus
    `STEP_FAMILY_ARGS[family]`.
    """
    from vlzoo.presets import catalogue

    config = catalogue.definition(towers)["config"]
    if family == "clip":
        return config
    geometry = ("image_size", "patch_size", "vocabulary_size", "sequence_length",
                "hidden_dim", "num_layers", "num_heads", "intermediate_dim")
    result = dict(
        vision={k: v for k, v in config["vision"].items() if k in geometry},
        text={k: v for k, v in config["text"].items() if k in geometry},
        embed_dim=config["embed_dim"],
    )
    for key, value in STEP_FAMILY_ARGS.get(family, {}).items():
        result[key] = {**result[key], **value} if isinstance(value, dict) else value
    return result


def _random_batch(batch_size, image_size, context, vocabulary_size, seed=0):
    """Random images (NHWC) and captions whose end token is the largest id (open_clip pools at the argmax)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, context + 1, size=batch_size)
    ids = rng.integers(1, vocabulary_size - 1, size=(batch_size, context))
    ids[np.arange(batch_size), lengths - 1] = vocabulary_size - 1
    mask = np.arange(context)[None] < lengths[:, None]
    return {
        "images": rng.normal(size=(batch_size, image_size, image_size, 3)).astype("float32"),
        "token_ids": np.where(mask, ids, 0).astype("int32"),
        "padding_mask": mask,
    }


def _family_model(family, towers):
    """A `family` model on the towers of the CLIP preset `towers` (`same_towers_config`), randomly initialised."""
    import vlzoo
    from vlzoo.presets import catalogue

    classes = {entry["family"]: getattr(vlzoo, entry["class_name"]) for entry in catalogue.definitions().values()}
    return classes[family](**same_towers_config(family, towers))


def _family_step(family, towers, batch_size, micro_batch_size=None):
    """One `train_on_batch` of `family` on the towers of the CLIP preset `towers` (gradient caching with
    `micro_batch_size`): `(step, args)`."""
    from vlzoo.optimizers import AdamW

    model = _family_model(family, towers)
    model.micro_batch_size = micro_batch_size
    model.compile(optimizer=AdamW(learning_rate=1e-5))
    batch = _random_batch(batch_size, model.vision.image_size, model.text.sequence_length,
                          model.text.vocabulary_size)
    return (lambda x: model.train_on_batch(x)), (to_accelerator(batch),)


def _distributed_steps(case):
    """CLIP's `train_on_batch` on `case["batch_size"] / processes` pairs in this process, rank 0 of
    `processes` that train together (torch.distributed, gloo; the others are helpers of this module started
    here, which take the same steps): `[(step, args)]`. With 1 process, the step on the whole batch."""
    processes = case["processes"]
    if processes > 1:
        _join(case, rank=0)
    return [_family_step("clip", case["towers"], case["batch_size"] // processes)]


def _join(case, rank):
    """Joins `case`'s process group as `rank`; rank 0 starts the other ranks first."""
    import datetime
    import json
    import os
    import socket
    import subprocess
    import sys

    import torch.distributed as dist

    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        for other in range(1, case["processes"]):
            subprocess.Popen([sys.executable, os.path.abspath(__file__), json.dumps(case), str(other)],
                             env=dict(os.environ), start_new_session=True)
    dist.init_process_group("gloo", rank=rank, world_size=case["processes"],
                            timeout=datetime.timedelta(seconds=600))


def _distributed_helper(case, rank):
    """A rank above 0 of a `distributed` case: the case's step as often as `bench.run_case` calls rank 0's."""
    _join(case, rank)
    step, args = _family_step("clip", case["towers"], case["batch_size"] // case["processes"])
    for _ in range(1 + case["repeats"]):
        step(*args)


def _train_steps(case):
    """The family's train step, then CLIP's on the same towers (timed alternately)."""
    return [_family_step(family, case["towers"], case["batch_size"]) for family in (case["family"], "clip")]


def _open_clip_steps(case):
    """`case["task"]` of vlzoo and of open_clip on the same weights and batch: `[(step, args)]`.

    The peer is open_clip's `CLIP` for `case["peer"]` (a name of its model
    configs, or a config dict), random init; the vlzoo model is converted from
    it (`vlzoo.convert.from_open_clip`), so both compute the same function.
    Inference: vlzoo's eager `encode_image` / `encode_text` (`predict_*`: its
    compiled `predict_on_batch`) against open_clip's under
    `torch.inference_mode()` in eval mode. Training: vlzoo's `train_on_batch`
    (`vlzoo.optimizers.AdamW`, what `compile()` gives) against open_clip's forward, `ClipLoss`,
    backward and `AdamW.step()` (PyTorch's default AdamW), both with the same learning rate and weight
    decay. `case["only"]` keeps one side, "vlzoo" or "open_clip" (the memory runs: one framework per
    process).

    Precision: vlzoo's model takes the dtype policy `case["dtype"]` (default
    float32); open_clip runs once per entry of `case["peer_precisions"]`
    (default `["float32"]`): "float32" plainly, "bfloat16" under
    `torch.autocast(device, torch.bfloat16)` (its mixed precision), in that
    order after vlzoo's step. open_clip runs on CUDA when vlzoo's backend
    computes on an accelerator and PyTorch sees one, else on the CPU.
    """
    import contextlib
    import json

    import keras
    import torch

    from vlzoo.convert import from_open_clip
    from vlzoo.convert.checkpoints import import_open_clip, open_clip_model_config
    from vlzoo.optimizers import AdamW

    open_clip = import_open_clip()
    config = case["peer"] if isinstance(case["peer"], dict) else open_clip_model_config(case["peer"])
    torch.manual_seed(0)
    peer = open_clip.CLIP(**config)
    text_cfg = config["text_cfg"]
    batch = _random_batch(case["batch_size"], config["vision_cfg"]["image_size"], text_cfg["context_length"],
                        text_cfg["vocab_size"])
    device = torch.device("cuda" if accelerator() and torch.cuda.is_available() else "cpu")
    images = torch.from_numpy(batch["images"]).permute(0, 3, 1, 2).contiguous().to(device)
    ids = torch.from_numpy(batch["token_ids"]).long().to(device)
    task, steps = case["task"], {}
    if case.get("only") != "open_clip":
        model, inputs = from_open_clip(peer, dtype=case.get("dtype")), to_accelerator(batch)
        if task == "train_step":
            model.compile(optimizer=AdamW(learning_rate=1e-5, weight_decay=0.1))
            steps["vlzoo"] = (lambda x: model.train_on_batch(x)), (inputs,)
        elif task == "serve_image":
            steps["vlzoo"] = _serving_step(model, case["path"], inputs["images"],
                                           key=(json.dumps(case["peer"], sort_keys=True), case.get("dtype")))
        else:
            texts = {k: inputs[k] for k in ("token_ids", "padding_mask")}
            if task.startswith("predict"):
                steps["vlzoo"] = model.predict_on_batch, ({"images": inputs["images"]} if "image" in task else texts,)
            else:
                encode, arg = ((model.encode_image, inputs["images"]) if task == "encode_image" else
                               (model.encode_text, texts))
                if keras.backend.backend() == "torch":  # as open_clip's: no autograd graph at inference
                    def encode_no_grad(x, encode=encode):
                        with torch.no_grad():
                            return encode(x)

                    steps["vlzoo"] = encode_no_grad, (arg,)
                else:
                    steps["vlzoo"] = encode, (arg,)
    peers = [] if case.get("only") == "vlzoo" else case.get("peer_precisions", ["float32"])
    if peers:  # after the conversion, which reads the weights on the host
        peer.to(device)
    for precision in peers:
        def autocast(precision=precision):
            if precision == "float32":
                return contextlib.nullcontext()
            return torch.autocast(device.type, dtype=getattr(torch, precision))

        if task == "train_step":
            loss_fn = open_clip.ClipLoss()
            optimizer = torch.optim.AdamW(peer.parameters(), lr=1e-5, weight_decay=0.1)
            peer.train()

            def peer_step(images, ids, autocast=autocast, optimizer=optimizer):
                with autocast():
                    image_features, text_features, logit_scale = peer(images, ids)[:3]
                    loss = loss_fn(image_features, text_features, logit_scale)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss.detach()

            steps[precision] = peer_step, (images, ids)
        else:
            peer.eval()
            encode, arg = (peer.encode_image, images) if "image" in task else (peer.encode_text, ids)

            def peer_infer(x, encode=encode, autocast=autocast):
                with torch.inference_mode(), autocast():
                    return encode(x)

            steps[precision] = peer_infer, (arg,)
    return [steps[side] for side in ("vlzoo", *peers) if side in steps]


# This process's ONNX exports of the image tower, `{(key, batch size): path}` (`_serving_step`).
_ONNX_EXPORTS = {}


def _serving_step(model, path, images, key=None):
    """vlzoo's image embeddings along serving `path` (one of `SERVING_PATHS`): `(step, args)`.

    Keras' paths call the compiled `predict_on_batch` of the image tower as its own model
    (`ImageEncoder`; `model` already in its dtype, quantized here for "int8"); the ONNX paths
    export that tower from the active backend with a fixed batch and run it on ONNX Runtime (its
    own dynamic int8 copy for "onnx_int8"). `key` names `model`'s weights (the peer's config, from
    seeded weights, and the dtype): a process that has exported the tower of the same `key` and
    batch reuses that file, the same export (only a `--quick` run runs both ONNX paths in one
    process).
    """
    import tempfile

    from vlzoo import serving

    if path.startswith("onnx"):
        import onnxruntime

        pixels = np.asarray(images)
        artefact = _ONNX_EXPORTS.get((key, len(pixels))) if key is not None else None
        if artefact is None:
            artefact = serving.export(model, tempfile.mkdtemp(prefix="vlzoo_bench_"), format="onnx",
                                      towers="image", batch_size=len(pixels))["image"]
            if key is not None:
                _ONNX_EXPORTS[(key, len(pixels))] = artefact
        if path == "onnx_int8":
            artefact = serving.quantize_onnx(artefact)
        session = onnxruntime.InferenceSession(artefact, providers=["CPUExecutionProvider"])
        return (lambda x: session.run(["embeds"], {"images": x})[0]), (pixels,)
    if path == "int8":
        model.quantize("int8")
    encoder = serving.ImageEncoder(model)
    return (lambda x: encoder.predict_on_batch(x)["embeds"]), (images,)


def _matmul_step(case):
    """`N x N @ N x N` in `case["dtype"]` with the active backend's own matmul: `(step, args)`; int8 (PyTorch):
    `torch._int_mm`, the int8 product with int32 sums that PyTorch runs on the CPU's int8 units (VNNI, AMX)."""
    import keras

    rng = np.random.default_rng(0)
    if case["dtype"] == "int8":
        import torch

        a, b = (torch.from_numpy(rng.integers(-128, 128, size=(case["N"],) * 2).astype(np.int8)) for _ in range(2))
        device = "cuda" if accelerator() and torch.cuda.is_available() else "cpu"
        return torch._int_mm, (a.to(device), b.to(device))
    a, b = (keras.ops.cast(rng.normal(size=(case["N"],) * 2).astype("float32"), case["dtype"]) for _ in range(2))
    return keras.ops.matmul, (a, b)


def _precision_steps(case):
    return [_matmul_step(case)] if case["task"] == "matmul" else _open_clip_steps(case)


CASE_BUILDERS = {
    "open_clip": _open_clip_steps,
    "host_overhead": _open_clip_steps,
    "precision": _precision_steps,
    "serving": _open_clip_steps,
    "filip_loss": lambda case: [_filip_loss_step(case)],
    "train_step": _train_steps,
    "stair_pool": lambda case: [_stair_pool_step(case)],
    "loss_memory": lambda case: [_loss_memory_step(case)],
    "share_memory": lambda case: [_share_memory_step(case)],
    "distributed": _distributed_steps,
    "grad_caching": lambda case: [_family_step("clip", case["towers"], case["batch_size"], case["micro_batch_size"])],
}

# Entries whose figures are counted, not timed: `CASE_COUNTS[entry](case)` returns the case's result.
CASE_COUNTS = {"exchange": exchange_counts}


if __name__ == "__main__":  # a helper rank of a `distributed` case (started by `_join`)
    import json
    import sys

    import vlzoo  # noqa: F401  (first, as in a case's process)

    _distributed_helper(json.loads(sys.argv[1]), int(sys.argv[2]))
