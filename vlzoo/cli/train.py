"""`vlzoo train`: fine-tune a preset on image-caption pairs with `model.fit` and save it as a preset."""

import functools
import io
import math
import os

from vlzoo import plugins
from vlzoo.cli._common import (
    UsageError, _add_caption_keys, _add_command, _add_preset, _check_preset, _load_preset, _naming,
    _non_negative_float, _non_negative_int, _positive_float, _positive_int,
)


def register(sub):
    p = _add_command(
        sub, "train", "fine-tune a preset on image-caption pairs and save it as a preset",
        "Fine-tune with model.fit (the family's own contrastive loss, AdamW without weight decay\n"
        "on biases, norms, embeddings and the logit scale) on\n"
        "vlzoo.data.image_text_dataset(--data, ..., training=True): random resized crops, shuffled,\n"
        "seeded. An epoch is --steps-per-epoch batches (the data repeats), or one pass over a\n"
        "caption file. Then save_to_preset(--out); load it with vlzoo.from_preset(--out) or\n"
        "--preset OUT in the other commands. Runs unchanged under torchrun, with TF_CONFIG or\n"
        "Keras' KERAS_DISTRIBUTION_* variables (docs/distributed.md): --batch-size is then the\n"
        "global batch, each process reads its share of --data, and one process writes --out.",
        ["vlzoo train --preset clip_vit_b32 --data train.csv --epochs 2 --batch-size 64 "
         "--learning-rate 1e-5 --out runs/b32_ft",
         "vlzoo train --preset clip_vit_b16_openai --family sparc --data train.csv --out runs/sparc_openai",
         "vlzoo train --preset clip_tiny --data 'shards/{000..009}.tar' --steps-per-epoch 500 "
         "--warmup-steps 100 --out runs/tiny"],
    )
    _add_preset(p)
    installed = plugins.plugin_families()
    p.add_argument("--family", default=None, metavar="FAMILY",
                   help="train this family (filip, sparc, sparo, llip, stair, flair"
                   + (f", an installed plugin's: {', '.join(installed)}," if installed else "")
                   + " or another registered with a CLIPTransfer) built on the towers of --preset, a CLIP model "
                   "(vlzoo.from_preset(..., family=...); docs/transfer.md)")
    p.add_argument("--new-params-steps", type=_non_negative_int, default=100, metavar="N",
                   help="with --family: first train the parameters the family adds (SPARC's h_v, SPARO's read-outs, "
                   "Llip's mixture tokens and cross-attention, FLAIR's pooling) alone for N steps, everything else "
                   "held, so that a random head does not scramble what the towers know (linear probe, then fine-tune; "
                   "0: no such phase; not for STAIR, whose stages schedule its heads; default: %(default)s)")
    p.add_argument("--new-params-learning-rate", type=_positive_float, default=3e-3, metavar="LR",
                   help="the constant AdamW learning rate of that first phase (default: %(default)s)")
    p.add_argument("--data", required=True, metavar="SOURCE",
                   help="caption file (.csv, .tsv, .jsonl), a directory holding one, or tar shards "
                   "(path, glob, brace range or directory)")
    p.add_argument("--out", required=True, metavar="DIR", help="preset directory the fine-tuned model is saved to")
    p.add_argument("--epochs", type=_positive_int, default=1, help="training epochs (default: %(default)s)")
    p.add_argument("--batch-size", type=_positive_int, default=32,
                   help="pairs per step; the last partial batch is dropped (default: %(default)s)")
    p.add_argument("--learning-rate", type=_positive_float, default=1e-5,
                   help="peak AdamW learning rate (default: %(default)s)")
    p.add_argument("--weight-decay", type=_non_negative_float, default=0.1,
                   help="AdamW decoupled weight decay (default: %(default)s)")
    p.add_argument("--steps-per-epoch", type=_positive_int, default=None,
                   help="batches per epoch, the data repeating as needed; required for tar shards "
                   "(default: one pass over the caption file)")
    p.add_argument("--schedule", default="cosine", choices=("cosine", "constant"),
                   help="learning-rate schedule after the warm-up: cosine decay to 0 over the run, or "
                   "constant (default: %(default)s)")
    p.add_argument("--warmup-steps", type=_non_negative_int, default=0,
                   help="linear warm-up from 0 to --learning-rate over this many optimizer updates (batches, or "
                   "groups of --gradient-accumulation-steps batches; default: %(default)s)")
    p.add_argument("--micro-batch-size", type=_positive_int, default=None, metavar="M",
                   help="gradient caching: run the towers M pairs at a time (a micro-batch's activation memory) "
                   "while the loss contrasts the whole --batch-size exactly; --batch-size must be a multiple of M")
    p.add_argument("--gradient-accumulation-steps", type=_positive_int, default=None, metavar="N",
                   help="average the gradients of N batches per optimizer update (less memory, but each "
                   "batch's loss only contrasts its own pairs: prefer --micro-batch-size; default: none)")
    for tower in ("image", "text"):
        p.add_argument(f"--lock-{tower}", action="store_true",
                       help=f"lock the {tower} tower (LiT; vlzoo.training.lock_tower): its weights do not train")
        p.add_argument(f"--lock-{tower}-unlocked-groups", type=_non_negative_int, default=0, metavar="N",
                       help=f"with --lock-{tower}: leave its last N groups (blocks; the projection is the last) "
                       "trainable, as open_clip's option of that name (default: 0)")
    p.add_argument("--cache-locked", action="store_true",
                   help="with --lock-image and/or --lock-text (wholly locked): compute the locked towers' outputs "
                   "once, from the resized, centre-cropped images (no random crops), and train on them in memory "
                   "(LiT at a fraction of the cost; vlzoo.training.cache_tower)")
    p.add_argument("--lora-rank", type=_positive_int, default=None, metavar="R",
                   help="train LoRA adapters of rank R instead of the weights (vlzoo.training.enable_lora); --out "
                   "gets the merged model")
    p.add_argument("--lora-targets", nargs="+", default=["query", "value"], metavar="NAME",
                   help="with --lora-rank: the block projections to adapt, among query, key, value, output, "
                   "fc1, fc2 (default: query value)")
    p.add_argument("--lora-towers", nargs="+", default=["image", "text"], choices=("image", "text"),
                   help="with --lora-rank: the towers to adapt, image and/or text (default: both)")
    p.add_argument("--lora-alpha", type=_positive_float, default=None, metavar="A",
                   help="with --lora-rank: the update's scale is A / R (default: R, a scale of 1)")
    p.add_argument("--save-adapters", default=None, metavar="FILE",
                   help="with --lora-rank: also write the adapters alone to FILE (.npz; load_lora_weights)")
    p.add_argument("--stair-stages", default=None, metavar="F1,F2,F3|manual",
                   help="STAIR: the shares of the run for its stages 1, 2, 3 (default: the preset's, 0.25,0.25,0.5 "
                   "as the paper's 300K/300K/600K steps), or manual: train the preset's current stage only")
    p.add_argument("--stair-lr-factors", default=None, metavar="A,B,C",
                   help="STAIR: the learning rate's factor per stage (default: the preset's, 1,1,0.1)")
    p.add_argument("--remat", action="store_true",
                   help="recompute the towers' activations in the backward pass (less memory, more time)")
    p.add_argument("--seed", type=_non_negative_int, default=0,
                   help="seed of the data order, the crops and any random initialisation "
                   "(default: %(default)s)")
    _add_caption_keys(p, "column/key of the caption (caption files), or field of a tar sample's .json when it "
                         "has no .txt (default: the first present of caption, text, title)")
    p.add_argument("--backup-dir", default=None, metavar="DIR",
                   help="write the weights, optimizer state and epoch to DIR after every epoch, and resume from "
                   "there when the same command runs again (vlzoo.training.BackupAndRestore)")
    p.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                   help="Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per epoch "
                   "(default: %(default)s)")
    p.set_defaults(func=run)


