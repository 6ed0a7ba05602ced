"""STAIR (Chen et al., EMNLP 2023): sparse text and image representations in grounded tokens."""

import math

import keras
import numpy as np
from keras import ops

from vlzoo._backends import switches
from vlzoo.families import CLIPTransfer, Family, register_family
from vlzoo.layers.sparse_vocab import SparseVocabHead
from vlzoo.losses import l2_normalize
from vlzoo.losses.stair import flops_regularizer, flops_weight, stair_contrastive_loss
from vlzoo.losses.stair import stair_logits
from vlzoo.models import stair_stages
from vlzoo.models.base import ContrastiveModel
from vlzoo.tokenizers import BERT_UNCASED, BERT_UNCASED_VOCABULARY_SIZE, CLIP_BPE_VOCABULARY_SIZE, bundled_tokenizer

STAGES = (1, 2, 3)
STAGE2_IMAGE_EMBEDS = ("snapshot", "shared")
STAGE1_FLOPS_ON = ("masked", "unmasked")
# BERT uncased: [PAD] 0, [unused0-98] 1-99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103,
# [unused99-993] 104-998.
BERT_SPECIAL_IDS = 999
METRICS = ("loss_con", "flops_img", "flops_txt", "nnz_img", "nnz_txt", "flops_weight")


