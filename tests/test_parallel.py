"""Training over several processes: the global batch's step on every backend (`vlzoo.parallel`).

Each backend's pass starts its launches once, in the background (`tests/parallel_worker.py launch`): real
processes on 127.0.0.1, 2 torchrun ranks with gloo on PyTorch; MirroredStrategy over 2 logical CPUs and 2
workers from `TF_CONFIG` on TensorFlow; 2 JAX processes of 4 CPU devices each. Each process holds its part of
a global batch of 8 pairs; the tests check the loss, the gradients and the weights after one AdamW step of
each launched run against the same step of this process on the whole batch. The TensorFlow and JAX launches
train four runs that hold every kind of output and state any family or training feature has
(`parallel_worker.EVERY_KIND`); torchrun also trains one family per kind of loss, LiT + LoRA + gradient
caching, STAIR's stage 2 and TIPSv2 on both caption kinds (`parallel_worker.LAUNCHED`). Every family and
training feature (`parallel_worker.RUNS`) has its replica shares checked in this process.
"""

import functools
import json
import os
import re
import sys

import keras
import numpy as np
import pytest

import vlzoo
from backend_utils import EAGER_REFERENCE, run_once, shared_subprocess
from conftest import tiny_batch

from margins import assert_decision_margin, margin_batch, tiny_family_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parallel_worker  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "parallel_worker.py")
TORCH_ONLY = pytest.mark.skipif(keras.backend.backend() != "torch", reason="the torchrun launch")
TF_ONLY = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the tf.distribute launches")
JAX_ONLY = pytest.mark.skipif(keras.backend.backend() != "jax", reason="the keras.distribution launch")
TOLERANCE = 1e-5  # of each tensor's scale
# A gradient's rounding follows the size of the terms it sums, not of the sum. A gradient that is exactly 0 in
# exact arithmetic (attention key biases: the softmax over keys ignores a shift common to all keys) comes out of
# float32 as the rounding noise of its terms; a scalar's (the logit scale, the bias) sums a term per pair of the
# global batch that largely cancel (FLAIR's logit scale: -0.10 from 120 terms of order 1, which 8 JAX devices add
# in another order than one: 1.2e-5 of -0.10 apart). A gradient's scale is therefore taken as at least
# GRADIENT_FLOOR of the model's largest gradient.
GRADIENT_FLOOR = 1e-2
# Adam's first update is lr * g / (|g| + eps), eps = 1e-7: a rounding difference dg moves it by
# lr * eps * dg / g**2, which for the dg of 1e-6 that two summation orders give is more than 1e-5 of lr
# where |g| < 1e-3. Those entries are compared through their gradient only.
ADAM_SETTLED = 1e-3


def start_background_subprocesses(tmp_path_factory):
    """Starts this backend's launches (`parallel_worker.py launch`, a few minutes) once per run, in the
    background; returns the function that waits for their records (`conftest` calls this when the run starts)."""
    backend = keras.backend.backend()
    argv = [sys.executable, WORKER, "launch", backend, str(tmp_path_factory.mktemp("parallel_launches"))]
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    return shared_subprocess(tmp_path_factory, f"parallel_launches_{backend}", argv, env, timeout=1500)


@pytest.fixture(scope="session")
def launches(tmp_path_factory):
    """`{launch: [each process's record]}` of this backend's launches."""
    result = start_background_subprocesses(tmp_path_factory)()
    return {name: [dict(np.load(path)) for path in paths] for name, paths in result.items()}


