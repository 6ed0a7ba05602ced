"""Training over several processes: the global batch's step on every backend (`vlzoo.parallel`).

Each launch starts real processes on 127.0.0.1 (`tests/parallel_worker.py`: 2 torchrun ranks with gloo on
PyTorch), each holding half of a global batch of 8 pairs, and checks the loss, the gradients and the weights
after one AdamW step of every family against the same steps of this process on the whole batch.
"""

import json
import os
import re
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

import vlzoo

from margins import assert_decision_margin, margin_batch, tiny_family_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parallel_worker  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "parallel_worker.py")
TORCH_ONLY = pytest.mark.skipif(keras.backend.backend() != "torch", reason="the torchrun launch")
TF_ONLY = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the tf.distribute launches")
JAX_ONLY = pytest.mark.skipif(keras.backend.backend() != "jax", reason="the keras.distribution launch")
TOLERANCE = 1e-5  # of each tensor's scale
# A gradient that is exactly 0 in exact arithmetic (attention key biases: the softmax over keys ignores a shift
# common to all keys) comes out of float32 as rounding noise of its terms, which depends on the summation order.
# Its scale is taken as at least GRADIENT_FLOOR of the model's largest gradient, the size of those terms.
GRADIENT_FLOOR = 1e-3
# Adam's first update is lr * g / (|g| + eps), eps = 1e-7: a rounding difference dg moves it by
# lr * eps * dg / g**2, which for the dg of 1e-6 that two summation orders give is more than 1e-5 of lr
# where |g| < 1e-3. Those entries are compared through their gradient only.
ADAM_SETTLED = 1e-3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(commands, timeout=600):
    """Runs `(argv, env)` commands side by side to their end; every process group is killed on a timeout or an
    error, whatever happens. Fails with the output of a process that did not exit with 0."""
    processes = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True) for argv, env in commands]
    try:
        outputs = [process.communicate(timeout=timeout)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait()
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-4000:]
    return outputs


def worker_env(backend, **variables):
    return dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1", **variables)


def records(out, count):
    return [dict(np.load(out / f"rank{rank}.npz")) for rank in range(count)]


@pytest.fixture(scope="module")
def torchrun_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("torchrun")
    run_processes([([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                     f"--master_port={free_port()}", WORKER, "torch", str(out)], worker_env("torch"))])
    return records(out, 2)


@pytest.fixture(scope="module")
def tf_records(tmp_path_factory):
    """The two TensorFlow launches: MirroredStrategy over 2 logical CPUs, and 2 workers from `TF_CONFIG`."""
    mirrored, multiworker = tmp_path_factory.mktemp("tf_mirrored"), tmp_path_factory.mktemp("tf_multiworker")
    cluster = {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    run_processes([([sys.executable, WORKER, "tf_mirrored", str(mirrored)], worker_env("tensorflow"))] + [
        ([sys.executable, WORKER, "tf_multiworker", str(multiworker)],
         worker_env("tensorflow", TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})))
        for i in range(2)])
    return {"tf_mirrored": records(mirrored, 1), "tf_multiworker": records(multiworker, 2)}


@pytest.fixture(scope="module")
def jax_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("jax_processes")
    coordinator = f"127.0.0.1:{free_port()}"
    run_processes([([sys.executable, WORKER, "jax", str(out)],
                    worker_env("jax", VLZOO_TEST_PROCESS=str(i), VLZOO_TEST_COORDINATOR=coordinator))
                   for i in range(2)])
    return records(out, 2)


def single_process_step(family):
    """The worker's step in this process, on the whole global batch, from rank 0's weights."""
    model = parallel_worker.build(family, 1000)
    batch = margin_batch(model, parallel_worker.GLOBAL_BATCH)
    assert_decision_margin(model, batch)
    loss = parallel_worker.fit_one_step(model, batch)
    return loss, parallel_worker.gradients(model), {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def relative_difference(a, b, floor=0.0, where=None):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if where is not None:
        a, b = a[where], b[where]
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), floor, 1e-30)) if b.size else 0.0


def check_against_single_process(records, family):
    loss, gradients, weights = single_process_step(family)
    floor = GRADIENT_FLOOR * max(float(np.max(np.abs(g))) for g in gradients.values())
    for rank, record in enumerate(records):
        assert abs(record[f"{family}/loss"] - loss) <= TOLERANCE * loss, (rank, record[f"{family}/loss"], loss)
        worst = {}
        for path, gradient in gradients.items():
            worst[f"gradient {path}"] = relative_difference(record[f"{family}/gradient/{path}"], gradient, floor)
        for path, weight in weights.items():
            settled = np.abs(gradients[path]) >= ADAM_SETTLED if path in gradients else None
            worst[f"weight {path}"] = relative_difference(record[f"{family}/after/{path}"], weight, where=settled)
        assert max(worst.values()) <= TOLERANCE, (rank, sorted(worst.items(), key=lambda kv: -kv[1])[:3])
    return loss


