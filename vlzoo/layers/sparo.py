"""SPARO read-out (Vani et al., 2024): L single-head attention slots with learned queries."""

import math

import keras
from keras import ops

from vlzoo.layers.contraction import float32_einsum

# Logit of a position a slot may not attend to: finite, and far enough below
# any real logit that its softmax weight is exactly 0 in float32.
_MASKED_LOGIT = -1e9


@keras.saving.register_keras_serializable(package="vlzoo")
class SPAROReadout(keras.layers.Layer):
    """SPARO: `L` slots, each one single-head attention with a learned query.

    For slot `l` (Eq. 1 of the paper, with the biases of its appendix):

        k_j = K_l h_j + b_l                        key = value (tied)
        a   = softmax_j(q_l . k_j / sqrt(D))       over the allowed positions
        y_l = W (sum_j a_j k_j) + c                W: D -> V, shared by all slots

    The key projection of every slot is one Dense `d -> (L/g) D` (`key`);
    `g = group_size` slots share a key projection (multi-query, appendix A)
    while keeping their own query; slot `l` uses key group `l // g`
    (group-major order, as the authors' `q` of shape `(1, L/g, g, 1, D)`).
    There is no LayerNorm, activation, dropout, residual or mixing across
    slots, and no positional dependence. Logits are softmaxed in float32.
    The layer returns the **raw** slots; SPARO's per-slot normalisation
    belongs to the model (`vlzoo.models.sparo.normalize_slots`).

    Initialisation (the authors' code): queries N(0, 1); `key` Glorot-uniform
    over the stacked `(d, (L/g) D)` kernel, zero bias; `output` U(+-1/sqrt(D))
    (PyTorch's `nn.Linear` default), zero bias.

    Args:
        num_slots: number of slots `L`.
        slot_dim: output width `V` of every slot.
        key_dim: query/key width `D` of every slot (the backbone's head
            width, 64, in the paper).
        group_size: slots sharing one key projection `g` (1 in every
            released configuration); must divide `num_slots`.
        share_key_value: True (SPARO): the keys are the values. False adds a
            separate value Dense `d -> (L/g) D` (the authors' `share_kv=False`
            ablation).

    Call arguments:
        tokens: `(B, n, d)` backbone states, after the tower's final
            LayerNorm on every position.
        end_index: optional int `(B,)`: positions `j > end_index` are not
            attended (the text tower's end token, see `end_token_index`).
            `None`: every position is attended (vision, CLS included).

    Returns:
        dict with `"slots"` `(B, L, V)` (raw, unnormalised; concatenate
        slot-major for the `L V` encoding) and `"attention"` float32
        `(B, L, n)` (rows sum to 1; exactly 0 after `end_index`).

    Raises:
        ValueError: a size not a positive int, `group_size` not dividing `num_slots`, `tokens` not
            `(B, n, d)`, or `end_index` not `(B,)`.

    Example:
    >>> readout = SPAROReadout(num_slots=4, slot_dim=8, key_dim=8)
    >>> out = readout(keras.ops.ones((2, 10, 32)))
    >>> out["slots"].shape, out["attention"].shape
    ((2, 4, 8), (2, 4, 10))
    """

    def __init__(self, num_slots, slot_dim, key_dim, group_size=1, share_key_value=True, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("num_slots", num_slots), ("slot_dim", slot_dim), ("key_dim", key_dim),
                            ("group_size", group_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive int; received {value!r}.")
        if num_slots % group_size:
            raise ValueError(f"`group_size` ({group_size}) must divide `num_slots` ({num_slots}).")
        self.num_slots = num_slots
        self.slot_dim = slot_dim
        self.key_dim = key_dim
        self.group_size = group_size
        self.share_key_value = share_key_value
        self.num_keys = num_slots // group_size
        dense = dict(bias_initializer="zeros", dtype=self.dtype_policy)
        self.key = keras.layers.Dense(
            self.num_keys * key_dim, kernel_initializer="glorot_uniform", name="key", **dense
        )
        self.value = None if share_key_value else keras.layers.Dense(
            self.num_keys * key_dim, kernel_initializer="glorot_uniform", name="value", **dense
        )
        self.output_dense = keras.layers.Dense(
            slot_dim, name="output",
            kernel_initializer=keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform"), **dense,
        )

    def build(self, input_shape):
        self.queries = self.add_weight(
            name="queries", shape=(self.num_slots, self.key_dim),
            initializer=keras.initializers.RandomNormal(stddev=1.0),
        )
        self.key.build(input_shape)
        if self.value is not None:
            self.value.build(input_shape)
        self.output_dense.build((None, self.num_slots, self.key_dim))
        self.built = True

    def _split(self, x, batch, length):
        return ops.reshape(x, (batch, length, self.num_keys, self.key_dim))

    def call(self, tokens, end_index=None):
        shape = tuple(tokens.shape)
        width = self.key.kernel.shape[0]
        if len(shape) != 3 or shape[-1] != width:
            raise ValueError(f"`tokens` must have shape (B, n, {width}); received shape {shape}.")
        batch, length = ops.shape(tokens)[0], ops.shape(tokens)[1]
        keys = self._split(self.key(tokens), batch, length)
        values = keys if self.value is None else self._split(self.value(tokens), batch, length)
        queries = ops.cast(self.queries, keys.dtype) * (1.0 / math.sqrt(self.key_dim))
        queries = ops.reshape(queries, (self.num_keys, self.group_size, self.key_dim))
        logits = float32_einsum("kgd,bnkd->bkgn", queries, keys)
        if end_index is not None:
            end_index = ops.convert_to_tensor(end_index)
            if len(end_index.shape) != 1:
                raise ValueError(f"`end_index` must have shape (B,); received shape {tuple(end_index.shape)}.")
            allowed = ops.arange(length, dtype="int32")[None, :] <= ops.cast(end_index, "int32")[:, None]
            logits = ops.where(allowed[:, None, None, :], logits, _MASKED_LOGIT)
        attention = ops.softmax(logits, axis=-1)
        pooled = ops.cast(float32_einsum("bkgn,bnkd->bkgd", attention, values), values.dtype)
        slots = self.output_dense(ops.reshape(pooled, (batch, self.num_slots, self.key_dim)))
        return {"slots": slots, "attention": ops.reshape(attention, (batch, self.num_slots, length))}

    def get_config(self):
        config = super().get_config()
        config.update(
            num_slots=self.num_slots, slot_dim=self.slot_dim, key_dim=self.key_dim,
            group_size=self.group_size, share_key_value=self.share_key_value,
        )
        return config
