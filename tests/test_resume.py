"""Exact resume and determinism of `fit`, on the active backend.

An interrupted run resumed from Keras' own checkpoints (`keras.callbacks.BackupAndRestore`, or
`ModelCheckpoint` weights with the optimizer's state plus `initial_epoch`) ends with the same
weights, optimizer state and step counters, bit for bit, as the same run without interruption;
measured bit-exact on all three backends on CPU, so the tests ask for that. Resumption is per
epoch (Keras restarts an interrupted epoch from its first batch) and needs a dataset that yields
the same batches per epoch; see docs/finetuning.md, "Resuming training".

With a fixed seed, two runs of `fit` (seeded random initialisation, shuffled batches) give
identical weights.
"""

import keras
import numpy as np
import pytest
from conftest import tiny_batch, to_numpy
from margins import shallow_towers, tiny_family_model

import vlzoo
from vlzoo.training import configure

# Two steps per epoch over 8 pairs; the run stops at the end of the first epoch (the warm-up's two steps done), and
# resuming it must restore the step count that the schedule reads for the second.
EPOCHS, CRASH_AFTER, BATCH = 2, 1, 4


class Interrupt(Exception):
    pass


class CrashAfter(keras.callbacks.Callback):
    """Counts training steps; raises `Interrupt` at the end of epoch `epochs` (None: never)."""

    def __init__(self, epochs=None):
        super().__init__()
        self.epochs, self.steps = epochs, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epochs:
            raise Interrupt


def _model(family):
    """The family's tiny preset (one block per tower), seeded, with the papers' optimizer: AdamW, warm-up + cosine (so
    resuming must restore the step count too; STAIR's FLOPs ramp reads its own step counters). STAIR's vocabulary is
    cut to 32 entries (`tiny_family_model`): resuming does not depend on its size, and its 30,522-entry table, with
    the optimizer's two moments of it, was most of each step's work and of each backup written."""
    keras.utils.set_random_seed(11)
    model = tiny_family_model(family)
    if family == "stair":  # one stage, set by hand: the one-`fit` schedule refuses BackupAndRestore
        model.stage_fractions = None
    configure(model, learning_rate=1e-3, total_steps=8, warmup_steps=2)
    return model


def _data(model):
    return tiny_batch(8, seed=3, vocabulary_size=model.text.vocabulary_size, sequence_length=model.text.sequence_length)


def _fit(model, data, epochs=EPOCHS, **kwargs):
    model.fit(data, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, **kwargs)


def _state(model):
    """Every weight (trainable and not) and every optimizer variable: `[(path, numpy)]` in
    tracking order (paths differ between models by Keras' unique-name suffixes)."""
    return [(v.path, to_numpy(v).copy()) for v in model.weights + model.optimizer.variables]


def _assert_identical(got, want):
    assert len(got) == len(want)
    differ = [path for (_, a), (path, b) in zip(got, want) if a.shape != b.shape or not np.array_equal(a, b)]
    assert not differ, f"{len(differ)} of {len(want)} variables differ, e.g. {differ[:3]}"


_UNINTERRUPTED = {}


def _uninterrupted(family):
    """The state after the whole run without interruption (computed once per family)."""
    if family not in _UNINTERRUPTED:
        model = _model(family)
        _fit(model, _data(model))
        assert int(model.optimizer.iterations) == EPOCHS * 2
        _UNINTERRUPTED[family] = _state(model)
    return _UNINTERRUPTED[family]


_INTERRUPTED = {}


def _interrupted(family, tmp_path_factory):
    """The run interrupted at the end of epoch `CRASH_AFTER`, with `BackupAndRestore`'s backup and, at each
    epoch's end, `ModelCheckpoint`'s weights (model and optimizer): `(backup directory, checkpoint path)`, run once
    per family. Both resume tests read it: one run's traced or compiled step instead of two (seconds each on
    TensorFlow and JAX); each test resumes in a model of its own."""
    if family not in _INTERRUPTED:
        root = tmp_path_factory.mktemp(f"interrupted_{family}")
        backup, checkpoint = root / "backup", str(root / "checkpoint.weights.h5")
        model = _model(family)
        callbacks = [keras.callbacks.BackupAndRestore(backup),
                     keras.callbacks.ModelCheckpoint(checkpoint, save_weights_only=True), CrashAfter(CRASH_AFTER)]
        with pytest.raises(Interrupt):
            _fit(model, _data(model), callbacks=callbacks)
        assert int(model.optimizer.iterations) == CRASH_AFTER * 2
        _INTERRUPTED[family] = backup, checkpoint
    return _INTERRUPTED[family]


@pytest.mark.parametrize("family", ["clip", "stair"])
def test_backup_and_restore_resumes_bit_exactly(family, tmp_path_factory):
    want = _uninterrupted(family)
    backup, _ = _interrupted(family, tmp_path_factory)

    resumed = _model(family)  # a new process would start here
    steps = CrashAfter()
    _fit(resumed, _data(resumed), callbacks=[keras.callbacks.BackupAndRestore(backup), steps])
    assert steps.steps == (EPOCHS - CRASH_AFTER) * 2  # it resumed: only the remaining epochs ran
    _assert_identical(_state(resumed), want)


def test_model_checkpoint_and_initial_epoch_resume_bit_exactly(tmp_path_factory, family="clip"):
    want = _uninterrupted(family)
    _, path = _interrupted(family, tmp_path_factory)  # the weights saved at the end of epoch `CRASH_AFTER`

    resumed = _model(family)
    resumed.optimizer.build(resumed.trainable_variables)  # its state is in the checkpoint too
    resumed.load_weights(path)
    assert int(resumed.optimizer.iterations) == CRASH_AFTER * 2
    _fit(resumed, _data(resumed), initial_epoch=CRASH_AFTER)
    _assert_identical(_state(resumed), want)


def test_fit_with_a_fixed_seed_is_deterministic(family="clip"):
    # The seeded initialisation gives the same weights twice; the second run of `fit` starts the first's model
    # again from the second model's weights, a fresh optimizer state and the seed's random state (the state the
    # first run started from), so that its step is traced or compiled once (seconds on TensorFlow and JAX).
    model = _model(family)
    initial = [to_numpy(v).copy() for v in model.weights]
    states = []
    for run in range(2):
        if run:
            fresh = _model(family)  # sets the seed and draws the initialisation again
            assert all(np.array_equal(to_numpy(a), b) for a, b in zip(fresh.weights, initial, strict=True))
            fresh.optimizer.build(fresh.trainable_variables)  # a fresh optimizer's state, as `fit` builds it
            for variable, value in zip(model.weights + model.optimizer.variables,
                                       fresh.weights + fresh.optimizer.variables, strict=True):
                variable.assign(value)
        model.fit(_data(model), batch_size=BATCH, epochs=2, shuffle=True, verbose=0)
        states.append(_state(model))
    _assert_identical(*states)
    # ...and the seed matters: another one gives other weights.
    keras.utils.set_random_seed(12)
    other = vlzoo.from_preset(f"{family}_tiny", **shallow_towers(family))
    assert not np.array_equal(to_numpy(other.weights[0]), states[0][0][1])


def test_stairs_one_fit_schedule_refuses_backup_and_restore(tmp_path):
    model = vlzoo.from_preset("stair_tiny")
    configure(model, learning_rate=1e-3, total_steps=8)
    with pytest.raises(ValueError, match="BackupAndRestore.*set_stage"):
        _fit(model, _data(model), callbacks=[keras.callbacks.BackupAndRestore(tmp_path)])

