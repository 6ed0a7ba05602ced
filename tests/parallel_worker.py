"""One process of a multi-process (or multi-device) training step, as `test_parallel.py` starts it.

    python tests/parallel_worker.py launch BACKEND OUT_DIR     (all of BACKEND's launches below; prints their records)
    torchrun --nproc_per_node=2 tests/parallel_worker.py torchrun OUT_DIR            (PyTorch, gloo)
    TF_CONFIG=... python tests/parallel_worker.py tf_multiworker OUT_DIR             (2 TensorFlow workers)
    python tests/parallel_worker.py tf_mirrored OUT_DIR                              (2 logical CPUs, 1 process)
    VLZOO_TEST_PROCESS=i VLZOO_TEST_COORDINATOR=127.0.0.1:PORT XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
        python tests/parallel_worker.py jax_processes OUT_DIR                        (2 JAX processes x 4 devices)

Every process builds the tiny model of each run its launch trains (`launched_runs`: a family, or a family with a
training feature set) from a seed of its own (`1000 + process index`: the launch
must make the weights equal, as rank 0's broadcast does; JAX's processes share the seed 1000, since JAX
requires every process to give a replicated weight the same value) and fits one step on a global batch of
`GLOBAL_BATCH` pairs (`margins.margin_batch`): torchrun's ranks and the JAX processes each feed their own
rows (process `r`: rows `r * B .. (r + 1) * B - 1`); under TensorFlow's strategies,
`distribute_datasets_from_function` gives each replica its rows in the same order. One AdamW step;
`test_parallel.py` compares the step with the same step of one process on the whole batch. Process `r`
writes `OUT_DIR/rank{r}.npz`: per run the loss, the gradients (from AdamW's first moment) and the
weights after the step. The JAX launch
also trains a Llip of G/14's layout under ModelParallel (`G14_REDUCED`, a 2 x 4 mesh over both processes).
"""

import functools
import json
import math
import os
import socket
import subprocess
import sys

LAUNCH = sys.argv[1] if __name__ == "__main__" else None
if LAUNCH == "tf_mirrored":  # two logical CPUs, set before anything else starts TensorFlow
    import tensorflow as tf
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import vlzoo  # noqa: E402
from vlzoo import distribution, parallel  # noqa: E402
from vlzoo.training import enable_lora, lock_tower  # noqa: E402

from families import FAMILIES  # noqa: E402
from margins import margin_batch, tiny_family_model  # noqa: E402

# The training features that change the step, on top of the families: CLIP with its image tower locked (LiT),
# LoRA adapters on its text tower and micro-batches of 2 within each process (gradient caching); STAIR's stage
# 2 (image tower frozen, text decoder against its snapshot) and 3; TIPSv2 on both caption kinds, `(B, 2, T)`.
VARIANTS = ("clip:lit-lora-micro", "stair:stage2", "stair:stage3", "tipsv2:both-captions")
RUNS = FAMILIES + VARIANTS
# What the launches train. The launch machinery meets a family only through `compute_loss`: it gathers every
# output not in `replica_local_outputs` over the batch axis (whatever its name: by rank and dtype), passes the
# replica's rows to `contrastive_loss(rows=...)`, adds the family's own losses (`model.losses`), and averages
# the gradients of the trainable variables; FLAIR draws from seed state. Whether each family's shares add up
# to its whole loss is checked for every run in one process (`test_replica_shares_of_every_run_average_to_the_
# whole_loss`); the processes then only have to move each kind of tensor and state the same way, which
# depends on the kind (`launch_kinds`), not on the family. `EVERY_KIND`, four runs, holds every kind that any
# run of `RUNS` has (`test_parallel` asserts it: a family that brings a new kind fails there until a run of it
# is launched); the TensorFlow and JAX launches train these. The torchrun launch, the cheapest (eager steps),
# also trains one run per kind of loss (`LAUNCHED`: softmax and sigmoid over embeddings, FILIP's and SPARC's
# over tokens, Llip's, FLAIR's, STAIR's, TIPSv2's two caption kinds), so that every loss is also stepped over
# real processes once.
EVERY_KIND = ("clip:lit-lora-micro", "filip", "flair", "llip")
LAUNCHED = ("clip:lit-lora-micro", "clip", "filip", "flair", "llip", "siglip", "sparc", "stair:stage2",
            "tipsv2:both-captions")


