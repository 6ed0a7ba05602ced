"""Layers against independent numpy references; serialisation; interpolation."""

import inspect

import keras
import numpy as np
import pytest
import reference_towers as ref
from backend_utils import value_and_grad
from conftest import to_numpy

from vlzoo import layers
from vlzoo._backends.keras_internals import calls_directly
from vlzoo.layers import embedding, heads, llip, sparo, sparse_vocab, text, transformer, vision
from vlzoo.layers.transformer import _flash_attention, _scannable, apply_blocks, scan_by_default, transformer_stack


def _randomise(layer, seed=0, scale=0.2):
    """Gives every weight (biases and norms included) non-trivial values."""
    rng = np.random.default_rng(seed)
    for v in layer.weights:
        base = 1.0 if v.name == "gamma" else 0.0
        v.assign(base + scale * rng.normal(size=v.shape).astype("float32"))


def test_quick_gelu_golden():
    # x * sigmoid(1.702 x) at x = 1: 1 / (1 + e^-1.702) = 0.845795...
    assert abs(float(to_numpy(layers.quick_gelu(keras.ops.convert_to_tensor(1.0)))) - 1 / (1 + np.exp(-1.702))) < 1e-6


def test_unknown_activation_is_named():
    with pytest.raises(ValueError, match="activation"):
        layers.TransformerBlock(8, 2, 16, activation="relu6")


@pytest.mark.parametrize("activation", ["quick_gelu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("causal", [False, True])
def test_transformer_block_matches_numpy(activation, causal):
    block = layers.TransformerBlock(16, 4, 32, activation=activation, layer_norm_epsilon=1e-5)
    block.build((None, 5, 16))
    _randomise(block)
    x = np.random.default_rng(1).normal(size=(2, 5, 16)).astype("float32")
    got = to_numpy(block(x, is_causal=causal))
    mask = np.tril(np.ones((5, 5), bool))[None].repeat(2, 0) if causal else None
    np.testing.assert_allclose(got, ref.block(x.astype(np.float64), block, mask), atol=2e-5)


def _stack(num_layers=3, seed=0):
    blocks = transformer_stack(16, num_layers, 4, 32, "quick_gelu", 1e-5, "float32")
    for i, block in enumerate(blocks):
        block.build((None, 5, 16))
        _randomise(block, seed=seed + i)
    return blocks


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"mask": True}])
def test_scanned_blocks_match_unrolled_values_and_gradients(kwargs):
    # `apply_blocks(scan=True)` runs one block over the stacked weights with keras.ops.scan (JAX's default):
    # the same function as the blocks one after another, with the same gradients for every block's weights,
    # without and with remat. The unrolled reference is computed once for both (it does not depend on remat).
    blocks = _stack()
    variables = [v for block in blocks for v in block.trainable_variables]
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    probe = keras.ops.convert_to_tensor(rng.normal(size=(2, 5, 16)).astype("float32"))
    if kwargs.get("mask"):
        lengths = np.array([5, 3])
        kwargs = {"attention_mask": keras.ops.convert_to_tensor(
            (np.arange(5)[None, None, :] < lengths[:, None, None]).repeat(5, 1))}

    def loss(scan, remat):
        def fn(x, *weights):
            with keras.StatelessScope(state_mapping=list(zip(variables, weights))):
                return keras.ops.sum(apply_blocks(blocks, x, remat=remat, scan=scan, **kwargs) * probe)
        return fn

    weights = [to_numpy(v) for v in variables]
    value, grads = value_and_grad(loss(False, False), x, *weights, jit=True)  # the reference: unrolled, no remat
    assert len(grads) == 1 + 3 * len(blocks[0].trainable_variables)
    for remat in (False, True):
        scanned_value, scanned_grads = value_and_grad(loss(True, remat), x, *weights, jit=True)
        np.testing.assert_allclose(scanned_value, value, rtol=1e-5, err_msg=f"remat={remat}")
        for got, want in zip(scanned_grads, grads):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"remat={remat}")


def test_blocks_that_differ_are_not_scanned():
    blocks = _stack()
    assert _scannable(blocks)
    blocks[1].trainable = False  # a frozen block: its weights are not the others' kind
    assert not _scannable(blocks)
    assert not _scannable(blocks[:1])
    x = np.random.default_rng(2).normal(size=(2, 5, 16)).astype("float32")
    want = x
    for block in blocks:
        want = to_numpy(block(want))
    np.testing.assert_allclose(to_numpy(apply_blocks(blocks, x, scan=True)), want, atol=1e-6)


