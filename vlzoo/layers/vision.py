"""Vision transformer tower."""

import keras
from keras import ops

from vlzoo.layers.embedding import PatchEmbedding, PositionEmbedding
from vlzoo.layers.heads import MAPHead
from vlzoo.layers.rotary import rotary_tables_2d
from vlzoo.layers.transformer import apply_blocks, transformer_stack

POOLINGS = ("cls", "mean", "map")
# The entries of a NaFlex image batch (`vlzoo.preprocessing.NaFlexPreprocessor`'s output).
PATCH_INPUTS = ("patches", "patch_mask", "spatial_shapes")


def is_patch_batch(images):
    """Whether `images` is a NaFlex batch of cut patches (a dict with `PATCH_INPUTS`), not pixels."""
    return isinstance(images, dict) and set(PATCH_INPUTS) <= set(images)


@keras.saving.register_keras_serializable(package="vlzoo")
class VisionTransformer(keras.layers.Layer):
    """ViT image tower: patches, prefix tokens, pre-LN blocks, final LN, pooling, projection.

    The final LayerNorm is applied to every token before pooling (as in
    open_clip and timm), so the returned tokens are the normalised ones that
    token-level families project.

    Args:
        image_size: training resolution (square), in pixels.
        patch_size: patch side in pixels.
        hidden_dim, num_layers, num_heads, intermediate_dim: transformer geometry.
        output_dim: projection width; `None` for no projection.
        num_prefix_tokens: learned tokens prepended to the patches: 1 for a
            CLS token, K for mixture tokens, 0 for none (SigLIP).
        pooling: `"cls"` (first prefix token), `"mean"` (mean over patch
            tokens) or `"map"` (attention pooling head).
        activation: MLP activation.
        layer_norm_epsilon: epsilon of every LayerNorm of the tower.
        use_pre_norm: LayerNorm after the embeddings (`ln_pre`, CLIP).
        patch_bias: whether the patch projection has a bias.
        projection_bias: whether the output projection has a bias.
        pos_init_std, prefix_init_std: initialisation scales.
        remat: recompute each transformer block's activations in the
            backward pass when training (`keras.remat`; same values and
            gradients, less memory, about one more forward pass of compute).
            A training setting: may be switched on a built tower by setting
            the attribute, e.g. through `vlzoo.training.configure`.
        dynamic_image_size: accept images of any size that is a multiple of
            `patch_size`, resizing the position embedding bicubically to
            their patch grid (for fine-tuning or evaluating at another
            resolution). False (default): the models reject any other size
            than `image_size`, so that unresized images fail loudly instead of
            giving quietly different embeddings.
        rotary_theta: frequency base of a 2D rotary embedding of the patch
            tokens in every attention, on top of the learned position
            embedding (Perception Encoder: 10000); None (default): none.
            Patches sit at integer (column, row) positions counted from 1
            when the tower has prefix tokens (which are not rotated), else
            from 0 (`vlzoo.layers.rotary`); at another image size the grid
            grows, the positions keep their spacing.
        map_num_heads, map_intermediate_dim: heads and MLP width of the
            `"map"` pooling head (default: the tower's).
        num_register_tokens: learned register tokens (Darcet et al. 2024; DINOv2 with registers, TIPSv2)
            placed after the prefix tokens once the position embedding is added, with no position of
            their own, and returned apart from the tokens (`"registers"`); 0 (default): none.
        layer_scale: LayerScale's initial value in every block (`TransformerBlock`); None: none.

    Call arguments:
        images: float `(B, H, W, 3)`, preprocessed; `H = W = image_size`, or
            with `dynamic_image_size` any multiples of `patch_size`. Or a
            NaFlex batch (SigLIP 2's variable resolution; not with
            `rotary_theta`): a dict of
            `patches` float `(B, N, p * p * 3)` (each image's own patch grid,
            row-major, padded to N), `patch_mask` `(B, N)` (True or 1 for a
            real patch) and `spatial_shapes` int `(B, 2)` (each grid's rows
            and columns), as `vlzoo.preprocessing.NaFlexPreprocessor` makes
            them. The position embedding is resized to each image's grid
            (`PositionEmbedding.for_patch_grids`), and padding patches are
            hidden from every attention and from the pooling.
        training: Keras' training flag (remat applies only when True).

    Returns:
        dict with `"pooled"` `(B, output_dim or hidden_dim)`, `"tokens"`
        `(B, num_prefix_tokens + P, hidden_dim)` (after the final LN), and with register tokens
        `"registers"` `(B, num_register_tokens, hidden_dim)` (after the final LN).

    Raises:
        ValueError: an unknown `pooling`, `pooling="cls"` without a prefix token, `image_size`
            not a multiple of `patch_size`, a rotary embedding with a head width that 4 does not
            divide or with register tokens, a negative `num_register_tokens`, or a NaFlex batch given
            to a rotary tower.

    Example:
    >>> vit = VisionTransformer(32, 8, 64, 2, 4, 256, output_dim=32)
    >>> vit(keras.ops.ones((2, 32, 32, 3)))["pooled"].shape
    (2, 32)
    """

    def __init__(
        self, image_size, patch_size, hidden_dim, num_layers, num_heads, intermediate_dim,
        output_dim=None, num_prefix_tokens=1, pooling="cls", activation="gelu",
        layer_norm_epsilon=1e-5, use_pre_norm=True, patch_bias=False, projection_bias=False,
        pos_init_std=None, prefix_init_std=None, remat=False, dynamic_image_size=False, rotary_theta=None,
        map_num_heads=None, map_intermediate_dim=None, num_register_tokens=0, layer_scale=None, **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(num_register_tokens, bool) or not isinstance(num_register_tokens, int) or num_register_tokens < 0:
            raise ValueError(f"`num_register_tokens` must be an int >= 0; received {num_register_tokens!r}.")
        if rotary_theta is not None and num_register_tokens:
            raise ValueError("`rotary_theta` and `num_register_tokens` cannot be combined: the rotary embedding "
                             "rotates the patches at their grid positions, after the prefix tokens.")
        if pooling not in POOLINGS:
            raise ValueError(f"`pooling` must be one of {POOLINGS}; received {pooling!r}.")
        if pooling == "cls" and num_prefix_tokens < 1:
            raise ValueError("`pooling='cls'` needs `num_prefix_tokens >= 1`.")
        if rotary_theta is not None and (hidden_dim // num_heads) % 4:
            raise ValueError(f"`rotary_theta` needs a head width (`hidden_dim / num_heads` = "
                             f"{hidden_dim // num_heads}) divisible by 4.")
        if image_size % patch_size:
            raise ValueError(
                f"`image_size` ({image_size}) must be a multiple of `patch_size` ({patch_size})."
            )
        self.image_size = image_size
        self.patch_size = patch_size
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.output_dim = output_dim
        self.num_prefix_tokens = num_prefix_tokens
        self.pooling = pooling
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.use_pre_norm = use_pre_norm
        self.patch_bias = patch_bias
        self.projection_bias = projection_bias
        self.pos_init_std = pos_init_std
        self.prefix_init_std = prefix_init_std
        self.remat = remat
        self.dynamic_image_size = dynamic_image_size
        self.rotary_theta = rotary_theta
        self.map_num_heads = map_num_heads
        self.map_intermediate_dim = map_intermediate_dim
        self.num_register_tokens = num_register_tokens
        self.layer_scale = layer_scale
        self.grid_size = (image_size // patch_size,) * 2

        dtype = self.dtype_policy
        ln = dict(epsilon=layer_norm_epsilon, dtype=dtype)
        self.patch_embedding = PatchEmbedding(hidden_dim, patch_size, use_bias=patch_bias, dtype=dtype, name="patch_embedding")
        self.position_embedding = PositionEmbedding(
            hidden_dim, grid_size=self.grid_size, num_prefix_tokens=num_prefix_tokens,
            init_std=pos_init_std if pos_init_std is not None else hidden_dim**-0.5,
            dtype=dtype, name="position_embedding",
        )
        self.pre_norm = keras.layers.LayerNormalization(name="pre_norm", **ln) if use_pre_norm else None
        self.blocks = transformer_stack(
            hidden_dim, num_layers, num_heads, intermediate_dim, activation, layer_norm_epsilon, dtype,
            layer_scale=layer_scale,
        )
        self.post_norm = keras.layers.LayerNormalization(name="post_norm", **ln)
        self.map_head = (
            MAPHead(hidden_dim, map_num_heads or num_heads, map_intermediate_dim or intermediate_dim, activation,
                    layer_norm_epsilon, dtype=dtype, name="map_head")
            if pooling == "map" else None
        )
        self.projection = (
            keras.layers.Dense(
                output_dim, use_bias=projection_bias, dtype=dtype, name="projection",
                kernel_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
            )
            if output_dim is not None else None
        )

    def build(self, input_shape=None):
        batch = None
        num_tokens = self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]
        tokens_shape = (batch, num_tokens, self.hidden_dim)
        self.patch_embedding.build((batch, self.image_size, self.image_size, 3))
        if self.num_prefix_tokens:
            self.prefix_tokens = self.add_weight(
                name="prefix_tokens", shape=(self.num_prefix_tokens, self.hidden_dim),
                initializer=keras.initializers.RandomNormal(
                    stddev=self.prefix_init_std if self.prefix_init_std is not None else self.hidden_dim**-0.5
                ),
            )
        self.position_embedding.build(tokens_shape)
        if self.num_register_tokens:
            self.register_tokens = self.add_weight(
                name="register_tokens", shape=(self.num_register_tokens, self.hidden_dim),
                initializer=keras.initializers.RandomNormal(stddev=0.02),
            )
        if self.pre_norm is not None:
            self.pre_norm.build(tokens_shape)
        for block in self.blocks:
            block.build(tokens_shape)
        self.post_norm.build(tokens_shape)
        if self.map_head is not None:
            self.map_head.build(tokens_shape)
        if self.projection is not None:
            self.projection.build((batch, self.hidden_dim))
        self.built = True

    @property
    def pooled_dim(self):
        return self.output_dim if self.output_dim is not None else self.hidden_dim

    def _prepend_prefix(self, x):
        if not self.num_prefix_tokens:
            return x
        prefix = ops.cast(self.prefix_tokens, x.dtype)[None]
        prefix = ops.broadcast_to(prefix, (ops.shape(x)[0], self.num_prefix_tokens, self.hidden_dim))
        return ops.concatenate([prefix, x], axis=1)

    def _insert_registers(self, x, mask):
        """`x` `(B, prefix + P, D)` with the register tokens after the prefix, and `mask` (None, or
        `(B, prefix + P)` bool) with them marked real."""
        if not self.num_register_tokens:
            return x, mask
        count, batch_size = self.num_register_tokens, ops.shape(x)[0]
        registers = ops.cast(self.register_tokens, x.dtype)[None]
        registers = ops.broadcast_to(registers, (batch_size, count, self.hidden_dim))
        split = self.num_prefix_tokens
        x = ops.concatenate([x[:, :split], registers, x[:, split:]], axis=1)
        if mask is not None:
            mask = ops.concatenate([mask[:, :split], ops.ones((batch_size, count), "bool"), mask[:, split:]], axis=1)
        return x, mask

    def _embed_patch_batch(self, batch):
        """NaFlex: `(tokens with their positions, token mask (B, prefix + N) bool)`."""
        patches = batch["patches"]
        positions = self.position_embedding.for_patch_grids(batch["spatial_shapes"], patches.shape[1])
        mask = ops.cast(batch["patch_mask"], "bool")
        if self.num_prefix_tokens:  # learned tokens with their own (never resized) position rows, always real
            count, batch_size = self.num_prefix_tokens, ops.shape(mask)[0]
            rows = ops.cast(self.position_embedding.embeddings[:count], positions.dtype)[None]
            positions = ops.concatenate([ops.broadcast_to(rows, (batch_size, count, self.hidden_dim)), positions], 1)
            mask = ops.concatenate([ops.ones((batch_size, count), "bool"), mask], axis=1)
        x = self._prepend_prefix(self.patch_embedding.embed_patches(patches))
        return x + ops.cast(positions, x.dtype), mask

    def call(self, images, training=None):
        mask = None
        blocks = {}
        if is_patch_batch(images):
            if self.rotary_theta is not None:
                raise ValueError("`images`: a tower with a rotary embedding (`rotary_theta`) takes pixels "
                                 "`(B, H, W, 3)`, not a NaFlex patch batch.")
            x, mask = self._embed_patch_batch(images)
        else:
            height, width = images.shape[1], images.shape[2]
            grid_size = (height // self.patch_size, width // self.patch_size)
            x = self.position_embedding(self._prepend_prefix(self.patch_embedding(images)), grid_size=grid_size)
            if self.rotary_theta is not None:
                offset = 1.0 if self.num_prefix_tokens else 0.0
                tables = rotary_tables_2d(grid_size, self.hidden_dim // self.num_heads, self.rotary_theta, offset)
                blocks["rotary"] = tuple(ops.cast(t, x.dtype) for t in tables)
        x, mask = self._insert_registers(x, mask)
        if self.pre_norm is not None:
            x = self.pre_norm(x)
        if mask is not None:  # padding patches are keys no token attends to
            blocks["attention_mask"] = ops.broadcast_to(mask[:, None, :], (ops.shape(mask)[0],) + (mask.shape[1],) * 2)
        x = apply_blocks(self.blocks, x, remat=bool(self.remat and training), training=training, **blocks)
        tokens = self.post_norm(x)
        outputs = {}
        if self.num_register_tokens:
            split, count = self.num_prefix_tokens, self.num_register_tokens
            outputs["registers"] = tokens[:, split:split + count]
            tokens = ops.concatenate([tokens[:, :split], tokens[:, split + count:]], axis=1)
            if mask is not None:
                mask = ops.concatenate([mask[:, :split], mask[:, split + count:]], axis=1)
        if self.pooling == "cls":
            pooled = tokens[:, 0]
        elif self.pooling == "mean":
            patches = tokens[:, self.num_prefix_tokens :]
            if mask is None:
                pooled = ops.mean(patches, axis=1)
            else:
                weights = ops.cast(mask[:, self.num_prefix_tokens :], patches.dtype)[..., None]
                pooled = ops.sum(patches * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)
        else:
            pooled = self.map_head(tokens, token_mask=mask)
        if self.projection is not None:
            pooled = self.projection(pooled)
        return {"pooled": pooled, "tokens": tokens, **outputs}

    def get_config(self):
        config = super().get_config()
        config.update(
            image_size=self.image_size, patch_size=self.patch_size, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim, output_dim=self.output_dim,
            num_prefix_tokens=self.num_prefix_tokens, pooling=self.pooling,
            activation=self.activation, layer_norm_epsilon=self.layer_norm_epsilon,
            use_pre_norm=self.use_pre_norm, patch_bias=self.patch_bias,
            projection_bias=self.projection_bias, pos_init_std=self.pos_init_std,
            prefix_init_std=self.prefix_init_std, remat=self.remat,
            dynamic_image_size=self.dynamic_image_size, rotary_theta=self.rotary_theta,
            map_num_heads=self.map_num_heads, map_intermediate_dim=self.map_intermediate_dim,
        )
        # Absent from the towers without them, as before they existed.
        if self.num_register_tokens:
            config["num_register_tokens"] = self.num_register_tokens
        if self.layer_scale is not None:
            config["layer_scale"] = self.layer_scale
        return config
