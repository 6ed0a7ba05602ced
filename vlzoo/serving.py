"""Serving artefacts: each tower of a vlzoo model exported on its own, through Keras' `model.export`.

A search or classification service embeds its images and its queries apart,
so each tower is a separate artefact: `image` takes preprocessed pixels
`images` `(B, H, W, 3)` float32 (the preset's `preprocessor` output), `text`
takes `token_ids` `(B, T)` int32 and `padding_mask` `(B, T)` bool (the
`tokenizer` output). Each returns the family's `encode_image` /
`encode_text` dict, normalised as `normalize=True` does, one named output
per entry: `embeds` for every family, and the extras that family's `score`
reads (FILIP and SPARC `tokens` and `mask`, Llip `keys`, `values`,
`mixture_tokens` and `queries`, ...).

Which backend exports which format is Keras' decision:

| format | TensorFlow | JAX | PyTorch |
|---|---|---|---|
| `tf_saved_model` | yes | yes (through jax2tf; TensorFlow installed) | no (Keras needs `torch_xla`) |
| `onnx` | yes (tf2onnx) | yes (jax2onnx, the `export` extra) | a fixed `batch_size` only |
| `litert` | yes | no | with `litert-torch` installed |

`export` refuses the empty cells by name before it writes anything, and
writes `export.json` beside the artefacts: the family, format, inputs,
outputs and the image preprocessing a server must apply.

Example:
>>> model = vlzoo.from_preset("clip_shapes")  # doctest: +SKIP
>>> paths = vlzoo.export(model, "serving/clip_shapes", format="onnx")  # doctest: +SKIP
>>> run_artefact(paths["image"], {"images": pixels})["embeds"].shape  # doctest: +SKIP
(B, D)
"""

import importlib.util
import json
import os
import warnings

import keras
import numpy as np

from vlzoo._backends.keras_internals import arange_with_start
from vlzoo.layers import SparseVocabHead
from vlzoo.models.base import ContrastiveModel
from vlzoo.training._models import blank_copy

__all__ = ["FORMATS", "ImageEncoder", "TextEncoder", "export", "parity", "quantize_onnx", "run_artefact",
           "unsupported"]

# format -> the artefact's suffix (a SavedModel is a directory)
FORMATS = {"tf_saved_model": "", "onnx": ".onnx", "litert": ".tflite"}
_TOWERS = ("image", "text")


class ImageEncoder(keras.Model):
    """A vlzoo model's image tower as a model of its own: `images` `(B, H, W, 3)` to its normalised embeddings.

    Args:
        model: a vlzoo model.

    Example:
    >>> ImageEncoder(model)(pixels)["embeds"].shape  # unit-norm rows  # doctest: +SKIP
    (B, D)
    """

    def __init__(self, model, **kwargs):
        super().__init__(**{"name": "image_encoder", **kwargs})
        self.model = model
        self.built = model.built  # no weights of its own

    def call(self, images):
        return _by_name(self.model.encode_image(images, normalize=True))

    def input_signature(self, batch_size=None):
        """The export's inputs: `[images (batch_size, H, W, 3) float32]`."""
        size = self.model.vision.image_size
        return [keras.InputSpec(shape=(batch_size, size, size, 3), dtype="float32", name="images")]


class TextEncoder(keras.Model):
    """A vlzoo model's text tower as a model of its own: `token_ids`, `padding_mask` `(B, T)` to its normalised
    embeddings.

    Args:
        model: a vlzoo model.

    Example:
    >>> tokens = model.tokenizer(["a red circle"])  # doctest: +SKIP
    >>> TextEncoder(model)(tokens["token_ids"], tokens["padding_mask"])["embeds"].shape  # doctest: +SKIP
    (1, D)
    """

    def __init__(self, model, **kwargs):
        super().__init__(**{"name": "text_encoder", **kwargs})
        self.model = model
        self.built = model.built  # no weights of its own

    def call(self, token_ids, padding_mask):
        return _by_name(self.model.encode_text({"token_ids": token_ids, "padding_mask": padding_mask},
                                               normalize=True))

    def input_signature(self, batch_size=None):
        """The export's inputs: `[token_ids (batch_size, T) int32, padding_mask (batch_size, T) bool]`."""
        length = self.model.text.sequence_length
        return [keras.InputSpec(shape=(batch_size, length), dtype="int32", name="token_ids"),
                keras.InputSpec(shape=(batch_size, length), dtype="bool", name="padding_mask")]


