"""Text transformer tower."""

import math

import keras
from keras import ops

from vlzoo.layers.embedding import PositionEmbedding, TokenEmbedding, sinusoidal_positions
from vlzoo.layers.transformer import apply_blocks, transformer_stack

POOLINGS = ("eot", "last", "mean", "first")
POSITIONS = ("learned", "sinusoidal")


def end_token_index(token_ids, end_token_id=None):
    """Position of the end token in each row of `token_ids`.

    The **first** occurrence is taken, so captions padded with the end token
    itself (keras-hub's and HF's CLIP tokenizers) find the real one on every
    backend (`argmax` does not promise which tie it returns on TensorFlow).

    Args:
        token_ids: int `(B, T)`.
        end_token_id: id of the end token. `None` (default): the row's
            largest id, CLIP's convention (its end-of-text id 49407 is the
            largest of the BPE vocabulary), i.e. open_clip's
            `argmax(token_ids)` with ties resolved to the first position.

    Returns:
        int32 `(B,)`: the position of the end token, `T - 1` for a row that
        does not contain it (the whole row is then attended).

    Raises:
        ValueError: `token_ids` not of rank 2.

    Example:
    >>> end_token_index(np.array([[5, 9, 0, 0], [5, 7, 9, 9]]))  # doctest: +SKIP
    [1, 2]
    """
    token_ids = ops.convert_to_tensor(token_ids)
    if len(token_ids.shape) != 2:
        raise ValueError(f"`token_ids` must have shape (B, T); received shape {tuple(token_ids.shape)}.")
    length = ops.shape(token_ids)[1]
    end = ops.max(token_ids, axis=-1, keepdims=True) if end_token_id is None else end_token_id
    positions = ops.arange(length, dtype="int32")[None, :]
    found = ops.where(ops.equal(token_ids, ops.cast(end, token_ids.dtype)), positions, length - 1)
    return ops.min(found, axis=-1)


