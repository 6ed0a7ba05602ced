"""Pre-LayerNorm transformer blocks shared by every tower."""

import functools
import math

import keras
from keras import ops

from vlzoo import kernels
from vlzoo._backends import switches
from vlzoo._backends.keras_internals import call_sublayer
from vlzoo.layers.rotary import apply_rotary

ACTIVATIONS = ("quick_gelu", "gelu", "gelu_tanh", "relu", "swiglu")


def quick_gelu(x):
    """OpenAI CLIP's sigmoid approximation of GELU: `x * sigmoid(1.702 x)`.

    >>> float(quick_gelu(keras.ops.convert_to_tensor(0.0)))
    0.0
    """
    return x * ops.sigmoid(1.702 * x)


def swiglu(x):
    """SwiGLU's gate of the two halves of the last axis: `silu(a) * b` for `x = [a, b]`, `(..., 2 I)` ->
    `(..., I)` (DINOv2's `SwiGLUFFN`).

    >>> swiglu(keras.ops.ones((2, 6))).shape
    (2, 3)
    """
    gate, value = ops.split(x, 2, axis=-1)
    return ops.silu(gate) * value


def get_activation(name):
    """Returns the MLP activation for `name` (one of `ACTIVATIONS`); ValueError for another name."""
    if name == "quick_gelu":
        return quick_gelu
    if name == "gelu":
        return lambda x: ops.gelu(x, approximate=False)
    if name == "gelu_tanh":
        return lambda x: ops.gelu(x, approximate=True)
    if name == "relu":
        return ops.relu
    if name == "swiglu":
        return swiglu
    raise ValueError(
        f"`activation` must be one of {ACTIVATIONS}; received {name!r}."
    )


def _dense(layer, x):
    """`call_sublayer(layer, x)` for a `keras.layers.Dense`, through `vlzoo.kernels.dense` where the backend
    has a faster kernel (JAX on the CPU in bfloat16)."""
    out = kernels.dense(layer, x)
    return call_sublayer(layer, x) if out is None else out


def _normal(std):
    return keras.initializers.RandomNormal(stddev=std)


def _float32_logits_operands(q, k):
    """`q` and `k` cast to float32, so that the attention logits `q k^T` are formed in float32.

    For Keras' TensorFlow attention, which forms the logits in the inputs' dtype
    (`vlzoo._backends.switches.needs_float32_logits`): products of bfloat16 numbers are exact in
    float32, so these operands give the float32 logits JAX and PyTorch form from the same bfloat16
    inputs. The attention then runs in float32 and the output projection casts back. Why:
    docs/precision.md.
    """
    return ops.cast(q, "float32"), ops.cast(k, "float32")


def _flash_attention(q, k):
    """`flash_attention` for `ops.dot_product_attention`: None (Keras decides) unless JAX would pick
    cuDNN's flash attention for lengths its backward pass refuses
    (`vlzoo._backends.switches.refuses_flash_attention`), then False. (Unmasked half-precision
    attention on a GPU does not come here: `vlzoo.kernels` pads it for cuDNN.)
    """
    lengths = (q.shape[1], k.shape[1])
    if switches.refuses_flash_attention(lengths):
        return False
    return None