def test_blocks_scan_by_default_only_in_jax_training_on_the_cpu(monkeypatch):
    # XLA:CPU trains a scanned stack faster; on a GPU the unrolled stack is faster and holds less
    # (H100, ViT-B/16: 0.133 s / 27.2 GB unrolled against 0.212 s / 48.2 GB scanned, docs/benchmarks.md).
    on_jax = keras.backend.backend() == "jax"
    assert scan_by_default(training=True) is on_jax  # the suite computes on the CPU
    assert not scan_by_default(training=False) and not scan_by_default(training=None)
    monkeypatch.setattr(keras.distribution, "list_devices", lambda *a: ["gpu:0", "gpu:1"])
    assert not scan_by_default(training=True)


def _block_through_every_call(block, x):
    """`block(x)` with every sublayer entered through `Layer.__call__` (what `call_sublayer` skips)."""
    attention = block.attention

    def dense(layer, y):
        return layer(y)

    h = block.ln_1(x)
    b, n = h.shape[0], h.shape[1]
    heads = [keras.ops.reshape(dense(d, h), (b, n, attention.num_heads, attention.head_dim))
             for d in (attention.query, attention.key, attention.value)]
    if keras.backend.backend() == "tensorflow" and heads[0].dtype != "float32":
        heads[:2] = [keras.ops.cast(t, "float32") for t in heads[:2]]
    out = keras.ops.dot_product_attention(*heads, scale=attention.head_dim**-0.5)
    x = x + attention.output_dense(keras.ops.reshape(out, (b, n, attention.hidden_dim)))
    return x + block.mlp.fc2(block.mlp._act(block.mlp.fc1(block.ln_2(x))))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "bfloat16"])
@pytest.mark.parametrize("lora", [False, True])
def test_block_skipping_sublayer_calls_matches_every_call(policy, lora):
    # `call_sublayer` runs a sublayer's `call` directly only where `__call__` would change nothing: the block's
    # output is bit for bit the one of its sublayers each entered through `__call__`, under every dtype policy
    # (LayerNorm keeps float32 weights under mixed_bfloat16, so it goes through `__call__` there) and with LoRA.
    block = layers.TransformerBlock(16, 4, 32, activation="quick_gelu", dtype=policy)
    block.build((None, 5, 16))
    _randomise(block)
    if lora:
        for dense in (block.attention.query, block.attention.value, block.mlp.fc1):
            dense.enable_lora(2)
            dense.lora_kernel_b.assign(0.1 * np.ones(dense.lora_kernel_b.shape, "float32"))
    x = keras.ops.cast(np.random.default_rng(1).normal(size=(2, 5, 16)).astype("float32"), block.compute_dtype)
    got = to_numpy(keras.ops.cast(block(x), "float32"))
    want = to_numpy(keras.ops.cast(_block_through_every_call(block, x), "float32"))
    np.testing.assert_array_equal(got, want)


def test_sublayers_are_called_directly_only_where_call_changes_nothing():
    dense = keras.layers.Dense(4)
    dense.build((None, 3))
    x = keras.ops.ones((2, 3))
    assert calls_directly(dense, (x,))
    assert not calls_directly(dense, (keras.ops.cast(x, "float16"),))  # `__call__` would cast it
    assert not calls_directly(dense, (keras.KerasTensor((2, 3)),))  # symbolic: `__call__` records a node
    assert not calls_directly(dense, (np.ones((2, 3), "float32"),))  # `__call__` converts it
    assert not calls_directly(keras.layers.Dense(4), (x,))  # not built
    mixed = keras.layers.LayerNormalization(dtype="mixed_bfloat16")
    mixed.build((None, 3))
    assert not calls_directly(mixed, (keras.ops.cast(x, "bfloat16"),))  # `__call__` opens an autocast scope
    dense.quantize("int8")
    assert not calls_directly(dense, (x,))  # `__call__` takes the quantized call


def test_layer_norm_epsilon_is_used():
    # A near-constant input makes the epsilon dominate the variance: 1e-5 and 1e-3
    # (Keras' default) then give clearly different outputs.
    x = np.array([[[1.0, 1.001, 0.999, 1.0]]], "float32")
    outs = []
    for eps in (1e-5, 1e-3):
        block = layers.TransformerBlock(4, 1, 8, layer_norm_epsilon=eps)
        block.build((None, 1, 4))
        _randomise(block)
        outs.append(to_numpy(block(x)))
        np.testing.assert_allclose(outs[-1], ref.block(x.astype(np.float64), block), atol=2e-5)
    assert np.abs(outs[0] - outs[1]).max() > 1e-2