@keras.saving.register_keras_serializable(package="vlzoo")
class TextTransformer(keras.layers.Layer):
    """Text tower: token and position embeddings, pre-LN blocks, final LN, pooling, projection.

    Args:
        vocabulary_size: number of token ids.
        sequence_length: context length (maximum T).
        hidden_dim, num_layers, num_heads, intermediate_dim: transformer geometry.
        output_dim: projection width; `None` for no projection.
        causal: causal self-attention (CLIP) or bidirectional (SigLIP).
        pooling: `"eot"` (the end token's position: the largest token id,
            CLIP's end token, or the first `end_token_id`), `"last"` (position
            T-1, SigLIP), `"mean"` (mean over real tokens) or `"first"`.
        end_token_id: the end token's id for `"eot"` pooling, pooled at its
            first occurrence (MetaCLIP 2's `</s>`, 2); None: the largest id.
        use_padding_mask: whether attention ignores padding positions
            (CLIP and SigLIP attend to them, as in their reference code).
        activation: MLP activation.
        layer_norm_epsilon: epsilon of every LayerNorm of the tower.
        projection_bias: whether the output projection has a bias.
        remat: recompute each transformer block's activations in the
            backward pass when training (`keras.remat`; same values and
            gradients, less memory). A training setting: may be switched on a
            built tower by setting the attribute, e.g. through
            `vlzoo.training.configure`.
        positions: `"learned"` (a trained table, CLIP) or `"sinusoidal"` (fixed,
            `vlzoo.layers.embedding.sinusoidal_positions`, no weights; TIPSv2).
        scale_embeddings: multiply the token embeddings by `sqrt(hidden_dim)` before the positions are
            added (TIPSv2).

    Call arguments:
        token_ids: int `(B, T)` with `T <= sequence_length`.
        padding_mask: bool `(B, T)`, True = real token.
        training: Keras' training flag (remat applies only when True).

    Returns:
        dict with `"pooled"` `(B, output_dim or hidden_dim)` and `"tokens"`
        `(B, T, hidden_dim)` (after the final LN).

    Raises:
        ValueError: an unknown `pooling` or `positions`, or an `end_token_id` outside the
            vocabulary or without `"eot"` pooling.

    Example:
    >>> tower = TextTransformer(1000, 16, 64, 2, 4, 256, output_dim=32)
    >>> ids = keras.ops.ones((2, 16), "int32")
    >>> tower(ids, keras.ops.ones((2, 16), "bool"))["pooled"].shape
    (2, 32)
    """

    def __init__(
        self, vocabulary_size, sequence_length, hidden_dim, num_layers, num_heads,
        intermediate_dim, output_dim=None, causal=True, pooling="eot", use_padding_mask=False,
        activation="gelu", layer_norm_epsilon=1e-5, projection_bias=False, remat=False, end_token_id=None,
        positions="learned", scale_embeddings=False, **kwargs,
    ):
        super().__init__(**kwargs)
        if pooling not in POOLINGS:
            raise ValueError(f"`pooling` must be one of {POOLINGS}; received {pooling!r}.")
        if positions not in POSITIONS:
            raise ValueError(f"`positions` must be one of {POSITIONS}; received {positions!r}.")
        if end_token_id is not None and (pooling != "eot" or not 0 <= end_token_id < vocabulary_size):
            raise ValueError(f"`end_token_id` must be a token id below `vocabulary_size` ({vocabulary_size}) with "
                             f"pooling='eot'; received {end_token_id!r} with pooling={pooling!r}.")
        self.vocabulary_size = vocabulary_size
        self.sequence_length = sequence_length
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.output_dim = output_dim
        self.causal = causal
        self.pooling = pooling
        self.use_padding_mask = use_padding_mask
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.projection_bias = projection_bias
        self.remat = remat
        self.end_token_id = end_token_id
        self.positions = positions
        self.scale_embeddings = bool(scale_embeddings)

        dtype = self.dtype_policy
        self.token_embedding = TokenEmbedding(
            vocabulary_size, hidden_dim, dtype=dtype, name="token_embedding",
            embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02),
        )
        self.position_embedding = (
            PositionEmbedding(hidden_dim, sequence_length=sequence_length, init_std=0.01, dtype=dtype,
                              name="position_embedding")
            if positions == "learned" else None
        )
        self._sinusoid = sinusoidal_positions(sequence_length, hidden_dim) if positions == "sinusoidal" else None
        self.blocks = transformer_stack(
            hidden_dim, num_layers, num_heads, intermediate_dim, activation, layer_norm_epsilon, dtype
        )
        self.post_norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="post_norm")
        self.projection = (
            keras.layers.Dense(
                output_dim, use_bias=projection_bias, dtype=dtype, name="projection",
                kernel_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
            )
            if output_dim is not None else None
        )

    def build(self, input_shape=None):
        shape = (None, self.sequence_length, self.hidden_dim)
        self.token_embedding.build((None, self.sequence_length))
        if self.position_embedding is not None:
            self.position_embedding.build(shape)
        for block in self.blocks:
            block.build(shape)
        self.post_norm.build(shape)
        if self.projection is not None:
            self.projection.build((None, self.hidden_dim))
        self.built = True

    @property
    def pooled_dim(self):
        return self.output_dim if self.output_dim is not None else self.hidden_dim

    def _embed(self, token_ids, training):
        x = self.token_embedding(token_ids, training=training)
        if self.scale_embeddings:
            x = x * math.sqrt(self.hidden_dim)
        if self.position_embedding is not None:
            return self.position_embedding(x)
        return x + ops.cast(self._sinusoid[: x.shape[1]], x.dtype)

    def call(self, token_ids, padding_mask, training=None):
        x = self._embed(token_ids, training)
        mask, is_causal = None, self.causal
        if self.use_padding_mask:
            length = x.shape[1]
            mask = ops.cast(padding_mask, "bool")[:, None, :]
            mask = ops.broadcast_to(mask, (ops.shape(x)[0], length, length))
            if self.causal:
                causal = ops.tril(ops.ones((length, length), dtype="bool"))
                mask, is_causal = ops.logical_and(mask, causal[None]), False
        x = apply_blocks(
            self.blocks, x, remat=bool(self.remat and training), training=training, attention_mask=mask,
            is_causal=is_causal,
        )
        tokens = self.post_norm(x)
        if self.pooling == "eot":
            index = (ops.argmax(token_ids, axis=-1) if self.end_token_id is None
                     else end_token_index(token_ids, self.end_token_id))
            pooled = ops.take_along_axis(tokens, ops.reshape(index, (-1, 1, 1)), axis=1)[:, 0]
        elif self.pooling == "last":
            pooled = tokens[:, -1]
        elif self.pooling == "first":
            pooled = tokens[:, 0]
        else:
            weights = ops.cast(padding_mask, tokens.dtype)[..., None]
            pooled = ops.sum(tokens * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)
        if self.projection is not None:
            pooled = self.projection(pooled)
        return {"pooled": pooled, "tokens": tokens}

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size, sequence_length=self.sequence_length,
            hidden_dim=self.hidden_dim, num_layers=self.num_layers, num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim, output_dim=self.output_dim,
            causal=self.causal, pooling=self.pooling, use_padding_mask=self.use_padding_mask,
            activation=self.activation, layer_norm_epsilon=self.layer_norm_epsilon,
            projection_bias=self.projection_bias, remat=self.remat,
        )
        # Absent from the towers that do not set them, as before they existed.
        if self.end_token_id is not None:
            config["end_token_id"] = self.end_token_id
        if self.positions != "learned":
            config["positions"] = self.positions
        if self.scale_embeddings:
            config["scale_embeddings"] = True
        return config