def launched_runs(launch):
    """The runs `launch` (`"torchrun"`, `"tf_mirrored"`, `"tf_multiworker"` or `"jax_processes"`) trains."""
    return LAUNCHED if launch == "torchrun" else EVERY_KIND


# G/14's layout (K = 64 mixture tokens, patch 14, q/k/v norms, M heads) at a width and depth that fit a test; the
# JAX launch trains it under ModelParallel on a (2 batch x 4 model) mesh over its 2 processes x 4 CPU devices.
G14_REDUCED = dict(
    vision=dict(image_size=28, hidden_dim=64, num_layers=2, num_heads=4, intermediate_dim=128),
    text=dict(sequence_length=8, hidden_dim=32, num_layers=2, num_heads=4, intermediate_dim=64),
    embed_dim=32, num_heads=8,
)
MODEL_PARALLEL = "llip_g14_model_parallel"
GLOBAL_BATCH = 8
ADAMW = dict(learning_rate=1e-3, weight_decay=0.1)
# TIPSv2's released temperatures put its logits at 197 times the cosine: float32's rounding of a cosine becomes
# 1.2e-5 of a logit, and the gradients of two summation orders differ by about that share (1.1e-5 of the register
# token's on an AVX-512 EPYC, above the tests' 1e-5). What the launches check, how the rows are shared and
# gathered, does not depend on the multiplier: TIPSv2 runs at CLIP's initial one, 1 / 0.07.
LAUNCH_OVERRIDES = {"tipsv2": dict(init_logit_scale=math.log(1 / 0.07))}


def build(run, seed, run_eagerly=False):
    """The tiny model of `run` (a family or one of `VARIANTS`) from `seed`, compiled with AdamW (made here: in a
    strategy's scope); `run_eagerly` for `compile`."""
    family, _, variant = run.partition(":")
    keras.utils.set_random_seed(seed)
    model = tiny_family_model(family, **LAUNCH_OVERRIDES.get(family, {}))
    if family == "stair":
        model.stage_fractions = None  # one step: no stage schedule over the run
    if variant == "lit-lora-micro":
        lock_tower(model, "image")
        enable_lora(model, rank=2, towers=("text",))
        model.micro_batch_size = 2
    elif variant.startswith("stage"):
        model.set_stage(int(variant[len("stage"):]))
    model.compile(optimizer=keras.optimizers.AdamW(**ADAMW), run_eagerly=run_eagerly)
    return model


@functools.lru_cache(maxsize=None)
def launch_kinds(run):
    """What a launch of `run` moves between processes, as a set: `("gathered" | "local", rank, dtype)` of each
    output of its training call, `"non-trainable"` if it holds variables that do not train (seed state, step
    counters, a frozen tower), `"regularized"` if it adds losses of its own, `"micro-batches"` if it sets them."""
    model = build(run, 0)
    outputs = model(run_batch(run, model), training=True)
    kinds = {("local" if key in model.replica_local_outputs else "gathered", len(value.shape),
              keras.backend.standardize_dtype(value.dtype)) for key, value in outputs.items()}
    flags = {"non-trainable": model.non_trainable_variables, "regularized": model.losses,
             "micro-batches": model.micro_batch_size is not None}
    return kinds | {flag for flag, present in flags.items() if present}


def run_batch(run, model):
    """The global batch of `run` for `model`: `margin_batch`, with both caption kinds for `tipsv2:both-captions`."""
    return margin_batch(model, GLOBAL_BATCH, captions=2 if run.endswith(":both-captions") else 1)


def build_g14(seed):
    keras.utils.set_random_seed(seed)
    model = vlzoo.from_preset("llip_vit_g14", load_weights=False, **G14_REDUCED)
    model.compile(optimizer=keras.optimizers.AdamW(**ADAMW))
    return model