@pytest.mark.parametrize(
    "config",
    [
        dict(pooling="cls", num_prefix_tokens=1, use_pre_norm=True, activation="quick_gelu"),
        dict(pooling="mean", num_prefix_tokens=1, use_pre_norm=True, activation="gelu"),
        dict(pooling="map", num_prefix_tokens=0, use_pre_norm=False, patch_bias=True, layer_norm_epsilon=1e-6),
        dict(pooling="cls", num_prefix_tokens=3, projection_bias=True),
        dict(pooling="map", num_prefix_tokens=0, output_dim=None),
    ],
)
def test_vision_transformer_matches_numpy(config):
    config = {"output_dim": 12, **config}
    vit = layers.VisionTransformer(16, 4, 16, 2, 4, 32, **config)
    vit.build()
    _randomise(vit)
    images = np.random.default_rng(2).normal(size=(2, 16, 16, 3)).astype("float32")
    out = vit(images)
    pooled, tokens = ref.vision_forward(images, vit)
    np.testing.assert_allclose(to_numpy(out["tokens"]), tokens, atol=3e-5)
    np.testing.assert_allclose(to_numpy(out["pooled"]), pooled, atol=3e-5)


@pytest.mark.parametrize(
    "config",
    [
        dict(causal=True, pooling="eot"),
        dict(causal=False, pooling="last", projection_bias=True),
        dict(causal=False, pooling="mean", use_padding_mask=True),
        dict(causal=True, pooling="eot", use_padding_mask=True, activation="quick_gelu"),
        dict(causal=False, pooling="first", output_dim=None),
    ],
)
def test_text_transformer_matches_numpy(config):
    config = {"output_dim": 12, **config}
    tower = layers.TextTransformer(50, 8, 16, 2, 4, 32, **config)
    tower.build()
    _randomise(tower)
    ids = np.array([[5, 7, 49, 0, 0, 0, 0, 0], [3, 4, 5, 6, 7, 8, 9, 49]], "int32")
    mask = ids > 0
    mask[1] = True
    out = tower(ids, mask)
    pooled, tokens = ref.text_forward(ids, mask, tower)
    np.testing.assert_allclose(to_numpy(out["tokens"]), tokens, atol=3e-5)
    np.testing.assert_allclose(to_numpy(out["pooled"]), pooled, atol=3e-5)


def test_text_shorter_than_context_uses_leading_positions():
    tower = layers.TextTransformer(50, 8, 16, 1, 4, 32, output_dim=None, causal=True)
    tower.build()
    ids = np.array([[1, 2, 49, 0, 0, 0, 0, 0]], "int32")
    full = to_numpy(tower(ids, ids > 0)["tokens"])
    short = to_numpy(tower(ids[:, :3], ids[:, :3] > 0)["tokens"])
    # Causal attention: the first three positions do not see the padding after them.
    np.testing.assert_allclose(short, full[:, :3], atol=1e-5)


def test_padding_invariance_with_padding_mask():
    tower = layers.TextTransformer(50, 8, 16, 2, 4, 32, output_dim=8, causal=False, pooling="mean", use_padding_mask=True)
    tower.build()
    _randomise(tower)
    ids = np.array([[5, 7, 9, 0, 0, 0, 0, 0], [5, 7, 9, 31, 17, 2, 8, 4]], "int32")
    mask = np.array([[1, 1, 1, 0, 0, 0, 0, 0]] * 2, bool)
    out = to_numpy(tower(ids, mask)["pooled"])
    np.testing.assert_allclose(out[0], out[1], atol=1e-5)


def test_bicubic_matrix_matches_torch_interpolate():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    for src, dst in [(7, 14), (14, 7), (4, 6), (6, 4), (5, 5)]:
        grid = rng.normal(size=(src, src)).astype("float32")
        expected = torch.nn.functional.interpolate(
            torch.from_numpy(grid)[None, None], size=(dst, dst), mode="bicubic", align_corners=False
        )[0, 0].numpy()
        m = layers.bicubic_resize_matrix(src, dst)
        np.testing.assert_allclose(m @ grid @ m.T, expected, atol=1e-5)
    np.testing.assert_allclose(layers.bicubic_resize_matrix(5, 5), np.eye(5), atol=1e-7)


def test_position_embedding_resizes_patch_rows_only():
    pos = layers.PositionEmbedding(8, grid_size=(4, 4), num_prefix_tokens=2)
    pos.build()
    table = to_numpy(pos.embeddings)
    resized = to_numpy(pos.resized((6, 6)))
    assert resized.shape == (2 + 36, 8)
    np.testing.assert_array_equal(resized[:2], table[:2])
    m = layers.bicubic_resize_matrix(4, 6)
    grid = table[2:].reshape(4, 4, 8)
    np.testing.assert_allclose(resized[2:].reshape(6, 6, 8), np.einsum("ih,hwd,jw->ijd", m, grid, m), atol=1e-5)