def single_process_step(family):
    """The worker's step in this process, on the whole global batch, from rank 0's weights (eager on TensorFlow:
    `EAGER_REFERENCE`; the launches' steps are traced): `(loss, gradients, weights after the step, the loss of the
    batch's first half before it)`."""
    if family == parallel_worker.MODEL_PARALLEL:
        model = parallel_worker.build_g14(1000)
    else:
        model = parallel_worker.build(family, 1000, run_eagerly=EAGER_REFERENCE)
    batch = parallel_worker.run_batch(family, model)
    assert_decision_margin(model, batch)
    half = None if family == parallel_worker.MODEL_PARALLEL else float(
        model.test_on_batch({k: v[:4] for k, v in batch.items()}, return_dict=True)["loss"])
    loss = parallel_worker.fit_one_step(model, batch)
    weights = {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}
    return loss, parallel_worker.gradients(model), weights, half


def relative_difference(a, b, floor=0.0, where=None):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if where is not None:
        a, b = a[where], b[where]
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), floor, 1e-30)) if b.size else 0.0


def check_against_single_process(launches, family):
    """Each process's record of each of `launches` (`{launch: records}`) against this process's step."""
    loss, gradients, weights, half = single_process_step(family)
    if half is not None:
        assert abs(half - loss) > 1e-3  # the processes did not train alone: 4 pairs give another loss than 8
    floor = GRADIENT_FLOOR * max(float(np.max(np.abs(g))) for g in gradients.values())
    for launch, records in launches.items():
        if family not in parallel_worker.launched_runs(launch) and family != parallel_worker.MODEL_PARALLEL:
            continue
        for rank, record in enumerate(records):
            _check_record(record, rank, launch, family, loss, gradients, weights, floor)
    return loss


def _check_record(record, rank, launch, family, loss, gradients, weights, floor):
    assert abs(record[f"{family}/loss"] - loss) <= TOLERANCE * loss, (launch, rank, record[f"{family}/loss"], loss)
    worst = {}
    for path, gradient in gradients.items():
        worst[f"gradient {path}"] = relative_difference(record[f"{family}/gradient/{path}"], gradient, floor)
    for path, weight in weights.items():
        settled = np.abs(gradients[path]) >= ADAM_SETTLED if path in gradients else None
        worst[f"weight {path}"] = relative_difference(record[f"{family}/after/{path}"], weight, where=settled)
    loss_difference = abs(record[f"{family}/loss"] - loss) / loss
    # The figures of docs/distributed.md (`pytest -s` shows them).
    print(f"{launch} {family} rank {rank}: loss {loss_difference:.1e}, gradients "
          f"{max(v for k, v in worst.items() if k.startswith('gradient')):.1e}, weights "
          f"{max(v for k, v in worst.items() if k.startswith('weight')):.1e}")
    assert max(worst.values()) <= TOLERANCE, (launch, rank, sorted(worst.items(), key=lambda kv: -kv[1])[:3])


@TORCH_ONLY
@pytest.mark.parametrize("family", parallel_worker.LAUNCHED)
def test_torchrun_step_is_the_global_batch_step(launches, family):
    check_against_single_process(launches, family)


@TF_ONLY
@pytest.mark.parametrize("family", parallel_worker.EVERY_KIND)
def test_tf_distribute_step_is_the_global_batch_step(launches, family):
    """MultiWorkerMirroredStrategy and MirroredStrategy, each against the one step of this process."""
    assert sorted(launches) == ["tf_mirrored", "tf_multiworker"]
    check_against_single_process(launches, family)


@JAX_ONLY
@pytest.mark.parametrize("family", parallel_worker.EVERY_KIND)
def test_two_jax_processes_step_is_the_global_batch_step(launches, family):
    check_against_single_process(launches, family)