def gradients(model):
    """`{path: gradient}` of the step just taken, from AdamW's first moment: after one step it is
    `(1 - beta_1) * gradient` (Keras keeps one moment per trainable variable, in their order)."""
    optimizer = model.optimizer
    return {v.path: np.asarray(keras.ops.convert_to_numpy(m)) / (1.0 - optimizer.beta_1)
            for v, m in zip(optimizer._trainable_variables, optimizer._momentums)}


def fit_one_step(model, batch, strategy=None):
    """One `fit` step on `batch`. Under a `tf.distribute` `strategy`, `batch` is the global batch and each
    replica gets its rows from `distribute_datasets_from_function`, repeated, with a static batch size (gradient
    caching needs it; Keras' own distribution of a dataset, and under MultiWorkerMirroredStrategy a distributed
    dataset that can run out, leave the replicas' batch size unknown)."""
    rows = len(batch["token_ids"])
    if strategy is None or strategy.num_replicas_in_sync == 1:
        return float(model.fit(batch, batch_size=rows, epochs=1, shuffle=False, verbose=0).history["loss"][0])
    import tensorflow as tf

    def replica_rows(context):  # input pipeline i (worker i) reads its replicas' rows, in replica order
        size = context.get_per_replica_batch_size(rows)
        per_pipeline = rows // context.num_input_pipelines
        data = tf.data.Dataset.from_tensor_slices(batch).skip(context.input_pipeline_id * per_pipeline)
        return data.take(per_pipeline).batch(size, drop_remainder=True).repeat()

    data = strategy.distribute_datasets_from_function(replica_rows)
    return float(model.fit(data, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0).history["loss"][0])


class Launch:
    """What differs per launch: this process's index and count, the strategy models are built in, its rows."""

    def __init__(self, name):
        self.name, self.strategy = name, None
        if name == "torchrun":
            import torch.distributed as dist
            parallel.initialize()
            self.index, self.count, self.own_rows = dist.get_rank(), dist.get_world_size(), True
        elif name in ("tf_mirrored", "tf_multiworker"):
            import tensorflow as tf
            strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if name == "tf_mirrored"
                        else tf.distribute.MultiWorkerMirroredStrategy())
            self.index = json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"]
            self.count, self.strategy, self.own_rows = 1 if name == "tf_mirrored" else 2, strategy, False
        elif name == "jax_processes":
            self.index, self.count, self.own_rows = int(os.environ["VLZOO_TEST_PROCESS"]), 2, True
            keras.distribution.initialize(os.environ["VLZOO_TEST_COORDINATOR"], num_processes=2,
                                          process_id=self.index)
            distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
            distribution.auto_shard_dataset = False  # each process feeds its own rows
            keras.distribution.set_distribution(distribution)
        else:
            raise ValueError(f"unknown launch {name!r}")

    def build(self, family):
        # JAX places a replicated weight from every process's value and checks they are equal: its processes
        # must build the same weights (a preset's, or the same seed); the other launches broadcast worker 0's.
        seed = 1000 + (0 if self.name == "jax_processes" else self.index)
        if self.strategy is None:
            return build(family, seed)
        with self.strategy.scope():
            return build(family, seed)

    def rows(self, batch):
        if not self.own_rows:
            return batch
        size = GLOBAL_BATCH // self.count
        return {key: value[self.index * size:(self.index + 1) * size] for key, value in batch.items()}


def main(name, out_dir):
    launch = Launch(name)
    record = {}
    for family in launched_runs(name):
        print(f"{name} {launch.index}: {family}", file=sys.stderr, flush=True)
        model = launch.build(family)
        record[f"{family}/loss"] = fit_one_step(model, launch.rows(run_batch(family, model)), launch.strategy)
        for v in model.weights:
            record[f"{family}/after/{v.path}"] = np.asarray(keras.ops.convert_to_numpy(v))
        for path, gradient in gradients(model).items():
            record[f"{family}/gradient/{path}"] = gradient
    if name == "jax_processes":
        record.update(model_parallel(launch))
    np.savez(os.path.join(out_dir, f"rank{launch.index}.npz"), **record)