def test_vit_accepts_other_resolution():
    vit = layers.VisionTransformer(16, 4, 16, 1, 4, 32, output_dim=8)
    vit.build()
    out = vit(np.zeros((1, 24, 24, 3), "float32"))
    assert tuple(out["tokens"].shape) == (1, 1 + 36, 16)


@pytest.mark.parametrize(
    "make",
    [
        lambda: layers.TransformerBlock(16, 4, 32, activation="quick_gelu", layer_norm_epsilon=1e-6, num_layers=3),
        lambda: layers.VisionTransformer(16, 4, 16, 1, 4, 32, output_dim=8, pooling="map", num_prefix_tokens=0),
        lambda: layers.TextTransformer(50, 8, 16, 1, 4, 32, output_dim=8, causal=False, pooling="last"),
        lambda: layers.MAPHead(16, 4, 32),
        lambda: layers.PositionEmbedding(16, grid_size=(2, 2), num_prefix_tokens=1),
        lambda: layers.PatchEmbedding(16, 4, use_bias=True),
    ],
)
def test_get_config_round_trip(make):
    layer = make()
    clone = type(layer).from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


def test_flash_attention_only_for_lengths_cudnns_backward_takes():
    # On JAX, Keras would pick cuDNN's flash attention on a GPU after an inference-only check; its
    # backward pass refuses lengths that are not multiples of 64 (a ViT-B/16's 197 tokens, CLIP's 77).
    def heads(length):
        return keras.KerasTensor((2, length, 4, 8))

    jax = keras.backend.backend() == "jax"
    assert _flash_attention(heads(197), heads(197)) is (False if jax else None)
    assert _flash_attention(heads(256), heads(77)) is (False if jax else None)
    assert _flash_attention(heads(256), heads(128)) is None


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the padded cuDNN route is JAX's")
@pytest.mark.parametrize("causal", [False, True])
def test_padded_attention_is_the_unpadded_attention(causal):
    # Padded to 256 / 128 tokens with the padding outside the sequence lengths, the attention of 197 (77)
    # tokens and its gradient are the unpadded ones (XLA's implementation, which computes on any device what
    # cuDNN's does on a GPU): padded keys get zero weight (exp of the mask value underflows), padded queries
    # are dropped. Against numpy's softmax attention, in float64.
    import jax

    from vlzoo._backends.jax import kernels as _jax

    length = 77 if causal else 197
    rng = np.random.default_rng(0)
    q, k, v, weight = (rng.normal(size=(2, length, 3, 8)).astype("float32") for _ in range(4))
    logits = np.einsum("bthd,bshd->bhts", q.astype("float64"), k) / np.sqrt(8)
    if causal:
        logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    want = np.einsum("bhts,bshd->bthd", probs / probs.sum(-1, keepdims=True), v)

    def attention(q, k, v, padded):
        if padded:
            return _jax.padded_attention(q, k, v, 8**-0.5, is_causal=causal, implementation="xla")
        return jax.nn.dot_product_attention(q, k, v, scale=8**-0.5, is_causal=causal, implementation="xla")

    np.testing.assert_allclose(attention(q, k, v, True), want, atol=2e-6)
    grads = [jax.grad(lambda *x, p=padded: (attention(*x, p) * weight).sum(), argnums=(0, 1, 2))(q, k, v)
             for padded in (True, False)]
    for got, unpadded in zip(*grads):
        np.testing.assert_allclose(got, unpadded, atol=2e-6)
    # Off a GPU (and in float32, or under a mask) the layer keeps Keras' attention.
    half = jax.numpy.asarray(q, "bfloat16")
    assert not _jax.padding_helps(half, half, None)
    # Where JAX refuses cuDNN's call (here: no cuDNN on the CPU, raised as the call is traced, also under
    # `grad`), the route answers None and the layer keeps Keras' attention instead of failing.
    with pytest.raises(RuntimeError, match="cuDNN"):
        _jax.padded_attention(half, half, half, 8**-0.5)
    assert _jax.cudnn_padded_attention(half, half, half, 8**-0.5, is_causal=causal) is None
    refused = []
    jax.grad(lambda x: refused.append(_jax.cudnn_padded_attention(x, x, x, 8**-0.5) is None) or x.sum())(half)
    assert refused == [True]


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="XLA:CPU's float32-accumulated route is JAX's")
def test_bfloat16_products_accumulated_in_float32_on_jax():
    # The dense layers' and the attention's bfloat16 products on JAX's CPU ask XLA for float32 sums (its fast
    # bfloat16 kernels), rounded to bfloat16 as Keras' own products are: within one bfloat16 rounding of Keras'
    # Dense and of jax.nn.dot_product_attention (the same arithmetic, summed in another order), and within the
    # bfloat16 roundings of the weights and output of numpy's float64 attention.
    import jax
    import jax.numpy as jnp

    from vlzoo._backends.jax import kernels as _jax

    rng = np.random.default_rng(0)
    ulp = 2.0**-7  # bfloat16's spacing at [1, 2)
    for policy in ("bfloat16", "mixed_bfloat16"):
        dense = keras.layers.Dense(24, dtype=policy)
        dense.build((None, 64))
        _randomise(dense)
        x = jnp.asarray(rng.normal(size=(3, 5, 64)), jnp.bfloat16)
        want = np.asarray(dense(x), "float32")
        assert _jax.accumulates_in_float32(dense, x)
        got = np.asarray(_jax.dense(dense, x), "float32")  # a float32 kernel (mixed) is cast as autocast would
        assert got.dtype == want.dtype and np.all(np.abs(got - want) <= ulp * np.maximum(np.abs(want), 1.0))
    dense.enable_lora(2)
    assert not _jax.accumulates_in_float32(dense, x)  # LoRA and int8 keep Keras' call

    q, k, v = (jnp.asarray(rng.normal(size=(2, 9, 3, 8)), jnp.bfloat16) for _ in range(3))
    mask = np.ones((2, 1, 9, 9), bool)
    mask[0, :, :, 6:] = False  # padded keys
    mask[1, :, 4] = False  # a query row that may attend to nothing: finite, as Keras' masking
    got = np.asarray(_jax.float32_attention(q, k, v, 8**-0.5, mask=mask, is_causal=True), "float32")
    keras_attention = np.asarray(jax.nn.dot_product_attention(q, k, v, mask=mask, scale=8**-0.5, is_causal=True,
                                                               implementation="xla"), "float32")
    assert np.all(np.isfinite(got)) and np.all(np.abs(got - keras_attention) <= ulp * np.maximum(np.abs(got), 1.0))
    q64, k64, v64 = (np.asarray(a, "float64") for a in (q, k, v))
    logits = np.einsum("bthd,bshd->bhts", q64, k64) / np.sqrt(8)
    allowed = mask & np.tril(np.ones((9, 9), bool))
    logits = np.where(allowed, logits, -1e30)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    want = np.einsum("bhts,bshd->bthd", weights / weights.sum(-1, keepdims=True), v64)
    # Each weight is rounded to bfloat16 (relative 2^-9, weights summing to 1) and so is the output.
    bound = 2.0**-9 * np.abs(v64).max() + 2.0**-9 * np.abs(want) + 1e-6
    assert np.all(np.abs(got - want) <= bound)