@JAX_ONLY
def test_llip_g14_layout_trains_model_parallel_over_two_processes(launches):
    check_against_single_process(launches, parallel_worker.MODEL_PARALLEL)
    for record in launches["jax_processes"]:
        key = parallel_worker.MODEL_PARALLEL
        assert int(record[f"{key}/num_prefix_tokens"]) == 64  # G/14's K = 64 mixture tokens kept
        sharded = json.loads(str(record[f"{key}/sharded"]))
        assert sorted(sharded) == list(record[f"{key}/layout_entries"])  # every entry of the map took effect
        expected = {
            "vision/block_0/attention/query/kernel": [None, "model"],
            "vision/block_1/attention/output/kernel": ["model", None],
            "vision/block_0/mlp/fc1/kernel": [None, "model"],
            "text/block_1/mlp/fc2/kernel": ["model", None],
            "text/token_embedding/embeddings": [None, "model"],
            "cross_attention/k_proj": [None, None, "model"],
            "cross_attention/out_proj": ["model", None],
        }
        for path, axes in expected.items():
            assert sharded.get(path) == axes, path
        assert len(sharded) >= 40 and bool(record[f"{key}/still_sharded"])


@TORCH_ONLY
@pytest.mark.parametrize("variable", ["WORLD_SIZE", "SLURM_STEP_NUM_TASKS"])
def test_several_processes_without_torch_distributed_is_an_error(monkeypatch, variable):
    monkeypatch.setenv(variable, "2")
    model = tiny_family_model("clip")
    model.compile(optimizer="sgd")
    batch = margin_batch(model, 4)
    with pytest.raises(RuntimeError, match=f"one of 2 launched together \\({variable}=2\\).*not initialised"):
        model.fit(batch, epochs=1, verbose=0)
    with pytest.raises(RuntimeError, match="vlzoo.parallel.initialize"):
        model.train_on_batch(batch)


@run_once  # what each run's training call outputs does not depend on the backend
@pytest.mark.parametrize("launch", ["torchrun", "tf_mirrored", "tf_multiworker", "jax_processes"])
def test_the_launched_runs_move_every_kind_of_output_and_state(launch):
    """Each kind of tensor (gathered or replica-local, by rank and dtype) and of state that a family or training
    feature of `RUNS` gives the launch machinery is moved by some run of each launch (`parallel_worker.LAUNCHED`,
    `parallel_worker.EVERY_KIND`)."""
    runs = parallel_worker.launched_runs(launch)
    launched = set().union(*(parallel_worker.launch_kinds(run) for run in runs))
    for run in sorted(set(parallel_worker.RUNS) - set(runs)):
        assert parallel_worker.launch_kinds(run) <= launched, (run, parallel_worker.launch_kinds(run) - launched)


@run_once
@pytest.mark.parametrize("run", parallel_worker.RUNS)
def test_replica_shares_of_every_run_average_to_the_whole_loss(run):
    """`contrastive_loss` of each replica's rows, averaged over 2 and 4 replicas, is the whole loss in training
    (FILIP drops tokens; FLAIR, with two captions per image, draws the other images' captions as one process;
    TIPSv2 with both caption kinds, web and synthetic, sums two InfoNCE terms over the replica's rows; STAIR in
    each stage), for every family and training feature, launched or not. One pass: the shares are the families'
    keras.ops code, whose whole losses test_conformance ties across the backends, and each backend's launches
    step the shares of `parallel_worker.EVERY_KIND` over real processes."""
    model = parallel_worker.build(run, 0)
    captions = 2 if run.partition(":")[0] == "flair" or run.endswith(":both-captions") else 1
    batch = margin_batch(model, parallel_worker.GLOBAL_BATCH, captions=captions)
    outputs = model(batch, training=True)
    state = [keras.ops.convert_to_numpy(v) for v in model.non_trainable_variables]  # FLAIR's seed

    def loss(fn, outputs, *args):
        for variable, value in zip(model.non_trainable_variables, state):
            variable.assign(value)
        return float(keras.ops.convert_to_numpy(fn(outputs, *args, training=True)))

    def share(start, count):  # what compute_loss passes: the replica's own rows of `replica_local_outputs`
        rows = {key: outputs[key][start:start + count] for key in model.replica_local_outputs}
        return loss(functools.partial(model.contrastive_loss, rows=(start, count)), {**outputs, **rows})

    whole = loss(model.contrastive_loss, outputs)
    for replicas in (2, 4):
        count = parallel_worker.GLOBAL_BATCH // replicas
        shares = [share(r * count, count) for r in range(replicas)]
        assert abs(np.mean(shares) - whole) <= 2e-6 * abs(whole), (replicas, shares, whole)
    assert max(shares) - min(shares) > 1e-3 * abs(whole)  # the rows' own shares, not the whole loss four times