def model_parallel(launch):
    """One step of the G/14-layout Llip under ModelParallel, the batch axis across the processes."""
    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices())
    layouts = distribution.layout_map(build_g14(1000), mesh)
    sharded_training = keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
    sharded_training.auto_shard_dataset = False  # each process feeds its own rows
    with sharded_training.scope():
        model = build_g14(1000)
        sharded = distribution.sharded_dimensions(model)
        loss = fit_one_step(model, launch.rows(margin_batch(model, GLOBAL_BATCH)))
        still_sharded = sorted(distribution.sharded_dimensions(model)) == sorted(sharded)
    record = {f"{MODEL_PARALLEL}/loss": loss, f"{MODEL_PARALLEL}/still_sharded": still_sharded,
              f"{MODEL_PARALLEL}/layout_entries": np.array(sorted(layouts)),
              f"{MODEL_PARALLEL}/num_prefix_tokens": model.vision.num_prefix_tokens,
              f"{MODEL_PARALLEL}/sharded": json.dumps({path: list(axes) for path, axes in sharded.items()})}
    for v in model.weights:
        record[f"{MODEL_PARALLEL}/after/{v.path}"] = np.asarray(keras.ops.convert_to_numpy(v))
    for path, gradient in gradients(model).items():
        record[f"{MODEL_PARALLEL}/gradient/{path}"] = gradient
    return record


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(backend, **variables):
    """This process's environment for a launched one on `backend`, with `variables`: one OpenMP thread, and
    TensorFlow's own intra-op pool (`make test` gives its workers one thread; a launch runs as a user's job)."""
    inherited = {key: value for key, value in os.environ.items() if key != "TF_NUM_INTRAOP_THREADS"}
    return dict(inherited, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1", **variables)


def run_processes(commands, timeout=1200):
    """Runs `(argv, env)` commands side by side to their end, within `timeout` seconds in all; every process
    group is killed if one fails or time runs out, whatever happens. Raises with the output of a process that
    did not exit with 0; returns their outputs."""
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
        if process.returncode != 0:
            raise RuntimeError(f"{process.args} exited with {process.returncode}:\n{output[-4000:]}")
    return outputs


def launch(backend, out_dir):
    """Starts `backend`'s launches of this worker, waits for them, and prints `{launch: [record paths]}` as JSON."""
    commands, counts = [], {}
    worker = os.path.abspath(__file__)

    def add(name, processes, count=None):
        """`processes` `(argv, env)` write their records to `out_dir/name`; `count`: how many (default: one each)."""
        directory = os.path.join(out_dir, name)
        os.makedirs(directory, exist_ok=True)
        counts[name] = count or len(processes)
        commands.extend((argv + [directory], env) for argv, env in processes)

    if backend == "torch":
        add("torchrun", [([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           "--master_addr=127.0.0.1", f"--master_port={free_port()}", worker, "torchrun"],
                          worker_env("torch"))], count=2)
    elif backend == "tensorflow":
        cluster = {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
        add("tf_mirrored", [([sys.executable, worker, "tf_mirrored"], worker_env("tensorflow"))])
        add("tf_multiworker", [([sys.executable, worker, "tf_multiworker"], worker_env(
            "tensorflow", TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})))
            for i in range(2)])
    else:
        coordinator = f"127.0.0.1:{free_port()}"
        add("jax_processes", [([sys.executable, worker, "jax_processes"], worker_env(
            "jax", VLZOO_TEST_PROCESS=str(i), VLZOO_TEST_COORDINATOR=coordinator,
            XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()))
            for i in range(2)])
    run_processes(commands)
    print(json.dumps({name: [os.path.join(out_dir, name, f"rank{r}.npz") for r in range(count)]
                      for name, count in counts.items()}))


if __name__ == "__main__":
    if LAUNCH == "launch":
        launch(sys.argv[2], sys.argv[3])
    else:
        main(LAUNCH, sys.argv[2])
