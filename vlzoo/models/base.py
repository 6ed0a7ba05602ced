"""`ContrastiveModel`: the dual-encoder base every family builds on."""

import functools
import inspect
import math

import keras
from keras import ops

from vlzoo import compiled, parallel
from vlzoo._backends import switches, workarounds
from vlzoo.layers import TextTransformer, VisionTransformer
from vlzoo.layers.vision import is_patch_batch
from vlzoo.losses import l2_normalize
from vlzoo.models import layout
from vlzoo.models import validation
from vlzoo.models.ensembling import EmbeddingMean
from vlzoo.models.micro_batching import micro_batched
from vlzoo.parallel.trainer import Trainer
from vlzoo.preprocessing import ImagePreprocessor
from vlzoo.presets import saving
from vlzoo.tokenizers import CLIP_BPE, CLIP_BPE_VOCABULARY_SIZE, UnavailableTokenizer, bundled_tokenizer

LOGIT_SCALE_MAX = math.log(100.0)

@keras.saving.register_keras_serializable(package="vlzoo")
class ClampLogitScale(keras.constraints.Constraint):
    """Keeps the learned log-scale in `[0, max_value]` after every optimizer update.

    As open_clip's training loop, the clamp acts on the parameter after each
    step, never in the forward pass: a loaded checkpoint whose scale is above
    the bound (trained SigLIP models are) scores exactly as its source.
    """

    def __init__(self, max_value=LOGIT_SCALE_MAX):
        self.max_value = max_value

    def __call__(self, w):
        return ops.clip(w, 0.0, self.max_value)

    def get_config(self):
        return {"max_value": self.max_value}


def _prefixed(side, embeds):
    """`{"embeds": x, "tokens": y}` -> `{"image_embeds": x, "image_tokens": y}` (`side="image"`)."""
    return {f"{side}_{key}": value for key, value in embeds.items()}