@TORCH_ONLY
@pytest.mark.parametrize("family", parallel_worker.FAMILIES)
def test_torchrun_step_is_the_global_batch_step(torchrun_records, family):
    loss = check_against_single_process(torchrun_records, family)
    # The ranks did not train alone: a rank's 4 pairs give another loss than the global batch's 8.
    model = parallel_worker.build(family, 1000)
    half = {k: v[:4] for k, v in margin_batch(model, parallel_worker.GLOBAL_BATCH).items()}
    assert abs(float(model.test_on_batch(half, return_dict=True)["loss"]) - loss) > 1e-3


@TF_ONLY
@pytest.mark.parametrize("launch", ["tf_mirrored", "tf_multiworker"])
@pytest.mark.parametrize("family", parallel_worker.FAMILIES)
def test_tf_distribute_step_is_the_global_batch_step(tf_records, launch, family):
    check_against_single_process(tf_records[launch], family)


@JAX_ONLY
@pytest.mark.parametrize("family", parallel_worker.FAMILIES)
def test_two_jax_processes_step_is_the_global_batch_step(jax_records, family):
    check_against_single_process(jax_records, family)


@TORCH_ONLY
@pytest.mark.parametrize("variable", ["WORLD_SIZE", "SLURM_NTASKS"])
def test_several_processes_without_torch_distributed_is_an_error(monkeypatch, variable):
    monkeypatch.setenv(variable, "2")
    model = tiny_family_model("clip")
    model.compile(optimizer="sgd")
    batch = margin_batch(model, 4)
    with pytest.raises(RuntimeError, match=f"one of 2 launched together \\({variable}=2\\).*not initialised"):
        model.fit(batch, epochs=1, verbose=0)
    with pytest.raises(RuntimeError, match="vlzoo.parallel.initialize"):
        model.train_on_batch(batch)


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_replica_shares_of_clip_and_siglip_average_to_the_whole_loss(family):
    model = tiny_family_model(family)
    outputs = model(margin_batch(model, parallel_worker.GLOBAL_BATCH), training=True)
    whole = float(keras.ops.convert_to_numpy(model.contrastive_loss(outputs)))
    shares = [float(keras.ops.convert_to_numpy(model.replica_loss(outputs, start, 2))) for start in range(0, 8, 2)]
    assert abs(np.mean(shares) - whole) <= 1e-6 * whole
    assert max(shares) - min(shares) > 1e-3  # the shares are the rows' own, not the whole loss four times


def test_a_subclass_that_changes_the_loss_gets_the_whole_loss_on_every_replica():
    class Doubled(vlzoo.CLIP):
        def contrastive_loss(self, outputs, training=False):
            return 2.0 * super().contrastive_loss(outputs, training=training)

    assert vlzoo.CLIP._owner("replica_loss") is vlzoo.CLIP._owner("contrastive_loss")
    assert Doubled._owner("replica_loss") is not Doubled._owner("contrastive_loss")
    assert vlzoo.STAIR._owner("replica_loss") is vlzoo.models.ContrastiveModel


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


@TORCH_ONLY
def test_vlzoo_train_under_torchrun_trains_together_and_writes_once(tmp_path):
    data = caption_folder(tmp_path)
    out, backup = tmp_path / "out", tmp_path / "backup"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}", "-m", "vlzoo.cli", "train", "--preset", "clip_tiny", "--data", str(data),
            "--batch-size", "4", "--epochs", "2", "--learning-rate", "1e-3", "--warmup-steps", "0", "--verbose", "0",
            "--backup-dir", str(backup), "--out", str(out)]
    output = run_processes([(argv, worker_env("torch"))])
    assert output[0].count("saved to") == 1, output[0][-3000:]  # rank 0 reports and writes; rank 1 is silent
    assert "batch 4 over 2 processes" in output[0]
    assert np.isfinite(float(re.search(r"final loss: ([0-9.]+)", output[0]).group(1)))
    assert not backup.exists()  # written each epoch, deleted when the run ends, by the one process that wrote it
    assert isinstance(vlzoo.from_preset(str(out)), vlzoo.CLIP)