def unsupported(format, backend, batch_size=None):
    """Why Keras cannot export `format` from `backend` (with `batch_size`), or None where it can.

    Args:
        format: a key of `FORMATS`.
        backend: `"tensorflow"`, `"jax"` or `"torch"`.
        batch_size: the fixed batch, or None.

    Returns:
        str (the reason, and what to do instead) or None.

    Example:
    >>> unsupported("tf_saved_model", "tensorflow") is None
    True
    """
    if format == "tf_saved_model" and backend == "torch":
        return ("Keras exports a TensorFlow SavedModel from the PyTorch backend only through torch_xla; export it "
                "from the TensorFlow or JAX backend (KERAS_BACKEND), or choose format='onnx'.")
    if format == "litert" and backend == "torch" and importlib.util.find_spec("litert_torch") is None:
        return ("Keras exports LiteRT from the PyTorch backend through litert-torch, which is not installed; "
                "install it, or export with KERAS_BACKEND=tensorflow.")
    if format == "onnx" and backend == "jax" and importlib.util.find_spec("jax2onnx") is None:
        return ("Keras exports ONNX from the JAX backend through jax2onnx, which is not installed; install it, or "
                "export with KERAS_BACKEND=tensorflow.")
    if format == "litert" and backend == "jax":
        return ("Keras exports LiteRT from the TensorFlow backend (and from PyTorch with litert-torch), not from "
                "JAX; export it with KERAS_BACKEND=tensorflow.")
    if format == "onnx" and backend == "torch" and batch_size is None:
        return ("Keras' ONNX export from the PyTorch backend needs a fixed batch: pass `batch_size` (or export "
                "from the TensorFlow backend, whose ONNX artefacts take any batch).")
    return None