def caption_folder(root, pairs=8):
    """`root/captions.csv` naming `pairs` small PNGs."""
    from PIL import Image

    rng = np.random.default_rng(0)
    (root / "img").mkdir()
    rows = ["image,caption"]
    for i in range(pairs):
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(root / "img" / f"{i}.png")
        rows.append(f"img/{i}.png,a picture number {i}")
    (root / "captions.csv").write_text("\n".join(rows) + "\n")
    return root / "captions.csv"


def train_launch(argv):
    """`vlzoo train argv` in 2 processes of this backend's launch: torchrun; 2 TensorFlow workers from
    `TF_CONFIG`; 2 JAX processes from Keras' `KERAS_DISTRIBUTION_*` variables. `[(argv, env)]`."""
    backend, command = keras.backend.backend(), ["-m", "vlzoo.cli", "train", *argv]
    if backend == "torch":
        return [([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                  f"--master_port={parallel_worker.free_port()}", *command], parallel_worker.worker_env("torch"))]
    if backend == "tensorflow":
        cluster = {"worker": [f"127.0.0.1:{parallel_worker.free_port()}" for _ in range(2)]}
        return [([sys.executable, *command], parallel_worker.worker_env(
            "tensorflow", TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})))
            for i in range(2)]
    coordinator = f"127.0.0.1:{parallel_worker.free_port()}"
    return [([sys.executable, *command], parallel_worker.worker_env(
        "jax", KERAS_DISTRIBUTION_JOB_ADDRESSES=coordinator, KERAS_DISTRIBUTION_NUM_PROCESSES="2",
        KERAS_DISTRIBUTION_PROCESS_ID=str(i))) for i in range(2)]


def test_vlzoo_train_trains_together_and_writes_once(tmp_path):
    """`vlzoo train` unchanged under this backend's launch of 2 processes, with gradient caching (micro-batches
    of 1 in each process's 2 pairs): one reports and writes the preset and the backup; the others train
    silently."""
    data = caption_folder(tmp_path)
    out, backup = tmp_path / "out", tmp_path / "backup"
    outputs = parallel_worker.run_processes(train_launch([
        "--preset", "clip_tiny", "--data", str(data), "--batch-size", "4", "--epochs", "2", "--learning-rate",
        "1e-3", "--warmup-steps", "0", "--micro-batch-size", "1", "--verbose", "0", "--backup-dir", str(backup),
        "--out", str(out)]))
    output = "\n".join(outputs)
    assert output.count("saved to") == 1 and output.count("final loss") == 1, output[-3000:]
    if keras.backend.backend() != "tensorflow":  # tf.distribute splits the batches itself
        assert "batch 4 over 2 processes" in output
    assert np.isfinite(float(re.search(r"final loss: ([0-9.]+)", output).group(1)))
    assert not backup.exists()  # written each epoch, deleted when the run ends, by the one process that wrote it
    assert isinstance(vlzoo.from_preset(str(out)), vlzoo.CLIP)