def run(args, out):
    _check_preset(args.preset)
    # heavy: imports a backend
    import keras

    import vlzoo
    from vlzoo import parallel
    from vlzoo.data import labels
    from vlzoo.models import transfer_families
    from vlzoo.training import BackupAndRestore, configure, enable_lora, save_lora_weights

    parallel.initialize()  # torchrun, TF_CONFIG, KERAS_DISTRIBUTION_*: join the other processes
    writer = parallel.is_writer()
    if not writer:
        out = io.StringIO()  # one process reports; the others train silently

    if args.family is not None and args.family not in transfer_families():
        raise UsageError("--family", f"{args.family!r} is not one of {', '.join(transfer_families())}")
    for tower in ("image", "text"):
        if getattr(args, f"lock_{tower}_unlocked_groups") and not getattr(args, f"lock_{tower}"):
            raise UsageError(f"--lock-{tower}-unlocked-groups", f"needs --lock-{tower}")

    processes = parallel.data_processes()[0]
    if args.batch_size % processes:
        raise UsageError("--batch-size", f"the global batch {args.batch_size} is not a multiple of the {processes} "
                                         "processes that share it")
    if processes > 1 and args.cache_locked:
        raise UsageError("--cache-locked", f"not supported over {processes} processes yet")
    if args.micro_batch_size is not None and (args.batch_size // processes) % args.micro_batch_size:
        raise UsageError("--micro-batch-size", f"{args.micro_batch_size} does not divide --batch-size {args.batch_size}"
                         + (f" shared by {processes} processes" if processes > 1 else ""))
    if args.lora_rank is None:
        for argument, given in (("--save-adapters", args.save_adapters is not None),
                                ("--lora-towers", args.lora_towers != ["image", "text"]),
                                ("--lora-targets", args.lora_targets != ["query", "value"]),
                                ("--lora-alpha", args.lora_alpha is not None)):
            if given:
                raise UsageError(argument, "needs --lora-rank")
    steps = args.steps_per_epoch
    if steps is None:
        with _naming("--data"):
            count = labels.count_pairs(args.data, args.image_key, args.caption_key, args.on_error)
        if count is None:
            raise UsageError("--steps-per-epoch", "required with tar shards (their length is unknown up front)")
        steps = count // args.batch_size
        if steps < 1:
            raise UsageError("--batch-size", f"{args.data} has {count} usable pairs, fewer than one batch of "
                                             f"{args.batch_size}")
    cached_towers = _cached_towers(args)
    total_steps, updates = _run_length(args, steps)

    keras.utils.set_random_seed(args.seed)
    with parallel.scope():  # a tf.distribute strategy's: the model and its optimizer are made in it
        model, new = _load_model(args, out)

        def pipeline(batch_size, num_processes, process_index, repeat=args.steps_per_epoch is not None):
            return vlzoo.data.image_text_dataset(
                args.data, model.tokenizer, model.preprocessor, batch_size, training=not cached_towers,
                seed=args.seed, image_key=args.image_key, caption_key=args.caption_key,
                repeat=repeat, on_error=args.on_error, num_processes=num_processes,
                process_index=process_index,
                **(dict(shuffle=False, drop_remainder=False) if cached_towers else {}),
            )

        if new:
            _train_new_parameters(model, new, functools.partial(pipeline, repeat=True), args, writer, out)

        endless = False
        if cached_towers:  # one process (checked above): the tower outputs are cached from the whole data
            train = pipeline(args.batch_size, 1, 0)
            stats = train.stats
        else:  # this process's share of each global batch (a TensorFlow strategy's: its replicas')
            train, made = parallel.feed(pipeline, args.batch_size)
            stats, endless = made.stats, train is not made
        if cached_towers:
            train = _cache(model, train, cached_towers, args, out)
            steps = len(train["token_ids"]) // args.batch_size
            if steps < 1:
                raise UsageError("--batch-size", f"{args.data} gave {len(train['token_ids'])} readable pairs, fewer "
                                                 f"than one batch of {args.batch_size}")
            train = {key: keras.tree.map_structure(lambda a: a[:steps * args.batch_size], value)
                     for key, value in train.items()}  # whole batches, as the augmented pipeline's
            total_steps, updates = _run_length(args, steps)
        staged = _set_stair_stages(model, args, total_steps)
        if args.lora_rank is not None:
            with _naming("--lora-targets"):
                enable_lora(model, rank=args.lora_rank, targets=args.lora_targets, towers=args.lora_towers,
                            alpha=args.lora_alpha)
        # "constant" is the warm-up followed by a flat rate: a cosine whose floor is the peak.
        configure(model, learning_rate=args.learning_rate, total_steps=updates, warmup_steps=args.warmup_steps,
                  alpha=0.0 if args.schedule == "cosine" else 1.0, weight_decay=args.weight_decay,
                  gradient_accumulation_steps=args.gradient_accumulation_steps, remat=args.remat or None,
                  micro_batch_size=args.micro_batch_size,
                  lock_image=args.lock_image, lock_image_unlocked_groups=args.lock_image_unlocked_groups,
                  lock_text=args.lock_text, lock_text_unlocked_groups=args.lock_text_unlocked_groups)
    print(f"training {args.preset} ({type(model).__name__}, {model.count_params():,} parameters) on {args.data}: "
          f"{args.epochs} epoch(s) x {steps} steps, batch {args.batch_size}"
          + (f" over {processes} processes" if processes > 1 else "") + f", lr {args.learning_rate} "
          f"({args.schedule}, warm-up {args.warmup_steps}), weight decay {args.weight_decay}, "
          f"gradient accumulation {args.gradient_accumulation_steps or 1} ({updates} optimizer updates), "
          f"micro-batch {args.micro_batch_size or args.batch_size}, remat {args.remat}, "
          f"{model.count_params() - sum(math.prod(v.shape) for v in model.trainable_weights):,} parameters locked, "
          f"seed {args.seed}, backend {keras.backend.backend()}", file=out)
    # STAIR's stage schedule splits the run's steps, so it is told them even where the pipeline's length
    # is unknown (images skipped on error).
    # The dataset shuffles itself; the cached arrays are shuffled by `fit`, in whole batches.
    order = dict(batch_size=args.batch_size, shuffle=True) if cached_towers else dict(shuffle=False)
    callbacks = [BackupAndRestore(args.backup_dir)] if args.backup_dir else []
    history = model.fit(train, epochs=args.epochs, steps_per_epoch=steps if staged or endless else args.steps_per_epoch,
                        verbose=args.verbose if writer else 0, callbacks=callbacks, **order)
    if stats.num_skipped:
        print(f"note: {stats.summary()}", file=out)
    losses = history.history.get("loss", [])
    if losses:
        print(f"final loss: {losses[-1]:.4f}", file=out)
    if args.save_adapters is not None:
        parallel.write_once(lambda path: save_lora_weights(model, path), args.save_adapters)
        print(f"saved the LoRA adapters to {args.save_adapters}", file=out)
    # What the run was, for the model card `vlzoo upload` writes (metadata.json's `training`).
    training = {"data": str(args.data), "steps": total_steps, "epochs": args.epochs, "batch_size": args.batch_size,
                "learning_rate": args.learning_rate}
    save = functools.partial(model.save_to_preset, metadata={"training": training})
    parallel.write_once(save, os.path.abspath(args.out))  # Keras writes LoRA kernels merged
    print(f"saved to {os.path.abspath(args.out)}", file=out)
    return 0


def _load_model(args, out):
    """The model to train and, with --family, the new variables to train first (`_train_new_parameters`)."""
    # heavy: imports a backend
    from vlzoo import transfer

    model = _load_preset(args.preset, out)
    if args.family is None or args.family == model.family:
        return model, []
    with _naming("--family"):
        model, report = transfer.from_clip(model, args.family, verbose=False)
    print(report.summary(args.family), file=out)
    new = transfer.new_variables(model, report)
    if not new or args.new_params_steps == 0:
        return model, []
    if args.family == "stair" or args.cache_locked:
        reason = "STAIR's stages schedule them" if args.family == "stair" else "--cache-locked trains on cached towers"
        print(f"note: the new parameters are not trained first ({reason}); they start at the family's "
              "initialisation", file=out)
        return model, []
    return model, new


def _train_new_parameters(model, new, pipeline, args, writer, out):
    """Trains the variables `new` alone for --new-params-steps steps at a constant
    --new-params-learning-rate, every other variable held; then makes the others trainable again."""
    # heavy: imports a backend
    from vlzoo import parallel
    from vlzoo.training import configure

    held = [variable for variable in model.trainable_variables if all(variable is not v for v in new)]
    count = sum(math.prod(variable.shape) for variable in new)
    print(f"training the {count:,} new parameters first: {args.new_params_steps} steps at lr "
          f"{args.new_params_learning_rate} (constant), the other {model.count_params() - count:,} held", file=out)
    for variable in held:
        variable.trainable = False
    try:
        configure(model, learning_rate=args.new_params_learning_rate, total_steps=args.new_params_steps,
                  alpha=1.0, weight_decay=args.weight_decay, micro_batch_size=args.micro_batch_size)
        data, _ = parallel.feed(pipeline, args.batch_size)
        history = model.fit(data, epochs=1, steps_per_epoch=args.new_params_steps, shuffle=False,
                            verbose=args.verbose if writer else 0)
    finally:
        for variable in held:
            variable.trainable = True
    print(f"new parameters trained: loss {history.history['loss'][-1]:.4f}", file=out)


def _run_length(args, steps):
    """`(total_steps, updates)` of `steps` batches per epoch, checked against the schedule's options. The
    learning-rate schedule counts optimizer updates: one per --gradient-accumulation-steps batches."""
    total_steps = steps * args.epochs
    accumulation = args.gradient_accumulation_steps or 1
    updates = total_steps // accumulation
    if updates < 1:
        raise UsageError("--gradient-accumulation-steps", f"{accumulation} batches per update is more than the "
                                                          f"run's {total_steps} steps")
    if args.warmup_steps >= updates and args.warmup_steps > 0:
        raise UsageError("--warmup-steps", f"{args.warmup_steps} is not below the run's {updates} optimizer updates "
                                           f"({total_steps} steps / {accumulation})")
    return total_steps, updates


def _cached_towers(args):
    """The towers --cache-locked computes once (the wholly locked ones), after checking what it cannot serve."""
    if not args.cache_locked:
        return []
    towers = [tower for tower in ("image", "text") if getattr(args, f"lock_{tower}")]
    if not towers:
        raise UsageError("--cache-locked", "needs --lock-image or --lock-text: only a locked tower's outputs stay "
                                           "the same through training")
    for tower in towers:
        if getattr(args, f"lock_{tower}_unlocked_groups"):
            raise UsageError("--cache-locked", f"the {tower} tower is not wholly locked "
                                               f"(--lock-{tower}-unlocked-groups): its outputs change as it trains")
        if args.lora_rank is not None and tower in args.lora_towers:
            raise UsageError("--cache-locked", f"--lora-towers adapts the locked {tower} tower: its outputs change "
                                               "as it trains")
    if args.steps_per_epoch is not None:
        raise UsageError("--steps-per-epoch", "with --cache-locked an epoch is one pass over the cached pairs")
    return towers


def _cache(model, data, towers, args, out):
    """`data` (one unaugmented pass) with the locked `towers`' outputs computed once (`cache_tower`)."""
    # heavy: imports a backend
    import keras

    from vlzoo.training import cache_tower, lock_tower

    for tower in towers:
        lock_tower(model, tower)  # before caching; `configure` locks it again
        data = cache_tower(model, data, tower, verbose=args.verbose == 1)
    size = sum(value.nbytes for value in keras.tree.flatten(data))
    print(f"cached the locked {' and '.join(towers)} tower outputs of {len(data['token_ids'])} pairs "
          f"({size / 2**20:.1f} MB in memory); images are resized and centre-cropped, not randomly cropped", file=out)
    return data


def _numbers(text, argument):
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(argument, f"expected comma-separated numbers; got {text!r}") from None


def _set_stair_stages(model, args, total_steps):
    """Applies --stair-stages / --stair-lr-factors to a STAIR model and checks its stages against the run.

    Returns whether `fit` runs STAIR's stage schedule."""
    # heavy: imports a backend
    from vlzoo.models import stair_stages
    from vlzoo.models.stair import STAIR

    if not isinstance(model, STAIR):
        for argument, value in (("--stair-stages", args.stair_stages), ("--stair-lr-factors", args.stair_lr_factors)):
            if value is not None:
                raise UsageError(argument, f"{args.preset} is a {type(model).__name__} model, not STAIR")
        return False
    if model.training_started:
        for argument, value in (("--stair-stages", args.stair_stages), ("--stair-lr-factors", args.stair_lr_factors)):
            if value is not None and value != "manual":
                raise UsageError(argument, f"{args.preset} is past its stage schedule's start (stage {model.stage}): "
                                           "it trains its current stage; pass --stair-stages manual or nothing")
        return False
    if args.stair_stages == "manual":
        if args.stair_lr_factors is not None:
            raise UsageError("--stair-lr-factors", "the per-stage factors need the schedule, not --stair-stages manual")
        model.stage_fractions = None
    elif args.stair_stages is not None:
        with _naming("--stair-stages"):
            model.stage_fractions = stair_stages.check_stage_fractions(_numbers(args.stair_stages, "--stair-stages"))
    if args.stair_lr_factors is not None:
        with _naming("--stair-lr-factors"):
            model.stage_learning_rate_factors = stair_stages.check_learning_rate_factors(
                _numbers(args.stair_lr_factors, "--stair-lr-factors"))
    if not model.schedule_pending:
        return False
    with _naming("--stair-stages"):
        lengths = stair_stages.stage_lengths(total_steps, model.stage_fractions)
    accumulation = args.gradient_accumulation_steps or 1
    if any(length % accumulation for length in lengths):
        raise UsageError("--gradient-accumulation-steps", f"STAIR's stages of {lengths} steps must each be a multiple "
                                                          f"of {accumulation}, so that each ends on an optimizer update")
    shortest = min(lengths) // accumulation
    if args.warmup_steps >= shortest and args.warmup_steps > 0:
        raise UsageError("--warmup-steps", f"{args.warmup_steps} is not below STAIR's shortest stage ({shortest} "
                                           f"optimizer updates; the stages have {lengths} steps), each of which "
                                           "warms up anew")
    return True