def test_token_embedding_takes_adams_step_for_a_repeated_token():
    # Token 1 is looked up twice, token 3 once: the table's gradient is 2 and 1 on their rows, and Adam's
    # first step is lr * g / (|g| + eps), lr in every entry of both rows. Keras' own Embedding on TensorFlow
    # moves row 1 by sqrt(2) lr: its Adam squares the two looked-up rows before summing them.
    layer = layers.TokenEmbedding(4, 2, embeddings_initializer="zeros")
    inputs = keras.Input((3,), dtype="int32")
    model = keras.Model(inputs, layer(inputs))
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss=lambda y, p: keras.ops.sum(p))
    model.fit(np.array([[1, 1, 3]]), np.zeros((1,)), epochs=1, verbose=0)
    np.testing.assert_allclose(to_numpy(layer.embeddings), [[0, 0], [-0.1, -0.1], [0, 0], [-0.1, -0.1]], atol=1e-5)
    assert isinstance(layer, keras.layers.Embedding) and layers.TokenEmbedding.from_config(layer.get_config()).input_dim == 4


def test_every_layer_class_is_registered_for_saving():
    # `.keras` files name layers by their registered name: an unregistered one loads nowhere.
    classes = {cls for module in (embedding, heads, llip, sparo, sparse_vocab, text, transformer, vision)
               for _, cls in inspect.getmembers(module, inspect.isclass)
               if issubclass(cls, keras.layers.Layer) and cls.__module__ == module.__name__}
    assert len(classes) >= 10
    for cls in classes:
        assert keras.saving.get_registered_object(f"vlzoo>{cls.__name__}") is cls, cls.__name__