_RESUME_TASK = """
import os, sys
import keras, numpy as np, torch.distributed as dist
sys.path.insert(0, "tests")
import vlzoo
from conftest import tiny_batch
from vlzoo import parallel
from vlzoo.training import BackupAndRestore, configure

parallel.initialize()
rank, backup = dist.get_rank(), sys.argv[1]


def model():
    keras.utils.set_random_seed(11)
    built = vlzoo.from_preset("clip_tiny")
    configure(built, learning_rate=1e-3, total_steps=8, warmup_steps=2)  # resuming restores the step count too
    return built


class Crash(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise RuntimeError("interrupted")


def fit(built, callbacks):
    text = built.text
    pairs = tiny_batch(16, seed=3, vocabulary_size=text.vocabulary_size, sequence_length=text.sequence_length)
    rows = {key: value[rank * 8:(rank + 1) * 8] for key, value in pairs.items()}  # this rank's share
    built.fit(rows, batch_size=4, epochs=4, shuffle=False, verbose=0, callbacks=callbacks)


whole = model()
fit(whole, [])
interrupted = model()
try:
    fit(interrupted, [BackupAndRestore(backup), Crash()])
except RuntimeError:
    pass
dist.barrier()
# One write each (an f-string, not print's separate pieces): the ranks share a pipe.
print(f"rank {rank} backup after the interruption: {sorted(os.listdir(backup))}", flush=True)
dist.barrier()  # both ranks have looked before either resumes
resumed = model()
fit(resumed, [BackupAndRestore(backup)])
difference = max(float(np.max(np.abs(keras.ops.convert_to_numpy(a) - keras.ops.convert_to_numpy(b))))
                 for a, b in zip(whole.weights + whole.optimizer.variables,
                                 resumed.weights + resumed.optimizer.variables))
print(f"rank {rank} largest difference from the uninterrupted run: {difference}", flush=True)
"""


@TORCH_ONLY
def test_two_ranks_resume_from_the_backup_one_wrote(tmp_path):
    """2 torchrun ranks interrupted after epoch 2 of 4 resume from the backup rank 0 wrote, both reading it, and
    end bit for bit where the uninterrupted run ends (as one process does, tests/test_resume.py)."""
    backup = tmp_path / "backup"
    (output,) = parallel_worker.run_processes([(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
         f"--master_port={parallel_worker.free_port()}", "--no-python", sys.executable, "-c", _RESUME_TASK,
         str(backup)],
        parallel_worker.worker_env("torch"))], timeout=600)
    for rank in range(2):
        assert f"rank {rank} backup after the interruption: ['latest.weights.h5', 'training_metadata.json']" in \
            output, output[-3000:]
        assert f"rank {rank} largest difference from the uninterrupted run: 0.0" in output, output[-3000:]
    assert not backup.exists()  # the resumed run ended: deleted


_SRUN_TASK = """
import torch.distributed as dist
import torch
from vlzoo import parallel
parallel.initialize()
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "sum", float(total[0]))
import sys
sys.path.insert(0, "tests")
from margins import margin_batch, tiny_family_model
model = tiny_family_model("clip")
model.compile(optimizer="sgd")
rows = 3 + dist.get_rank()  # the ranks disagree on the batch size
try:
    model.train_on_batch({k: v[:rows] for k, v in margin_batch(model, 4).items()})
except ValueError as error:
    print(error)
dist.barrier()  # the torch.distributed shutdown: both ranks done before either tears the group down
dist.destroy_process_group()
"""


@TORCH_ONLY
def test_srun_tasks_join_from_slurm_variables_and_refuse_unequal_batches():
    port = parallel_worker.free_port()
    slurm = [parallel_worker.worker_env("torch", SLURM_PROCID=str(i), SLURM_STEP_NUM_TASKS="2",
                                        SLURM_LOCALID=str(i),
                                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)) for i in range(2)]
    for env in slurm:
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(name, None)
    commands = [([sys.executable, "-c", _SRUN_TASK], env) for env in slurm]
    outputs = parallel_worker.run_processes(commands, timeout=300)
    for rank, output in enumerate(outputs):
        assert f"rank {rank} of 2 sum 3.0" in output, output[-2000:]
        assert "the ranks' batch sizes are [3, 4]" in output and "drop_remainder=True" in output
    del slurm[0]["MASTER_ADDR"]
    with pytest.raises(RuntimeError, match="Under srun, set MASTER_ADDR in the job script"):
        parallel_worker.run_processes([([sys.executable, "-c", _SRUN_TASK], slurm[0])], timeout=300)
