"""Process-wide settings: TensorFlow's oneDNN default set by `import vlzoo`, TensorFlow left unimported on the
other backends until it is used, and `vlzoo.training.retain_host_memory` (checked in fresh processes: each acts
once, at start)."""

import ctypes.util
import os
import platform
import subprocess
import sys

import keras
import pytest
from backend_utils import run_once

PROBE = ("import vlzoo; from tensorflow.python.util import _pywrap_util_port as port; "
         "print(port.IsMklEnabled())")

# Builds, saves and reloads a model and seeds Keras on JAX or PyTorch, then imports TensorFlow: prints whether it
# had been imported before, and whether its first draws are those of a TensorFlow seeded with 3 (Keras' seed).
UNUSED_TENSORFLOW = """
import sys, tempfile
import keras, vlzoo
path = tempfile.mkdtemp()
vlzoo.from_preset("clip_tiny").save_to_preset(path)
vlzoo.from_preset(path).encode_text(["a red circle"])
keras.utils.set_random_seed(3)
imported = "tensorflow" in sys.modules
import tensorflow as tf
first = tf.random.uniform([4]).numpy().tolist()
tf.random.set_seed(3)
print(imported, first == tf.random.uniform([4]).numpy().tolist())
"""

# Allocates, touches and frees 256 MB in a new thread twice (as a compiled step's temporaries are),
# then prints the MB faulted in by the second round.
REUSE = """
import ctypes, resource, sys, threading
import vlzoo
if sys.argv[1] == "retain":
    assert vlzoo.training.retain_host_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
size, faulted = 256 << 20, []

def step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    faulted.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * 4096 / 2**20)

for _ in range(2):
    thread = threading.Thread(target=step)
    thread.start()
    thread.join()
print(faulted[1])
"""


def _run(code, *args, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("TF_ENABLE_ONEDNN_OPTS", "GLIBC_TUNABLES")}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env=dict(base, TF_CPP_MIN_LOG_LEVEL="3", **env))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="a TensorFlow setting")
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="set on x86 hosts only")
def test_import_turns_on_tensorflow_onednn_unless_the_user_chose():
    # TensorFlow alone leaves oneDNN off on CPUs without AVX-512 VNNI or AMX (this CI's AVX2 hosts).
    assert _run(PROBE, KERAS_BACKEND="tensorflow") == "True"
    assert _run(PROBE, KERAS_BACKEND="tensorflow", TF_ENABLE_ONEDNN_OPTS="0") == "False"


@pytest.mark.skipif(keras.backend.backend() == "tensorflow", reason="the other backends' setting")
def test_tensorflow_is_imported_when_used_and_seeded_as_keras_seeds_it():
    assert _run(UNUSED_TENSORFLOW, KERAS_BACKEND=keras.backend.backend()) == "False True"


@run_once
@pytest.mark.skipif(sys.platform != "linux" or "libc.so.6" != ctypes.util.find_library("c"),
                    reason="glibc's malloc only")
def test_retain_host_memory_reuses_freed_blocks_without_faults():
    # glibc by default maps a 256 MB block and unmaps it when freed: the second round faults it all in again.
    assert float(_run(REUSE, "default")) > 200
    assert float(_run(REUSE, "retain")) < 8