def export(model, path, format="tf_saved_model", towers=_TOWERS, batch_size=None):
    """Writes each of `towers` of `model` as a serving artefact under the directory `path`.

    Args:
        model: a vlzoo model in float32 (the reference path; load it with
            `dtype="float32"`).
        path: directory to write (created): `image` / `text` plus the
            format's suffix (`.onnx`, `.tflite`; a SavedModel is a
            directory), and `export.json`.
        format: one of `FORMATS`: `"tf_saved_model"`, `"onnx"` or `"litert"`.
        towers: `"image"`, `"text"`, or a sequence of them.
        batch_size: a fixed batch for the artefacts' inputs; None: any batch
            (where the backend's exporter allows it, see the module's table).

    Returns:
        `{tower: artefact path}`.

    Raises:
        TypeError: `model` is not a vlzoo model.
        ValueError: an unknown format or tower, a `batch_size` not a positive int or None, a
            model not in float32, or a format the active backend cannot export (with the reason).
        RuntimeError: an ONNX artefact whose outputs do not match the encoder's.

    Example:
    >>> vlzoo.export(model, "serving/clip", format="tf_saved_model", towers="text")  # doctest: +SKIP
    {'text': 'serving/clip/text'}
    """
    if not isinstance(model, ContrastiveModel):
        raise TypeError(f"`model` must be a vlzoo model; received {type(model).__name__}.")
    if format not in FORMATS:
        raise ValueError(f"`format` must be one of {tuple(FORMATS)}; received {format!r}.")
    towers = (towers,) if isinstance(towers, str) else tuple(towers)
    if not towers or any(tower not in _TOWERS for tower in towers) or len(set(towers)) != len(towers):
        raise ValueError(f"`towers` must name 'image' and/or 'text' once each; received {towers!r}.")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"`batch_size` must be a positive int or None; received {batch_size!r}.")
    if model.dtype_policy.name != "float32":
        raise ValueError(f"Exports are made from the float32 model; this one computes in "
                         f"{model.dtype_policy.name!r}. Load it with dtype='float32'.")
    refusal = unsupported(format, keras.backend.backend(), batch_size)
    if refusal:
        raise ValueError(refusal)
    if format == "litert" and any(isinstance(layer, SparseVocabHead) and layer.num_chunks for layer in model.layers):
        model = _unchunked(model)
    os.makedirs(path, exist_ok=True)
    artefacts, manifest = {}, {"family": type(model).__name__, "format": format, "backend": keras.backend.backend(),
                               "preprocessor": model.preprocessor.get_config(), "towers": {}}
    for tower in towers:
        encoder = ImageEncoder(model) if tower == "image" else TextEncoder(model)
        signature = encoder.input_signature(batch_size)
        target = os.path.join(path, tower + FORMATS[format])
        with warnings.catch_warnings(), arange_with_start():
            # torch.export's own pytree deprecation, nothing a caller can act on
            warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
            encoder.export(target, format=format, input_signature=signature, verbose=False)
        outputs = list(model.image_embedding_keys if tower == "image" else model.text_embedding_keys)
        if format == "onnx":
            _fix_onnx(target, sorted(outputs))
        artefacts[tower] = target
        manifest["towers"][tower] = {
            "path": os.path.basename(target),
            "inputs": [{"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype} for spec in signature],
            "outputs": outputs,
        }
    with open(os.path.join(path, "export.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    return artefacts


# TensorFlow ops that tf2onnx passes through as nodes ONNX does not define: (ONNX op, then op with 1 or x).
# Erfc is the exact GELU's (1 - Erf); Log1p STAIR's log(1 + relu) (Log of 1 + x: x below float32's
# epsilon rounds to 0 there, against x, a difference far below the parity bar).
_TF_ONLY_ONNX_OPS = {"Erfc": ("Erf", "Sub"), "Log1p": ("Add", "Log")}


def _by_name(outputs):
    """`outputs`, a dict, with its entries in the order of their names: the order in which the ONNX exporters
    that do not name their outputs list them (PyTorch's in the dict's order, jax2onnx in a JAX pytree's, by
    name), so `_fix_onnx` can name them."""
    return {name: outputs[name] for name in sorted(outputs)}


def _unchunked(model):
    """`model` with its vocabulary head in one block (STAIR's `num_chunks=None`), same weights.

    The blocks run in a loop (`ops.map`) that LiteRT's own ops cannot express (it would need the Flex
    delegate); one block computes the same values with the `(B, S, V)` logits in memory.
    """
    copy = blank_copy(model, num_chunks=None)
    copy.set_weights(model.get_weights())
    return copy


def _fix_onnx(path, names):
    """Makes an exported ONNX file standard, named and whole: the nodes of `_TF_ONLY_ONNX_OPS`, in any subgraph,
    are rewritten with ONNX's own ops; the outputs PyTorch's exporter numbers and jax2onnx names after internal
    values get `names`, the encoder's entry names in the order of `_by_name`; the tensors an exporter wrote beside
    the file (jax2onnx: those over 1 MB, to `NAME.onnx.data`) are written into it, and the files they were in
    removed."""
    import onnx  # an optional dependency, as for Keras' own ONNX export

    model = onnx.load(path, load_external_data=False)
    folder = os.path.dirname(path)
    beside = {entry.value for graph in _graphs(model.graph) for tensor in graph.initializer
              for entry in tensor.external_data if entry.key == "location"}
    onnx.load_external_data_for_model(model, folder)
    _rewrite_tf_only_ops(model.graph, onnx)
    graph = model.graph
    if sorted(output.name for output in graph.output) != sorted(names):
        if len(graph.output) != len(names):
            raise RuntimeError(f"{path} has {len(graph.output)} outputs; the encoder returns {names}.")
        for output, name in zip(graph.output, names, strict=True):
            graph.node.append(onnx.helper.make_node("Identity", [output.name], [name]))
            output.name = name
    onnx.checker.check_model(model)
    onnx.save(model, path)
    for name in beside:
        os.remove(os.path.join(folder, name))


def _graphs(graph):
    """`graph` and every subgraph in it (loop bodies, branches), depth first."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in [attribute.g] * attribute.HasField("g") + list(attribute.graphs):
                yield from _graphs(subgraph)


def _rewrite_tf_only_ops(graph, onnx):
    for node in list(graph.node):
        for attribute in node.attribute:  # loop bodies and branches
            for subgraph in [attribute.g] * attribute.HasField("g") + list(attribute.graphs):
                _rewrite_tf_only_ops(subgraph, onnx)
        if node.op_type not in _TF_ONLY_ONNX_OPS:
            continue
        first, second = _TF_ONLY_ONNX_OPS[node.op_type]
        one, middle = f"{node.name}/one", f"{node.name}/{first.lower()}"
        at = list(graph.node).index(node)
        graph.node.remove(node)
        replacement = [onnx.helper.make_node("Constant", [], [one], name=one,
                                             value=onnx.helper.make_tensor(one, onnx.TensorProto.FLOAT, [], [1.0]))]
        if node.op_type == "Erfc":  # 1 - erf(x)
            replacement += [onnx.helper.make_node(first, list(node.input), [middle], name=middle),
                            onnx.helper.make_node(second, [one, middle], list(node.output), name=node.name)]
        else:  # log(1 + x)
            replacement += [onnx.helper.make_node(first, [one, *node.input], [middle], name=middle),
                            onnx.helper.make_node(second, [middle], list(node.output), name=node.name)]
        for offset, new in enumerate(replacement):
            graph.node.insert(at + offset, new)


def quantize_onnx(path):
    """An int8 copy of an exported ONNX artefact, by ONNX Runtime's own dynamic quantizer.

    Matrix-product weights become int8 (per tensor, symmetric), their inputs
    are quantized per call; the file is written beside `path` as
    `NAME.int8.onnx`, with the same input and output names.

    Args:
        path: an `.onnx` artefact `export` wrote.

    Returns:
        The int8 artefact's path.

    Raises:
        ValueError: `path` does not end in `.onnx`.

    Example:
    >>> quantize_onnx("serving/clip/image.onnx")  # doctest: +SKIP
    'serving/clip/image.int8.onnx'
    """
    if not path.endswith(FORMATS["onnx"]):
        raise ValueError(f"`path` must be an ONNX artefact (.onnx); received {path!r}.")
    from onnxruntime.quantization import QuantType, quantize_dynamic  # optional, as ONNX Runtime itself

    target = path[: -len(FORMATS["onnx"])] + ".int8" + FORMATS["onnx"]
    quantize_dynamic(path, target, weight_type=QuantType.QInt8)
    return target


def run_artefact(path, inputs):
    """Runs an artefact `export` wrote, with its format's own runtime: `{output name: numpy array}`.

    ONNX files run on ONNX Runtime, `.tflite` files on the LiteRT
    interpreter (`ai_edge_litert`), SavedModel directories on TensorFlow's
    `serving_default` signature.

    Args:
        path: an artefact path (`export`'s return value).
        inputs: `{input name: array}` (`images`, or `token_ids` and `padding_mask`).

    Returns:
        `{output name: numpy array}`: the tower's entries (`embeds`, and the family's extras).

    Example:
    >>> run_artefact("serving/clip/text.onnx", model.tokenizer(["a cat"]))["embeds"].shape  # doctest: +SKIP
    (1, D)
    """
    inputs = {name: np.asarray(value) for name, value in inputs.items()}
    if path.endswith(FORMATS["onnx"]):
        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [output.name for output in session.get_outputs()]
        return dict(zip(names, session.run(names, inputs), strict=True))
    if path.endswith(FORMATS["litert"]):
        from ai_edge_litert.interpreter import Interpreter

        runner = Interpreter(model_path=path).get_signature_runner()
        return {name: np.asarray(value) for name, value in runner(**inputs).items()}
    import tensorflow as tf

    serve = tf.saved_model.load(path).signatures["serving_default"]
    return {name: value.numpy() for name, value in serve(**{k: tf.constant(v) for k, v in inputs.items()}).items()}


def parity(model, artefacts, batch_size=2, seed=0):
    """The smallest cosine, per tower and output, between `export`'s artefacts and `model` on random inputs.

    Images are standard-normal pixels, captions random token ids with
    random lengths; each output row (a global embedding, a token's vector)
    with a non-zero reference is compared, and `mask` outputs must match
    exactly (cosine 1.0, else 0.0).

    Args:
        model: the model the artefacts were exported from.
        artefacts: `export`'s `{tower: path}`.
        batch_size: rows of the random batch (the artefacts' fixed batch, if
            they have one).
        seed: of the random inputs.

    Returns:
        `{tower: {output: smallest cosine}}`.

    Example:
    >>> parity(model, vlzoo.export(model, "serving/clip", format="onnx"))  # doctest: +SKIP
    {'image': {'embeds': ...}, 'text': {'embeds': ...}}
    """
    rng = np.random.default_rng(seed)
    size, length = model.vision.image_size, model.text.sequence_length
    lengths = rng.integers(2, length + 1, size=batch_size)
    mask = np.arange(length)[None] < lengths[:, None]
    inputs = {
        "image": {"images": rng.normal(size=(batch_size, size, size, 3)).astype("float32")},
        "text": {"token_ids": np.where(mask, rng.integers(1, model.text.vocabulary_size, size=mask.shape), 0)
                 .astype("int32"), "padding_mask": mask},
    }
    found = {}
    for tower, path in artefacts.items():
        if tower == "image":
            want = model.encode_image(inputs["image"]["images"], normalize=True)
        else:
            want = model.encode_text(inputs["text"], normalize=True)
        got = run_artefact(path, inputs[tower])
        found[tower] = {name: _smallest_cosine(got[name], keras.ops.convert_to_numpy(value))
                        for name, value in want.items()}
    return found


def _smallest_cosine(got, want):
    if want.dtype == bool:
        return float(np.array_equal(got, want))
    got, want = (np.asarray(a, np.float64).reshape(-1, a.shape[-1]) for a in (got, want))
    norms = np.linalg.norm(want, axis=-1)
    kept = norms > 0
    if not kept.any():
        return float(np.array_equal(got, want))
    cosine = (got * want).sum(-1)[kept] / (np.linalg.norm(got, axis=-1)[kept] * norms[kept])
    return float(cosine.min())