class ContrastiveModel(Trainer):
    """Image tower + text tower + learned temperature, trained with a family loss.

    Subclasses set `family` and the towers' defaults (`vision_defaults`, `text_defaults`), and
    implement `score(image_embeds, text_embeds)` and `contrastive_loss(outputs, rows=None)`, whose `rows`
    give one replica's share of a step over several (docs/adding_a_family.md).

    `compile`, `fit`, `evaluate` and the train and test steps come from `vlzoo.parallel.trainer.Trainer`;
    `get_layout_map(mesh)` gives the `keras.distribution.LayoutMap` that shards the weights.

    Args:
        vision: dict of `VisionTransformer` arguments (family defaults fill
            what is missing; `output_dim` defaults to `embed_dim`).
        text: dict of `TextTransformer` arguments (same rules).
        embed_dim: width of the shared embedding space.
        init_logit_scale: initial learned log-scale (the multiplier is its exp).
        logit_scale_max: bound on the log-scale applied after every training
            update (`ln 100` by default, as open_clip); `None` for no bound.
        dtype: dtype policy, e.g. `"float32"`, `"bfloat16"` or
            `"mixed_bfloat16"` (towers compute in bfloat16, variables are
            float32); the logit scale/bias and the losses are always float32.

    Inputs of `call`/`fit`: dict with `"images"` float `(B, H, W, 3)`,
    `"token_ids"` int `(B, T)` and `"padding_mask"` bool `(B, T)`.
    """

    family = None
    vision_defaults = {}
    text_defaults = {}
    # `(path pattern, axes)` for the family's own large weights, after the towers' rules
    # (`get_layout_map`).
    extra_layout_rules = ()

    def __init__(
        self, vision, text, embed_dim, init_logit_scale=math.log(1 / 0.07),
        logit_scale_max=LOGIT_SCALE_MAX, dtype=None, **kwargs,
    ):
        if keras.distribution.distribution() is not None:
            workarounds.check_distribution_backend(f"Building {type(self).__name__} under a keras.distribution")
        super().__init__(dtype=dtype, **kwargs)
        self.embed_dim = embed_dim
        self.init_logit_scale = init_logit_scale
        self.logit_scale_max = logit_scale_max
        if embed_dim is not None and (isinstance(embed_dim, bool) or not isinstance(embed_dim, int) or embed_dim <= 0):
            raise ValueError(f"`embed_dim` must be a positive integer; received {embed_dim!r}.")
        self.vision_config = {"output_dim": embed_dim, **self.vision_defaults, **vision}
        self.text_config = {"output_dim": embed_dim, **self.text_defaults, **text}
        validation.check_tower_config(self.vision_config, "vision")
        validation.check_tower_config(self.text_config, "text")
        self.vision = VisionTransformer(**self.vision_config, dtype=self.dtype_policy, name="vision")
        self.text = TextTransformer(**self.text_config, dtype=self.dtype_policy, name="text")
        self.logit_scale = self.add_weight(
            name="logit_scale", shape=(), dtype="float32", autocast=False,
            initializer=keras.initializers.Constant(init_logit_scale),
            constraint=ClampLogitScale(logit_scale_max) if logit_scale_max is not None else None,
        )
        self.vision.build()
        self.text.build()
        self.built = True
        self._tokenizer = None
        self._preprocessor = None
        self._inference_functions = {}
        self._forward_functions = {}

    # ------------------------------------------------------------------ API

    @property
    def tokenizer(self):
        """The text tokenizer: `tokenizer(list_of_str) -> {"token_ids", "padding_mask"}`."""
        if self._tokenizer is None:
            self._tokenizer = self.default_tokenizer()
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value):
        self._tokenizer = value

    @property
    def preprocessor(self):
        """The image preprocessor: uint8 or float images -> model-ready pixels."""
        if self._preprocessor is None:
            self._preprocessor = self.default_preprocessor()
        return self._preprocessor

    @preprocessor.setter
    def preprocessor(self, value):
        self._preprocessor = value

    def default_tokenizer(self):
        """The bundled CLIP BPE for a 49,408-token text tower; otherwise a stand-in that explains."""
        if self.text.vocabulary_size == CLIP_BPE_VOCABULARY_SIZE:
            return bundled_tokenizer(CLIP_BPE, self.text.sequence_length)
        return UnavailableTokenizer(
            f"this {type(self).__name__} model was built without one; load it with "
            "`vlzoo.from_preset(...)` or set `model.tokenizer = ...`."
        )

    def default_preprocessor(self):
        return ImagePreprocessor(image_size=self.vision.image_size)

    def logit_scale_value(self):
        """The multiplier `exp(logit_scale)`, float32 scalar (also under a mixed policy)."""
        return ops.exp(ops.convert_to_tensor(self.logit_scale))

    def _tokenize(self, texts):
        if isinstance(texts, str) or (isinstance(texts, (list, tuple)) and texts and isinstance(texts[0], str)):
            return self.tokenizer(list(texts) if not isinstance(texts, str) else [texts])
        return texts

    # The methods that run the model for inference (`encode_image`, `encode_text`, `similarity`, `score`,
    # `dense_image_embeddings`, `token_patch_alignment` and a family's own, such as Llip's `contextualize`) carry
    # `switches.untracked_inference`: on PyTorch they record no autograd graph, unless an argument is a tensor
    # that requires a gradient.

    def __init_subclass__(cls, **kwargs):
        """Wraps a subclass's overrides of inference methods (`switches.untracked_inference`) alike, so that a
        family's `score`, or a family defined outside vlzoo, needs no decorator of its own."""
        super().__init_subclass__(**kwargs)
        for name, value in list(cls.__dict__.items()):
            inherited = getattr(super(cls, cls), name, None)
            if inspect.isfunction(value) and getattr(inherited, "untracked_inference", False):
                setattr(cls, name, switches.untracked_inference(value))

    @switches.untracked_inference
    def encode_image(self, images, normalize=False):
        """Image embeddings: a dict with the global embedding under `"embeds"`.

        Every family returns the same structure (`image_embedding_keys`):
        `"embeds"` `(B, D)` is the image's global embedding, and the family's
        extras sit beside it under fixed names (FILIP and SPARC `"tokens"`
        `(B, P, D)`; Llip `"keys"` and `"values"`). `score` takes the dict.

        An inference call, as `predict`: on PyTorch it records no autograd
        graph, so its outputs hold no activations and `np.asarray` reads
        them. To differentiate through it, pass `images` as a tensor with
        `requires_grad=True` (autograd then records the call, and gradients
        reach the weights too), or call the model (`model(inputs)`), the
        training path. On JAX and TensorFlow it is differentiable under
        `jax.grad` or a `tf.GradientTape`. The other inference methods
        (`encode_text`, `similarity`, `score`, `dense_image_embeddings`,
        `token_patch_alignment` and the families' own) do the same.

        Args:
            images: float `(B, H, W, 3)` preprocessed pixels; for the families
                that pool one vector per image (CLIP, SigLIP), also a NaFlex
                batch of images at their own aspect ratios
                (`vlzoo.preprocessing.NaFlexPreprocessor`'s dict, see
                `VisionTransformer`).
            normalize: apply `normalize_embeds`.

        Returns:
            `{"embeds": (B, embed_dim), ...}`.

        Example:
        >>> model = vlzoo.from_preset("clip_tiny")
        >>> model.encode_image(np.zeros((2, 32, 32, 3)))["embeds"].shape
        (2, 24)
        """
        self._check_image_inputs(images)
        return self._inference_function("image", normalize)(images)

    @switches.untracked_inference
    def encode_text(self, texts, normalize=False):
        """Text embeddings: a dict with the global embedding under `"embeds"`.

        The structure is `text_embedding_keys`: `"embeds"` `(B, D)` plus the
        family's extras (FILIP and SPARC `"tokens"` `(B, T, D)` and `"mask"`
        `(B, T)`; Llip `"queries"`).

        An inference call: on PyTorch no autograd graph, unless an argument
        requires a gradient (see `encode_image`).

        Args:
            texts: the tokenizer's dict (`token_ids`, `padding_mask`, each
                `(B, T)`) or a list of strings (tokenised with `tokenizer`).
            normalize: apply `normalize_embeds`.

        Returns:
            `{"embeds": (B, embed_dim), ...}`.
        """
        inputs = self._tokenize(texts)
        self._check_text_inputs(inputs)
        return self._inference_function("text", normalize)(inputs)

    def _inference_function(self, side, normalize):
        """`_image_features`, `_text_features` or `_dense_image_features` (`side`: `"image"`, `"text"`,
        `"dense"`), normalised or not, as one compiled program on JAX and TensorFlow (`vlzoo.compiled`); made
        once per side and `normalize`."""
        key = (side, normalize)
        if key not in self._inference_functions:
            features = {"image": self._image_features, "text": self._text_features,
                        "dense": self._dense_image_features}[side]

            def encode(inputs):
                embeds = features(inputs)
                return self.normalize_embeds(embeds) if normalize else embeds

            self._inference_functions[key] = compiled.inference_function(encode, lambda: self.variables)
        return self._inference_functions[key]

    def predict_step(self, *args):
        """`model.predict` / `predict_on_batch`: the embeddings of whichever inputs are given.

        The compiled, batched inference path (jitted on JAX, a `tf.function`
        on TensorFlow, a traced program without an autograd graph on
        PyTorch), with `predict`'s progress bar: `model.predict({"images": x}, batch_size=64)` returns
        the entries of `encode_image(x)` prefixed with `image_` (the names
        `call` uses: `{"image_embeds": ...}` for CLIP, with `image_tokens`
        for FILIP and SPARC) as numpy, `model.predict(tokens)` (the
        tokenizer's dict) those of `encode_text` prefixed with `text_`, both
        when both inputs are given. `encode_image` / `encode_text` remain the per-call
        ones, differentiable on request (see `encode_image`).

        Keras' JAX trainer calls `predict_step(state, data)` with the
        variables' values as `state`; the other backends `predict_step(data)`.
        """
        if len(args) == 2:  # JAX: `state` = (trainable, non-trainable values); returns them back
            (trainable, non_trainable), data = args
            mapping = list(zip(self.trainable_variables, trainable))
            mapping += list(zip(self.non_trainable_variables, non_trainable))
            with keras.StatelessScope(state_mapping=mapping):
                return self._predict_embeddings(data), non_trainable
        return self._predict_embeddings(args[0])

    def _predict_embeddings(self, data):
        x = keras.utils.unpack_x_y_sample_weight(data)[0]
        if not isinstance(x, dict) or not {"images", "token_ids"} & set(x):
            raise ValueError(
                "`predict` takes a dict with `images` (B, H, W, 3) and/or the tokenizer's `token_ids` (B, T) "
                "and `padding_mask` (B, T); received "
                + (f"a dict with keys {sorted(x)}." if isinstance(x, dict) else f"{type(x).__name__}.")
            )
        outputs = {}
        if "images" in x:
            outputs.update(_prefixed("image", self.encode_image(x["images"])))
        if "token_ids" in x:
            text = self.encode_text({k: x[k] for k in ("token_ids", "padding_mask") if k in x})
            outputs.update(_prefixed("text", text))
        return outputs

    @switches.untracked_inference
    def similarity(self, images, texts):
        """Scores of every image against every text, `(N_images, N_texts)` float32.

        An inference call: on PyTorch no autograd graph, unless an argument requires a gradient (see
        `encode_image`).
        """
        return self.score(self.encode_image(images), self.encode_text(texts))

    # --------------------------------------------------------------- training

    # Whether the image features are the tower's pooled vector alone, so that a NaFlex batch (whose padding
    # patches the tower masks) gives the same embeddings as its images would alone. Families that read the
    # tokens (FILIP, SPARC, SPARO, Llip, STAIR) would see the padding patches.
    accepts_patch_batches = False

    def _check_image_shape(self, images):
        if is_patch_batch(images):
            if not self.accepts_patch_batches:
                raise NotImplementedError(
                    f"{type(self).__name__} reads the image tower's tokens, and NaFlex batches (`patches`, "
                    "`patch_mask`, `spatial_shapes`) are supported only by the families that pool one vector "
                    "per image (CLIP, SigLIP); pass pixels (B, H, W, 3).")
            validation.check_patch_batch(images, self.vision.patch_size)
            return
        vision = self.vision
        image_size = None if vision.dynamic_image_size else vision.image_size
        validation.check_images(images, patch_size=vision.patch_size, image_size=image_size)

    def _check_image_inputs(self, images):
        self._check_image_shape(images)
        validation.check_images_values(images["patches"] if is_patch_batch(images) else images)

    def _check_text_inputs(self, inputs):
        validation.check_text(inputs, self.text.vocabulary_size, self.text.sequence_length)

    def normalize_embeds(self, embeds):
        """`encode_image` / `encode_text`'s dict with the family's normalisation applied (`normalize=True`).

        The entries named in `normalized_keys` are normalised by
        `normalize_vectors`, the others pass through.
        """
        return {key: self.normalize_vectors(value) if key in self.normalized_keys else value
                for key, value in embeds.items()}

    def normalize_vectors(self, vectors):
        """The family's normalisation of `(..., D)` embeddings: L2 over the last axis here;
        SPARO normalises each slot, STAIR guards all-zero vectors."""
        return l2_normalize(vectors)

    def check_embeds(self, embeds, side, keys=None):
        """`embeds` as `encode_image` (`side="image"`) or `encode_text` returns it; a clear error otherwise.

        Args:
            embeds: the dict to check.
            side: `"image"` or `"text"`.
            keys: the entries the caller reads (a `score` that reads only the
                global embedding also takes a class representation
                `{"embeds": (C, D)}`); None: every declared entry.
        """
        if keys is None:
            keys = self.image_embedding_keys if side == "image" else self.text_embedding_keys
        if not isinstance(embeds, dict) or not set(keys) <= set(embeds):
            raise TypeError(
                f"`{side}_embeds` must be the dict returned by `{type(self).__name__}.encode_{side}` (keys {list(keys)}); "
                f"received {type(embeds).__name__}"
                + (f" with keys {sorted(embeds)}" if isinstance(embeds, dict) else "")
                + ". Wrap a bare `(N, D)` tensor `x` as `{'embeds': x}`."
            )
        return embeds

    @staticmethod
    def _padding_mask(inputs):
        mask = inputs.get("padding_mask")
        if mask is None:
            mask = ops.ones_like(inputs["token_ids"], dtype="bool")
        return mask

    # The tower outputs (`"pooled"`, `"tokens"`) the family's features read: what
    # `vlzoo.training.cache_tower` keeps of a locked tower.
    image_tower_keys = ("pooled",)
    text_tower_keys = ("pooled",)

    def _image_tower(self, images, training=None):
        """The image tower's outputs for pixels `(B, H, W, 3)`; a dict is a locked tower's cached outputs
        (`vlzoo.training.cache_tower`) and is returned as it is."""
        if isinstance(images, dict) and not is_patch_batch(images):
            return images
        return self.vision(images, training=training)

    def _text_tower(self, inputs, training=None, mask=None):
        """The text tower's outputs for `inputs` (`token_ids`, `padding_mask`), or the cached ones under
        `inputs["text_tower"]`; `mask` replaces the padding mask given to the tower."""
        if "text_tower" in inputs:
            return inputs["text_tower"]
        return self.text(inputs["token_ids"], self._padding_mask(inputs) if mask is None else mask, training=training)

    def _image_features(self, images, training=None):
        return {"embeds": self._image_tower(images, training=training)["pooled"]}

    def _text_features(self, inputs, training=None):
        return {"embeds": self._text_tower(inputs, training=training)["pooled"]}

    def _check_training_inputs(self, inputs):
        if not isinstance(inputs, dict) or "token_ids" not in inputs or not {"images", "image_tower"} & set(inputs):
            raise ValueError(
                "Model inputs must be a dict with `images` (B, H, W, 3) (or a locked image tower's cached "
                "`image_tower` outputs), `token_ids` (B, T) and `padding_mask` (B, T); received "
                f"{type(inputs).__name__}" + (f" with keys {sorted(inputs)}" if isinstance(inputs, dict) else "") + "."
            )
        for side in ("image", "text"):
            if f"{side}_tower" in inputs:
                validation.check_tower_outputs(inputs[f"{side}_tower"], getattr(self, f"{side}_tower_keys"),
                                               f"inputs['{side}_tower']")
        images = inputs["images"] if "images" in inputs else inputs["image_tower"][self.image_tower_keys[0]]
        if "images" in inputs:
            self._check_image_shape(images)
        validation.check_text(inputs, self.text.vocabulary_size, self.text.sequence_length, name="inputs",
                              values=False)
        validation.check_batch_sizes(images["patches"] if is_patch_batch(images) else images, inputs["token_ids"])

    # Rows per tower call in training (gradient caching, `vlzoo.models.micro_batching`); None: the whole
    # batch at once. A training setting (`vlzoo.training.configure`), not part of the config.
    micro_batch_size = None

    def call(self, inputs, training=False):
        """`encode_image` and `encode_text`'s entries, prefixed with `image_` / `text_`, and `logit_scale`.

        In training with `micro_batch_size` set, the towers run that many rows at a time under
        `keras.remat` (exact gradients of the whole batch's loss, a micro-batch's activations).
        """
        self._check_training_inputs(inputs)
        return self._call_towers(inputs, training)

    def _call_towers(self, inputs, training):
        """`call`'s outputs for checked inputs (families that reshape their inputs first call it too).

        On PyTorch, whose training and evaluation steps run eagerly, the towers run as a traced program
        (`vlzoo.compiled.forward_function`), except under gradient caching and after
        `compile(run_eagerly=True)` (layer by layer, for debugging).
        """
        texts = {key: inputs[key] for key in ("token_ids", "padding_mask", "text_tower") if key in inputs}
        images = inputs["images"] if "images" in inputs else inputs["image_tower"]
        if self.run_eagerly or (training and self.micro_batch_size is not None):
            return self._tower_outputs(images, texts, training)
        training = bool(training)
        if training not in self._forward_functions:
            self._forward_functions[training] = compiled.forward_function(
                functools.partial(self._tower_outputs, training=training), lambda: self.variables)
        return self._forward_functions[training](images, texts)

    def _tower_outputs(self, images, texts, training):
        """`_call_towers`' computation."""
        image_features = functools.partial(self._image_features, training=training)
        text_features = functools.partial(self._text_features, training=training)
        if training and self.micro_batch_size is not None:
            image = micro_batched(image_features, images, self.micro_batch_size)
            text = micro_batched(text_features, texts, self.micro_batch_size)
        else:
            image, text = image_features(images), text_features(texts)
        outputs = {**_prefixed("image", image), **_prefixed("text", text)}
        outputs["logit_scale"] = self.logit_scale_value()
        return outputs

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The family's loss on the global batch: with several replicas (`vlzoo.parallel`), the outputs of
        every replica are gathered first, so that each image is compared with every caption of the step."""
        if y_pred is None:
            y_pred = self(x, training=training)
        if training and parallel.world_size() > 1:
            local = {key: y_pred[key] for key in self.replica_local_outputs}
            outputs = {**parallel.gather_batch({k: v for k, v in y_pred.items() if k not in local}), **local}
            count = ops.shape(y_pred["image_embeds"])[0]  # a tensor where the batch size is traced (TensorFlow)
            loss = self.contrastive_loss(outputs, rows=(parallel.replica_index() * count, count), training=training)
        else:
            loss = self.contrastive_loss(parallel.gather_batch(y_pred), training=training)
        if self.losses:
            loss = loss + ops.cast(ops.sum(self.losses), "float32")
        return parallel.scale_loss(loss)

    def get_layout_map(self, mesh, model_axis=layout.MODEL_AXIS):
        """The `keras.distribution.LayoutMap` that shards this model's weights over `mesh` (JAX).

        The towers' Megatron split (`vlzoo.models.layout.TOWER_RULES`), then the family's
        `extra_layout_rules`; a dimension that the mesh's `model_axis` does not divide is replicated,
        and so is every weight without a rule.

        Args:
            mesh: a `keras.distribution.DeviceMesh` with an axis named `model_axis`.
            model_axis: the mesh axis that splits the weights.

        Returns:
            A `LayoutMap` with one entry (the weight's exact path) per sharded weight, for
            `keras.distribution.ModelParallel(layout_map=..., batch_dim_name=...)`.

        Raises:
            NotImplementedError: on a backend other than JAX.
            TypeError: if `mesh` is not a `DeviceMesh`; ValueError: if it has no axis `model_axis`.

        Example:
        >>> mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices())
        >>> model.get_layout_map(mesh)["vision/block_0/mlp/fc1/kernel"].axes
        (None, 'model')
        """
        rules = layout.TOWER_RULES + tuple(self.extra_layout_rules)
        return layout.layout_map(self.weights, rules, mesh, model_axis)

    # ------------------------------------------------------ family interface
    #
    # What every family provides and evaluation, retrieval, visualisation and
    # the CLI rely on (docs/adding_a_family.md walks through it).

    # The entries of `encode_image` / `encode_text`'s dicts (global embedding first)
    # and those that `normalize_embeds` normalises.
    image_embedding_keys = ("embeds",)
    text_embedding_keys = ("embeds",)
    normalized_keys = ("embeds",)

    # Config entries that record where training stands (STAIR's stage), not the model's geometry: two
    # models that differ only there share every variable (`vlzoo.training.interpolate` mixes them).
    training_state_config_keys = ()

    # Whether `score(i, t)` ranks texts for an image and images for a text
    # alike. False for FILIP, whose two directions differ (`direction=`).
    symmetric_score = True

    @switches.untracked_inference
    def score(self, image_embeds, text_embeds, **options):
        """Scores `(N_images, N_texts)` of `encode_image` against `encode_text` outputs, on the loss's scale.

        Both arguments are the dicts the encoders return (normalised or not;
        `check_embeds` says what is missing). An inference call: on PyTorch
        no autograd graph, unless an argument requires a gradient (see
        `encode_image`); a family's override is wrapped alike.

        Options per family (none for CLIP, SigLIP, SPARC, STAIR):
        FILIP `direction="i2t"|"t2i"` (its two late-interaction similarities),
        SPARO `slots=` (score on chosen slots only), Llip `temperature=`
        (the cross-attention's softmax temperature).
        """
        raise NotImplementedError

    @property
    def prompt_ensembling(self):
        """How zero-shot classification merges `K` prompts per class (`vlzoo.models.ensembling`).

        CLIP's mean of normalised text embeddings by default.
        """
        return EmbeddingMean()

    has_dense_embeddings = False

    @switches.untracked_inference
    def dense_image_embeddings(self, images):
        """Per-patch embeddings `(B, P, D)` in the text embeddings' space, the image's `P` patches in
        row-major order (no prefix tokens): what zero-shot segmentation compares with class prompts.

        Families with patch features in the joint space (SPARC's `g_v(h_v(F_v[p]))`, FILIP's
        projected patch tokens, TIPSv2's and PE-Core's final patch tokens) set
        `has_dense_embeddings` and implement `_dense_image_features(images)`, which this runs as one
        compiled program (as `encode_image` runs the towers). An inference call: on PyTorch no autograd
        graph, unless `images` requires a gradient (see `encode_image`).

        Raises:
            NotImplementedError: the family has no per-patch embeddings.
            ValueError: `images` not `(B, H, W, 3)` pixels of the tower's size, or not finite.
        """
        if not self.has_dense_embeddings:
            raise NotImplementedError(
                f"{type(self).__name__} has no per-patch embeddings (`has_dense_embeddings` is False); "
                "`vlzoo.evaluation.segmentation.patch_families()` lists the families that have them."
            )
        self._check_image_inputs(images)
        return self._inference_function("dense", False)(images)

    def _dense_image_features(self, images):
        """The family's per-patch embeddings `(B, P, D)` of checked `images`: what `dense_image_embeddings`
        compiles. Families that set `has_dense_embeddings` implement it."""
        raise NotImplementedError(f"{type(self).__name__} sets `has_dense_embeddings` without "
                                  "`_dense_image_features`.")

    has_token_alignment = False

    @switches.untracked_inference
    def token_patch_alignment(self, images, texts):
        """Weights `(B, T, P)` of each caption token over its image's `P` patches, pair by pair.

        Families whose tokens align with patches (SPARC's sparse weights,
        FILIP's best matches) set `has_token_alignment` and implement this;
        `vlzoo.viz` draws it. An inference call: on PyTorch no autograd graph,
        unless an argument requires a gradient (see `encode_image`).
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no token-to-patch alignment; SPARC and FILIP models have one."
        )

    def contrastive_loss(self, outputs, rows=None, training=False):
        """The family loss, float32 scalar, from `call`'s outputs.

        Args:
            outputs: `call`'s outputs of the batch (of the global batch in a step over several replicas).
            rows: None for the whole batch's loss; `(start, count)` for one replica's share, its own pairs
                being rows `start .. start + count - 1` of the global batch, where the entries named in
                `replica_local_outputs` hold those rows only. The shares' mean over the replicas must be
                the whole loss: then the averaged gradients are the global loss's. A family that computes
                its own rows against every column needs memory linear in the global batch per device; one
                that ignores `rows` must keep `replica_local_outputs` empty (every replica then computes
                the whole loss).
            training: Keras' flag (True in `fit`'s train step, False in `evaluate`).
        """
        raise NotImplementedError

    # `call`'s outputs that `contrastive_loss(..., rows=...)` reads at this replica's own rows only (SigLIP's
    # images against every caption), or not at all: they are not gathered across replicas, which saves their
    # exchange and memory.
    replica_local_outputs = ()

    # ---------------------------------------------------------- persistence

    # Keras' quantization mode of the weights (`quantize`), None for float weights; recorded in a saved
    # preset's metadata so that `from_preset` quantizes the model it builds before loading them.
    weight_quantization = None

    def quantize(self, mode=None, **kwargs):
        """Keras' `Model.quantize`: with `"int8"`, the towers' and heads' dense kernels become int8 with a
        scale per output channel and their inputs are quantized per call (dynamic int8).

        The mode is recorded (`weight_quantization`), so `save_to_preset` and `from_preset` round-trip the
        quantized model. Quantize a float32 model, for inference: `fit` after it is not supported.

        Example:
        >>> model.quantize("int8"); model.save_to_preset("clip_int8")
        """
        if self.weight_quantization is not None:
            raise ValueError(f"This model is already quantized ({self.weight_quantization!r}).")
        workarounds.warn_if_int8_is_slow(mode)
        with workarounds.frozen_gc():
            super().quantize(mode, **kwargs)
        self.weight_quantization = mode

    # What `vlzoo.from_preset` loaded the weights from (`vlzoo.presets.loading.preset_origin`); `save_to_preset`
    # records it in metadata.json as `base_preset`, and an uploaded preset's model card names it.
    preset_origin = None

    def save_to_preset(self, directory, metadata=None):
        """Writes a preset directory that `vlzoo.from_preset` loads back exactly.

        `metadata`: entries added to its `metadata.json` (e.g. `training={"data": ..., "steps": ...}`).

        Example:
        >>> model.save_to_preset("runs/clip_tiny")
        """
        saving.save_to_preset(self, directory, metadata=metadata)

    def get_config(self):
        config = super().get_config()
        config.update(
            vision=dict(self.vision_config), text=dict(self.text_config),
            embed_dim=self.embed_dim, init_logit_scale=self.init_logit_scale,
            logit_scale_max=self.logit_scale_max,
        )
        return config