@keras.saving.register_keras_serializable(package="vlzoo")
class STAIR(ContrastiveModel):
    """STAIR: both towers map to non-negative, sparse, vocabulary-sized vectors.

    Towers: a ViT (CLS token, `ln_pre`, exact GELU) and a bidirectional text
    transformer with a padding mask (our choice; `text={"causal": True}` for
    CLIP's). Head (`SparseVocabHead`, one per tower): BERT's MLM transform
    `LayerNorm(GELU(W h + c))` at every position, a bias-free bridge to the
    text width on the image side, and a decoder tied to the text token
    embedding `E_tok` for both towers, max-pooled over positions:
    `ENC = log1p(relu(max_j p(h_j)))` (`vlzoo.losses.stair_pool`), `(B, V)`.
    The vocabulary logits are reduced in `num_chunks` vocabulary blocks.

    Score (`similarity`): `exp(logit_scale) * cos(ENC_I, ENC_T)` with an
    epsilon guard (an all-zero vector scores 0). Loss:
    `L_con + l_1(t) F(ENC_I) + l_2(t) F(ENC_T)` with the FLOPs regulariser
    `F` and SPLADE's quadratic ramp `l(t) = l * min(1, t / T)^2`.

    Training stages (the paper's three-stage schedule):
    1. everything trains; the text vector in the loss is masked to the ids of
       its own caption (`caption_mask`), so the image learns to put its
       weight on real words.
    2. the image tower (ViT and its head) is frozen; by default its decoder
       reads a frozen snapshot of `E_tok` taken on entering the stage
       (`stage2_image_embed="snapshot"`), so image embeddings stay
       bit-identical while the text tower (and `E_tok`) trains; no mask.
       The image FLOPs term is constant then: logged, left out of the loss.
    3. everything trains, no mask.

    One `fit` trains all three (`stage_fractions`, 0.25 / 0.25 / 0.5 of its
    steps as the paper's 300K / 300K / 600K) when it starts from a fresh
    model (stage 1, `global_step` 0): each stage with a fresh optimizer
    rebuilt from the compiled one (`stair_stages.stage_optimizer`: new
    state, the rate times `stage_learning_rate_factors`, 0.1 in stage 3 as
    the paper's 1e-4 for 1e-3, a schedule with `total_steps` restarted over
    the stage). A boundary inside an epoch ends that epoch early and the
    next stage starts a new pass over `x`; the returned history has one row
    per (possibly partial) epoch and a `stage` entry. The run's length is
    `epochs * steps_per_epoch` (from the data when it has a length; pass
    `steps_per_epoch` for a generator). Callbacks see one `fit` per stage.
    `set_stage` takes the stages by hand instead (it sets `stage_fractions`
    to None); later `fit` calls then train the current stage only.

    Training logs, besides `loss`: `loss_con` (the contrastive term),
    `flops_img` / `flops_txt` (the regulariser values), `nnz_img` / `nnz_txt`
    (active terms per vector of the embeddings in the loss) and
    `flops_weight` (`l_2(t)`).

    Step counters `global_step` and `stage_step` are model weights (saved,
    carried across re-compiles; the optimizer's `iterations` restarts with
    each stage's fresh optimizer, so a learning-rate schedule restarts per
    stage as in the paper). They advance once per training loss evaluation
    (each `fit` step). The FLOPs ramp reads `global_step`, or `stage_step`
    with `restart_per_stage=True`.

    Args:
        vision, text: tower arguments (no projections; `text` needs
            `vocabulary_size`, which is `V`).
        embed_dim: must equal the text vocabulary size when given (the
            embedding is the vocabulary); None takes it from `text`.
        init_logit_scale: initial log-scale, `ln(1 / 0.07)` (CLIP's; the
            temperature is unstated in the paper). Clamped at `ln 100`.
        stage: training stage 1, 2 or 3 (1).
        image_flops_weight, text_flops_weight: `l_1`, `l_2` (1e-3 each).
        flops_warmup_steps: ramp length `T` (50,000, SPLADE's; scale it to
            short runs; 0 for no ramp).
        restart_per_stage: ramp from `stage_step` instead of `global_step`
            (False: one ramp from the start of stage 1, full weight after).
        stage2_image_embed: "snapshot" (default) or "shared" (the image head
            reads the live `E_tok` in stage 2 as well).
        stage1_flops_on: "masked" (default, our choice) or "unmasked": which
            text vector the stage-1 FLOPs term sees.
        excluded_token_ids: ids never counted in the stage-1 caption mask:
            "bert" (default: the 999 BERT uncased specials and `[unused*]`
            ids 0-998), None (paper-faithful: none), or a list of ids.
        zero_excluded: also zero the excluded ids in every embedding, all
            stages (False: the full vocabulary is the output space).
        pool_include_cls: pool the image's CLS position too (True; the
            text pools every real position, `[CLS]` / `[SEP]` included).
        head_layer_norm_epsilon: epsilon of the heads' LayerNorm (1e-5).
        cosine_epsilon: lower bound on the norms in the cosine (1e-6).
        num_chunks: vocabulary blocks of the heads' pooling (None: one).
        remat: rematerialise each block in the backward pass.
        stage_fractions: shares of one `fit`'s steps for stages 1, 2, 3
            (each > 0, sum 1; default (0.25, 0.25, 0.5)); None: no
            schedule, `fit` trains the current stage.
        stage_learning_rate_factors: multipliers of the compiled learning
            rate per stage ((1, 1, 0.1)).

    `encode_image` / `encode_text` return `{"embeds": (B, V)}`, float32
    non-negative vectors; `vlzoo.retrieval.top_terms` reads their heaviest
    `(token, weight)` pairs.

    Example:
    >>> model = vlzoo.from_preset("stair_tiny")
    >>> top_terms(model.encode_image(images)["embeds"], k=5, tokenizer=model.tokenizer)[0]  # [("dog", 1.7), ...]
    >>> model.compile(optimizer="adamw"); model.fit(dataset, epochs=10)   # stages 1, 2, 3
    >>> model.stage, model.history.history["stage"][-1]   # (3, 3)
    """

    family = "stair"
    image_tower_keys = text_tower_keys = ("tokens",)
    training_state_config_keys = ("stage", "stage_fractions", "stage_learning_rate_factors")
    extra_layout_rules = (
        ("(image|text)_head/transform/kernel", (None, "model")),
        ("(image|text)_head/transform/bias", ("model",)),
        ("image_head/bridge/kernel", ("model", None)),
    )
    vision_defaults = dict(
        num_prefix_tokens=1, pooling="cls", use_pre_norm=True, patch_bias=False, projection_bias=False,
        layer_norm_epsilon=1e-5, activation="gelu", output_dim=None,
    )
    text_defaults = dict(
        causal=False, pooling="first", use_padding_mask=True, projection_bias=False,
        layer_norm_epsilon=1e-5, activation="gelu", output_dim=None,
    )

    def __init__(
        self, vision, text, embed_dim=None, init_logit_scale=math.log(1 / 0.07), stage=1,
        image_flops_weight=1e-3, text_flops_weight=1e-3, flops_warmup_steps=50_000, restart_per_stage=False,
        stage2_image_embed="snapshot", stage1_flops_on="masked", excluded_token_ids="bert",
        zero_excluded=False, pool_include_cls=True, head_layer_norm_epsilon=1e-5, cosine_epsilon=1e-6,
        num_chunks=None, remat=True, stage_fractions=stair_stages.STAGE_FRACTIONS,
        stage_learning_rate_factors=stair_stages.STAGE_LEARNING_RATE_FACTORS, **kwargs,
    ):
        vocabulary_size = text["vocabulary_size"]
        if embed_dim is not None and embed_dim != vocabulary_size:
            raise ValueError(
                f"STAIR's embedding is the vocabulary: `embed_dim` must equal `text['vocabulary_size']` "
                f"({vocabulary_size}) or be None; received {embed_dim}."
            )
        for name, value, choices in (("stage", stage, STAGES),
                                     ("stage2_image_embed", stage2_image_embed, STAGE2_IMAGE_EMBEDS),
                                     ("stage1_flops_on", stage1_flops_on, STAGE1_FLOPS_ON)):
            if value not in choices:
                raise ValueError(f"`{name}` must be one of {choices}; received {value!r}.")
        if not isinstance(flops_warmup_steps, int) or flops_warmup_steps < 0:
            raise ValueError(f"`flops_warmup_steps` must be an int >= 0; received {flops_warmup_steps!r}.")
        super().__init__(vision, text, vocabulary_size, init_logit_scale=init_logit_scale, **kwargs)
        self.excluded_token_ids = _check_excluded(excluded_token_ids, vocabulary_size)
        self.image_flops_weight = image_flops_weight
        self.text_flops_weight = text_flops_weight
        self.flops_warmup_steps = flops_warmup_steps
        self.restart_per_stage = restart_per_stage
        self.stage2_image_embed = stage2_image_embed
        self.stage1_flops_on = stage1_flops_on
        self.zero_excluded = zero_excluded
        self.pool_include_cls = pool_include_cls
        self.head_layer_norm_epsilon = head_layer_norm_epsilon
        self.cosine_epsilon = cosine_epsilon
        self.num_chunks = num_chunks
        self.remat = remat
        self.stage_fractions = stair_stages.check_stage_fractions(stage_fractions)
        self.stage_learning_rate_factors = stair_stages.check_learning_rate_factors(stage_learning_rate_factors)
        keep = np.ones((vocabulary_size,), "float32")
        keep[_excluded_ids(self.excluded_token_ids)] = 0.0
        self._keep = keep  # numpy: 0 at the excluded ids

        width = self.text.hidden_dim
        head = dict(vocabulary_size=vocabulary_size, layer_norm_epsilon=head_layer_norm_epsilon,
                    num_chunks=num_chunks, remat=remat, dtype=self.dtype_policy)
        self.image_head = SparseVocabHead(self.vision.hidden_dim, width, name="image_head", **head)
        self.text_head = SparseVocabHead(width, width, name="text_head", **head)
        self.image_head.build()
        self.text_head.build()
        counter = dict(shape=(), dtype="int32", initializer="zeros", trainable=False)
        self.global_step = self.add_weight(name="global_step", **counter)
        self.stage_step = self.add_weight(name="stage_step", **counter)
        self.stage_metrics = [keras.metrics.Mean(name=name) for name in METRICS]
        self.frozen_token_embeddings = None
        self.stage = None
        self._compile_kwargs = None
        self._image_side_flags = None  # the image side's variables' trainable flags while stage 2 freezes it
        self._enter_stage(stage)

    # ------------------------------------------------------------- stages

    @property
    def token_embeddings(self):
        """`E_tok`, the text token-embedding table `(V, D_t)` every decoder is tied to."""
        return self.text.token_embedding.embeddings

    def _image_side_variables(self):
        return self.vision.weights + self.image_head.weights

    def _enter_stage(self, stage):
        """Stage 2 freezes the image tower and head; leaving it gives every variable back the trainable
        flag it had (a tower locked by `lock_tower` or frozen for LoRA stays so)."""
        frozen = stage == 2
        if frozen and self._image_side_flags is None:
            self._image_side_flags = tuple(v.trainable for v in self._image_side_variables())
            self.vision.trainable = self.image_head.trainable = False
        elif not frozen and self._image_side_flags is not None:
            self.vision.trainable = self.image_head.trainable = True
            for variable, flag in zip(self._image_side_variables(), self._image_side_flags, strict=True):
                variable.trainable = flag
            self._image_side_flags = None
        snapshot = frozen and self.stage2_image_embed == "snapshot"
        if snapshot and self.frozen_token_embeddings is None:
            table = self.token_embeddings
            self.frozen_token_embeddings = self.add_weight(
                name="frozen_token_embeddings", shape=table.shape, trainable=False,
                initializer=lambda shape, dtype=None: ops.copy(table.value),
            )
        elif not snapshot and self.frozen_token_embeddings is not None:
            del self.frozen_token_embeddings
            self.frozen_token_embeddings = None
        self.stage = stage

    def set_stage(self, stage, optimizer=None):
        """Switches to training stage 1, 2 or 3 by hand (see the class docstring).

        Entering stage 2 freezes the image tower and snapshots `E_tok` for
        its decoder; leaving it unfreezes the tower and drops the snapshot.
        `stage_step` restarts at 0; `global_step` carries on. It turns the
        one-`fit` schedule off (`stage_fractions = None`): `fit` then trains
        the current stage. Keras fixes the trainable variables at `compile`
        time, so a compiled model is re-compiled here with the same
        arguments and `optimizer`, or by default a fresh optimizer of the
        same config (its state and `iterations` reset, so a learning-rate
        schedule restarts per stage; pass the stage's own optimizer for
        stage 3's lower rate). A model not compiled yet is compiled with
        `optimizer` when one is given; otherwise the later `compile` picks
        the stage up. Setting the current stage again changes nothing (the
        stage-2 snapshot is kept) unless an `optimizer` is given.

        Args:
            stage: 1, 2 or 3.
            optimizer: optional optimizer for the (re-)compile.

        Returns:
            The model.

        Example:
        >>> model.set_stage(1, keras.optimizers.Lamb(1e-3)); model.fit(data, epochs=...)
        >>> model.set_stage(2); model.fit(data, epochs=...)
        >>> model.set_stage(3, keras.optimizers.Lamb(1e-4)); model.fit(data, epochs=...)
        """
        self._switch_stage(stage, optimizer)
        self.stage_fractions = None
        return self

    def _switch_stage(self, stage, optimizer=None):
        """`set_stage` without turning the schedule off."""
        if stage not in STAGES:
            raise ValueError(f"`stage` must be one of {STAGES}; received {stage!r}.")
        changed = stage != self.stage
        if changed:
            self._enter_stage(stage)
            self.stage_step.assign(0)
        if self.compiled and (changed or optimizer is not None):
            if optimizer is None:
                optimizer = type(self.optimizer).from_config(self.optimizer.get_config())
            self.compile(optimizer, **self._compile_kwargs)
        elif optimizer is not None:
            self.compile(optimizer)

    def compile(self, optimizer="adamw", **kwargs):
        """`ContrastiveModel.compile`; the arguments are kept for the stages' re-compiles."""
        self._compile_kwargs = dict(kwargs)
        super().compile(optimizer, **kwargs)

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            initial_epoch=0, steps_per_epoch=None, **kwargs):
        """`keras.Model.fit`; from a fresh model with `stage_fractions` set, stages 1, 2, 3 in one run.

        The run's `T = (epochs - initial_epoch) * steps_per_epoch` steps are
        split by `stair_stages.stage_lengths`; each stage is compiled with
        `stair_stages.stage_optimizer` and trained until its last step. Where
        the data has no length (a generator), pass `steps_per_epoch`.

        Returns:
            a `History` over all stages, with a `stage` entry per epoch row.
        """
        arguments = dict(batch_size=batch_size, verbose=verbose, steps_per_epoch=steps_per_epoch, **kwargs)
        if not self._schedule_applies():
            return super().fit(x, y, epochs=epochs, callbacks=callbacks, initial_epoch=initial_epoch, **arguments)
        if any(isinstance(callback, keras.callbacks.BackupAndRestore) for callback in callbacks or []):
            raise ValueError(
                "STAIR's one-`fit` stage schedule cannot resume from `BackupAndRestore` (each stage is a `fit` of "
                "its own, with a fresh optimizer): train the stages by hand with `set_stage`, each `fit` resumable."
            )
        per_epoch = stair_stages.steps_per_epoch(x, batch_size, steps_per_epoch, kwargs.get("validation_split", 0.0))
        if per_epoch is None:
            raise ValueError(
                "STAIR's stage schedule splits the run's steps, and this `x` does not tell how many there are: "
                "pass `steps_per_epoch` to `fit`, or set `model.stage_fractions = None` (or call `set_stage`) "
                "to train one stage."
            )
        lengths = stair_stages.stage_lengths((epochs - initial_epoch) * per_epoch, self.stage_fractions)
        execution, accumulation = int(self.steps_per_execution or 1), int(self.optimizer.gradient_accumulation_steps or 1)
        if any(length % math.lcm(execution, accumulation) for length in lengths):
            raise ValueError(
                f"STAIR's stages of {lengths} steps must be multiples of `steps_per_execution` ({execution}) and of "
                f"the optimizer's `gradient_accumulation_steps` ({accumulation}): each stage ends on an optimizer "
                "update, since the next one starts a fresh optimizer."
            )
        template, parts, epoch = self.optimizer, [], initial_epoch
        for stage, length, factor in zip(STAGES, lengths, self.stage_learning_rate_factors):
            self._switch_stage(stage, stair_stages.stage_optimizer(template, factor, length))
            stop = stair_stages.StopAfter(length)
            part = super().fit(x, y, epochs=epoch + -(-length // per_epoch), callbacks=[stop, *(callbacks or [])],
                               initial_epoch=epoch, **arguments)
            parts.append((stage, part))
            epoch += len(part.epoch)
        self.history = stair_stages.merged_history(self, parts)
        return self.history

    @property
    def training_started(self):
        """Whether the model has left the start of stage 1 (a later stage, or `global_step` > 0)."""
        return self.stage != 1 or int(ops.convert_to_numpy(self.global_step)) > 0

    @property
    def schedule_pending(self):
        """Whether the next `fit` (once compiled) runs the three stages: a schedule is set and training has
        not started."""
        return self.stage_fractions is not None and not self.training_started

    def _schedule_applies(self):
        return self.compiled and self.schedule_pending

    # ------------------------------------------------------------- features

    def _image_table(self):
        """The image decoder's table: the stage-2 snapshot, else the live `E_tok`."""
        if self.frozen_token_embeddings is not None:
            return self.frozen_token_embeddings
        return self.token_embeddings

    def _restrict(self, embeds):
        return embeds * ops.convert_to_tensor(self._keep) if self.zero_excluded else embeds

    def _image_features(self, images, training=None):
        tokens = self._image_tower(images, training=training)["tokens"]
        if not self.pool_include_cls:
            tokens = tokens[:, self.vision.num_prefix_tokens:]
        return {"embeds": self._restrict(self.image_head(tokens, self._image_table()))}

    def _text_features(self, inputs, training=None):
        mask = ops.cast(self._padding_mask(inputs), "bool")
        tokens = self._text_tower(inputs, training=training, mask=mask)["tokens"]
        return {"embeds": self._restrict(self.text_head(tokens, self.token_embeddings, mask))}

    @switches.untracked_inference
    def image_token_logits(self, images):
        """Per-position vocabulary logits of the image head `(B, P_total, V)` (materialised; App. E.1 maps)."""
        self._check_image_inputs(images)
        return self.image_head.logits(self.vision(images)["tokens"], self._image_table())

    @switches.untracked_inference
    def text_token_logits(self, texts):
        """Per-position vocabulary logits of the text head `(B, T, V)` (materialised; padded positions included,
        the pooling leaves them out).

        Args:
            texts: tokenizer dict (`token_ids`, `padding_mask`, `(B, T)`) or strings.
        """
        inputs = self._tokenize(texts)
        self._check_text_inputs(inputs)
        mask = ops.cast(self._padding_mask(inputs), "bool")
        return self.text_head.logits(self._text_tower(inputs, mask=mask)["tokens"], self.token_embeddings)

    def normalize_vectors(self, vectors):
        """L2 normalisation with STAIR's guard: an all-zero sparse vector stays zero."""
        return l2_normalize(vectors, epsilon=self.cosine_epsilon)

    def caption_mask(self, texts):
        """`MASK(y)` `(B, V)` float32: 1 at the ids of each caption's real tokens, except the excluded ids.

        The stage-1 mask (eq. 8) and the text-encoder-free bag of words of
        App. E.2 (`score(encode_image(x), {"embeds": caption_mask(y)})`). Built from the
        token ids after truncation, repeated ids counted once.

        Args:
            texts: tokenizer dict (`token_ids`, `padding_mask`, `(B, T)`) or strings.
        """
        inputs = self._tokenize(texts)
        self._check_text_inputs(inputs)
        ids = ops.cast(inputs["token_ids"], "int32")
        valid = ops.cast(self._padding_mask(inputs), "float32")
        batch, length = ops.shape(ids)[0], ops.shape(ids)[1]
        rows = ops.broadcast_to(ops.arange(batch, dtype="int32")[:, None], (batch, length))
        indices = ops.stack([ops.reshape(rows, (-1,)), ops.reshape(ids, (-1,))], axis=1)
        counts = ops.scatter(indices, ops.reshape(valid, (-1,)), (batch, self.embed_dim))
        return ops.cast(ops.greater(counts, 0.0), "float32") * ops.convert_to_tensor(self._keep)

    def call(self, inputs, training=False):
        outputs = super().call(inputs, training=training)
        if self.stage == 1:
            outputs["caption_mask"] = self.caption_mask(inputs)
        return outputs

    # --------------------------------------------------------------- scores

    def score(self, image_embeds, text_embeds):
        """`exp(logit_scale) * cos(ENC_I, ENC_T)`, `(N_images, N_texts)` float32."""
        image, text = self.check_embeds(image_embeds, "image"), self.check_embeds(text_embeds, "text")
        return stair_logits(image["embeds"], text["embeds"], self.logit_scale_value(), self.cosine_epsilon)

    def flops_weights(self):
        """`(l_1(t), l_2(t))`, the ramped FLOPs weights at the current step."""
        step = self.stage_step if self.restart_per_stage else self.global_step
        return (flops_weight(step, self.image_flops_weight, self.flops_warmup_steps),
                flops_weight(step, self.text_flops_weight, self.flops_warmup_steps))

    def loss_embeddings(self, outputs):
        """The `(image, text)` embeddings the stage's contrastive term compares
        (in stage 1 the text masked to its caption's ids)."""
        text = outputs["text_embeds"]
        if "caption_mask" in outputs:
            text = text * outputs["caption_mask"]
        return outputs["image_embeds"], text

    def contrastive_loss(self, outputs, rows=None, training=False):
        """The contrastive term plus the FLOPs regularisers; with `rows`, those rows' share of the contrastive
        term, and the regularisers of the global batch (not a mean over rows: every replica adds them whole).
        Its `contrastive` metric records the replica's share: averaged over the replicas under
        tf.distribute, rank 0's own on PyTorch."""
        return self._loss(outputs, rows)

    def _loss(self, outputs, rows):
        """The stage's loss, its contrastive term the share of `rows` (None: the whole batch's)."""
        image, text = self.loss_embeddings(outputs)
        weight_img, weight_txt = self.flops_weights()
        contrastive = stair_contrastive_loss(image, text, outputs["logit_scale"], self.cosine_epsilon, rows=rows)
        flops_img = flops_regularizer(image)
        flops_txt = flops_regularizer(text if self.stage1_flops_on == "masked" else outputs["text_embeds"])
        loss = contrastive + weight_txt * flops_txt
        if self.stage != 2:
            loss = loss + weight_img * flops_img
        values = (contrastive, flops_img, flops_txt, _active_terms(image), _active_terms(text), weight_txt)
        for metric, value in zip(self.stage_metrics, values):
            metric.update_state(value)
        return loss

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        if training:
            self.global_step.assign_add(1)
            self.stage_step.assign_add(1)
        return loss

    # -------------------------------------------------------------- presets

    def default_tokenizer(self):
        """The bundled BERT uncased WordPiece for a 30,522-token text tower."""
        if self.text.vocabulary_size == BERT_UNCASED_VOCABULARY_SIZE:
            return bundled_tokenizer(BERT_UNCASED, self.text.sequence_length)
        return super().default_tokenizer()

    def get_config(self):
        config = super().get_config()
        config.update(
            stage=self.stage, image_flops_weight=self.image_flops_weight,
            text_flops_weight=self.text_flops_weight, flops_warmup_steps=self.flops_warmup_steps,
            restart_per_stage=self.restart_per_stage, stage2_image_embed=self.stage2_image_embed,
            stage1_flops_on=self.stage1_flops_on, excluded_token_ids=self.excluded_token_ids,
            zero_excluded=self.zero_excluded, pool_include_cls=self.pool_include_cls,
            head_layer_norm_epsilon=self.head_layer_norm_epsilon, cosine_epsilon=self.cosine_epsilon,
            num_chunks=self.num_chunks, remat=self.remat, stage_fractions=self.stage_fractions,
            stage_learning_rate_factors=self.stage_learning_rate_factors,
        )
        return config


def _active_terms(embeds):
    """Mean number of non-zero entries per row."""
    return ops.mean(ops.sum(ops.cast(ops.greater(embeds, 0.0), "float32"), axis=1))


def _excluded_ids(excluded_token_ids):
    """The ids an `excluded_token_ids` config value names (list of int)."""
    if excluded_token_ids == "bert":
        return list(range(BERT_SPECIAL_IDS))
    return list(excluded_token_ids or [])


def _check_excluded(excluded_token_ids, vocabulary_size):
    """The config value of `excluded_token_ids`: "bert", None or a sorted list of ids."""
    if excluded_token_ids is None or excluded_token_ids == "bert":
        if excluded_token_ids == "bert" and vocabulary_size < BERT_SPECIAL_IDS:
            raise ValueError(
                f"`excluded_token_ids='bert'` leaves out ids 0-{BERT_SPECIAL_IDS - 1} (BERT uncased specials), "
                f"but the vocabulary has only {vocabulary_size} ids; pass a list of ids or None."
            )
        return excluded_token_ids
    ids = sorted({int(i) for i in excluded_token_ids})
    if ids and (ids[0] < 0 or ids[-1] >= vocabulary_size):
        raise ValueError(
            f"`excluded_token_ids` must lie in [0, {vocabulary_size}); received values in [{ids[0]}, {ids[-1]}]."
        )
    return ids


# CLIP BPE's <|startoftext|> and <|endoftext|>: not words, so never terms of a STAIR vector.
CLIP_BPE_SPECIAL_IDS = (49406, 49407)


def _configure_from_clip(config, clip):
    """From CLIP: CLIP BPE's start and end tokens are left out of the vectors."""
    bpe = config["text"]["vocabulary_size"] == CLIP_BPE_VOCABULARY_SIZE
    config["excluded_token_ids"] = list(CLIP_BPE_SPECIAL_IDS) if bpe else None


register_family(Family(
    "stair", STAIR, score_loss="softmax",
    from_clip=CLIPTransfer(logit_scale=True, configure=_configure_from_clip),
))