@keras.saving.register_keras_serializable(package="vlzoo")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention with separate q/k/v projections (with biases).

    Queries attend over `context` (self-attention when `context` is None)
    through `keras.ops.dot_product_attention`. On JAX (`vlzoo.kernels`): on a GPU, in
    half precision without a mask, through cuDNN's fused attention on inputs
    padded to a multiple of 64 tokens; on the CPU in bfloat16, with its
    products accumulated in float32 (XLA:CPU's fast bfloat16 route).

    Args:
        hidden_dim: width D of queries, keys and values.
        num_heads: number of heads; must divide `hidden_dim`.
        use_bias: whether the four projections have biases.

    Call arguments:
        x: `(B, N, D)` queries.
        context: optional `(B, M, D)` keys/values; defaults to `x`.
        attention_mask: optional bool `(B, N, M)` or `(B, 1, N, M)`;
            True = may attend.
        is_causal: bool, apply a causal mask.
        rotary: optional `(sin, cos)`, each `(M, head_dim)` (`vlzoo.layers.rotary.rotary_tables_2d`):
            the last M query and key tokens are rotated by these angles after their projections
            (self-attention only; the tokens before them, a class token, are not).

    Returns:
        `(B, N, D)`.

    Raises:
        ValueError: `num_heads` does not divide `hidden_dim`.

    Example:
    >>> attention = MultiHeadAttention(64, 4)
    >>> attention.build((2, 10, 64), (2, 5, 64))
    >>> attention(keras.ops.ones((2, 10, 64)), context=keras.ops.ones((2, 5, 64))).shape
    (2, 10, 64)
    """

    def __init__(self, hidden_dim, num_heads, use_bias=True, init_std=None, **kwargs):
        super().__init__(**kwargs)
        if hidden_dim % num_heads:
            raise ValueError(
                f"`num_heads` ({num_heads}) must divide `hidden_dim` ({hidden_dim})."
            )
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.head_dim = hidden_dim // num_heads
        self.use_bias = use_bias
        self.init_std = init_std
        std = init_std if init_std is not None else hidden_dim**-0.5
        dense = dict(use_bias=use_bias, dtype=self.dtype_policy)
        self.query = keras.layers.Dense(hidden_dim, kernel_initializer=_normal(std), name="query", **dense)
        self.key = keras.layers.Dense(hidden_dim, kernel_initializer=_normal(std), name="key", **dense)
        self.value = keras.layers.Dense(hidden_dim, kernel_initializer=_normal(std), name="value", **dense)
        self.output_dense = keras.layers.Dense(hidden_dim, kernel_initializer=_normal(std), name="output", **dense)

    def build(self, input_shape, context_shape=None):
        context_shape = context_shape or input_shape
        self.query.build(input_shape)
        self.key.build(context_shape)
        self.value.build(context_shape)
        self.output_dense.build(input_shape)
        self.built = True

    def _split_heads(self, x):
        b, n = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (b, n, self.num_heads, self.head_dim))

    def call(self, x, context=None, attention_mask=None, is_causal=False, rotary=None):
        context = x if context is None else context
        q = self._split_heads(_dense(self.query, x))
        k = self._split_heads(_dense(self.key, context))
        v = self._split_heads(_dense(self.value, context))
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if attention_mask is not None and len(attention_mask.shape) == 3:
            attention_mask = ops.expand_dims(attention_mask, 1)
        if switches.needs_float32_logits(q.dtype):
            q, k = _float32_logits_operands(q, k)
        scale = 1.0 / math.sqrt(self.head_dim)
        out = kernels.attention(q, k, v, scale, mask=attention_mask, is_causal=is_causal)
        if out is None:
            out = ops.dot_product_attention(
                q, k, v, mask=attention_mask, is_causal=is_causal, scale=scale,
                flash_attention=_flash_attention(q, k),
            )
        b, n = ops.shape(out)[0], ops.shape(out)[1]
        return _dense(self.output_dense, ops.reshape(out, (b, n, self.hidden_dim)))

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_dim=self.hidden_dim, num_heads=self.num_heads,
            use_bias=self.use_bias, init_std=self.init_std,
        )
        return config


@keras.saving.register_keras_serializable(package="vlzoo")
class MLP(keras.layers.Layer):
    """Two-layer feed-forward block `fc2(act(fc1(x)))`.

    Args:
        hidden_dim: input and output width D.
        intermediate_dim: inner width I.
        activation: one of `"quick_gelu"`, `"gelu"` (exact), `"gelu_tanh"`, `"relu"`, or `"swiglu"`:
            `fc1` then has `2 I` outputs, gated by `swiglu` to I.

    Call: `(..., D)` -> `(..., D)`.

    Raises:
        ValueError: an unknown `activation`.
    """

    def __init__(self, hidden_dim, intermediate_dim, activation="gelu", fc_std=None, proj_std=None, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.fc_std = fc_std
        self.proj_std = proj_std
        self._act = get_activation(activation)
        self.fc1 = keras.layers.Dense(
            intermediate_dim * (2 if activation == "swiglu" else 1), dtype=self.dtype_policy, name="fc1",
            kernel_initializer=_normal(fc_std if fc_std is not None else (2 * hidden_dim) ** -0.5),
        )
        self.fc2 = keras.layers.Dense(
            hidden_dim, dtype=self.dtype_policy, name="fc2",
            kernel_initializer=_normal(proj_std if proj_std is not None else hidden_dim**-0.5),
        )

    def build(self, input_shape):
        self.fc1.build(input_shape)
        self.fc2.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))
        self.built = True

    def call(self, x):
        return _dense(self.fc2, self._act(_dense(self.fc1, x)))

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_dim=self.hidden_dim, intermediate_dim=self.intermediate_dim,
            activation=self.activation, fc_std=self.fc_std, proj_std=self.proj_std,
        )
        return config


@keras.saving.register_keras_serializable(package="vlzoo")
class TransformerBlock(keras.layers.Layer):
    """Pre-LN residual block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`.

    Args:
        hidden_dim: width D.
        num_heads: attention heads.
        intermediate_dim: MLP inner width (CLIP and SigLIP use 4 D).
        activation: MLP activation (`"quick_gelu"` for OpenAI CLIP, `"gelu"`
            exact for open_clip/SigLIP).
        layer_norm_epsilon: LayerNorm epsilon (1e-5 CLIP, 1e-6 SigLIP; note
            Keras' default is 1e-3).
        num_layers: depth of the stack this block sits in, for open_clip's
            depth-scaled initialisation.
        layer_scale: initial value of LayerScale's per-channel factors of the attention and MLP outputs
            (`ls_1`, `ls_2`, `(D,)`: CaiT, DINOv2); None (default): none.

    Call arguments:
        x: `(B, N, D)`.
        attention_mask: optional bool `(B, N, N)`, True = may attend.
        is_causal: bool.
        rotary: optional `(sin, cos)` of the attention's rotary embedding (`MultiHeadAttention`).

    Returns:
        `(B, N, D)`.

    Example:
    >>> block = TransformerBlock(64, 4, 256)
    >>> block(keras.ops.ones((2, 10, 64))).shape
    (2, 10, 64)
    """

    def __init__(
        self, hidden_dim, num_heads, intermediate_dim, activation="gelu",
        layer_norm_epsilon=1e-5, num_layers=1, layer_scale=None, **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.num_layers = num_layers
        self.layer_scale = layer_scale
        proj_std = hidden_dim**-0.5 * (2 * num_layers) ** -0.5
        ln = dict(epsilon=layer_norm_epsilon, dtype=self.dtype_policy)
        self.ln_1 = keras.layers.LayerNormalization(name="ln_1", **ln)
        self.attention = MultiHeadAttention(hidden_dim, num_heads, dtype=self.dtype_policy, name="attention")
        self.ln_2 = keras.layers.LayerNormalization(name="ln_2", **ln)
        self.mlp = MLP(
            hidden_dim, intermediate_dim, activation, proj_std=proj_std,
            dtype=self.dtype_policy, name="mlp",
        )

    def build(self, input_shape):
        for layer in (self.ln_1, self.ln_2, self.mlp):
            layer.build(input_shape)
        self.attention.build(input_shape)
        if self.layer_scale is not None:
            scale = keras.initializers.Constant(self.layer_scale)
            self.ls_1 = self.add_weight(name="ls_1", shape=(self.hidden_dim,), initializer=scale)
            self.ls_2 = self.add_weight(name="ls_2", shape=(self.hidden_dim,), initializer=scale)
        self.built = True

    def call(self, x, attention_mask=None, is_causal=False, rotary=None):
        attended = call_sublayer(
            self.attention, call_sublayer(self.ln_1, x), attention_mask=attention_mask, is_causal=is_causal,
            rotary=rotary,
        )
        if self.layer_scale is not None:
            attended = attended * ops.cast(self.ls_1, attended.dtype)
        x = x + attended
        update = call_sublayer(self.mlp, call_sublayer(self.ln_2, x))
        if self.layer_scale is not None:
            update = update * ops.cast(self.ls_2, update.dtype)
        return x + update

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_dim=self.hidden_dim, num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim, activation=self.activation,
            layer_norm_epsilon=self.layer_norm_epsilon, num_layers=self.num_layers,
        )
        if self.layer_scale is not None:  # absent from the blocks without LayerScale, as before it existed
            config["layer_scale"] = self.layer_scale
        return config


def transformer_stack(hidden_dim, num_layers, num_heads, intermediate_dim, activation, layer_norm_epsilon, dtype,
                      layer_scale=None):
    """`num_layers` `TransformerBlock`s named `block_0`, `block_1`, ...

    >>> [block.name for block in transformer_stack(64, 2, 4, 256, "gelu", 1e-5, "float32")]
    ['block_0', 'block_1']
    """
    return [
        TransformerBlock(
            hidden_dim, num_heads, intermediate_dim, activation, layer_norm_epsilon,
            num_layers=num_layers, layer_scale=layer_scale, dtype=dtype, name=f"block_{i}",
        )
        for i in range(num_layers)
    ]


def apply_blocks(blocks, x, remat=False, scan=None, training=None, **kwargs):
    """Runs `x` through `blocks` in order, each optionally under `keras.remat`.

    With `remat=True` every block's call is wrapped in `keras.remat`: its
    intermediate activations are not kept for the backward pass but
    recomputed from the block's input, so training memory grows with the
    number of blocks times `(B, N, D)` instead of with everything inside
    them. Values and gradients are the same as without it.

    With `scan=True` the blocks' weights are stacked and one block's
    computation runs over them with `keras.ops.scan` (as big_vision and
    MaxText scan their layers): the same function, compiled once instead of
    once per block, with the same values. `scan=None` scans when training on
    JAX on the CPU (`scan_by_default`); inference, the GPU and the other
    backends run the blocks one after another, and so do blocks that differ
    in configuration or trainability. Why, with the figures:
    docs/workarounds.md and docs/benchmarks.md.

    Args:
        blocks: list of `TransformerBlock`s (as `transformer_stack` returns).
        x: `(B, N, D)` tokens.
        remat: recompute each block's activations in the backward pass.
        scan: scan the stacked blocks (`None`: `scan_by_default(training)`).
        training: whether this is a training call (for `scan=None`).
        **kwargs: call arguments of every block (`attention_mask`, `is_causal`, `rotary`).

    Returns:
        `(B, N, D)`.

    Example:
    >>> blocks = transformer_stack(64, 2, 4, 256, "gelu", 1e-5, "float32")
    >>> apply_blocks(blocks, keras.ops.ones((2, 10, 64)), remat=True).shape
    (2, 10, 64)
    """
    if scan is None:
        scan = scan_by_default(training)
    if scan and _scannable(blocks):
        return _scan_blocks(blocks, x, remat, **kwargs)
    for block in blocks:
        call = functools.partial(call_sublayer, block, **kwargs)
        x = keras.remat(call)(x) if remat else call(x)
    return x


def scan_by_default(training):
    """Whether `apply_blocks(scan=None)` scans: in training on JAX when it computes on the CPU
    (`vlzoo._backends.switches.scans_blocks_by_default`).

    Args:
        training: whether the call trains.

    Returns:
        bool. (Scanning is the faster on the CPU and the slower on a GPU: docs/benchmarks.md.)
    """
    return switches.scans_blocks_by_default(training)


def _scannable(blocks):
    """Whether `blocks` are alike (configuration, trainability, built) so one can run on all their weights."""
    def signature(block):
        config = {k: v for k, v in block.get_config().items() if k != "name"}
        return config, [v.trainable for v in block.weights], block.built

    return len(blocks) > 1 and all(signature(b) == signature(blocks[0]) for b in blocks[1:]) and blocks[0].built


def _scan_blocks(blocks, x, remat, **kwargs):
    """`apply_blocks` as a `keras.ops.scan` of `blocks[0]`'s stateless call over the stacked weights."""
    template = blocks[0]
    trainable = [ops.stack(values) for values in zip(*[[v.value for v in b.trainable_variables] for b in blocks])]
    frozen = [ops.stack(values) for values in zip(*[[v.value for v in b.non_trainable_variables] for b in blocks])]

    def step(carry, weights):
        trainable_values, frozen_values = weights
        return template.stateless_call(trainable_values, frozen_values, carry, **kwargs)[0]

    step = keras.remat(step) if remat else step
    x, _ = ops.scan(lambda carry, weights: (step(carry, weights), None), x, (trainable, frozen))
    return x
