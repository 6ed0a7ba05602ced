"""Framework C++ logs on the command line: hidden unless the user asks for them.

TensorFlow's and XLA's load-time lines ("failed call to cuInit", "oneDNN custom
operations are on", "Could not find cuda drivers" on a machine without a GPU)
read as errors but are not. The command line sets `TF_CPP_MIN_LOG_LEVEL=3`
unless `VLZOO_VERBOSE=1` or the user set their own level; the processes the
commands start inherit it. TensorFlow 2.20 and later write their load-time lines
through absl before that level applies, so every command that loads a framework
imports TensorFlow first with those lines filtered out of stderr
(`import_tensorflow_quietly`). `TF_ENABLE_ONEDNN_OPTS`, which changes numerics,
is left alone.
"""

import contextlib
import importlib.util
import os
import re
import sys
import tempfile


def _quiet_native_logs():
    """Whether to hide the C++ logs: `VLZOO_VERBOSE` unset (or 0) and no `TF_CPP_MIN_LOG_LEVEL` of the
    user's but 3. On Keras's JAX backend `import vlzoo` has already run JAX's
    `os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")`: a 1 next to an imported JAX counts as unset
    (`TF_CPP_MIN_LOG_LEVEL=0` or `VLZOO_VERBOSE=1` show the logs there)."""
    if os.environ.get("VLZOO_VERBOSE", "0") not in ("", "0"):
        return False
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    return level in (None, "3") or (level == "1" and "jax" in sys.modules)


# Before anything imports TensorFlow (its C++ logging reads the level when it is loaded; Keras's
# `set_random_seed` imports it on every backend); the processes the commands start (`demo`'s second
# backend) inherit it. `make demo` sets the same level before Python starts.
QUIET_NATIVE_LOGS = _quiet_native_logs()
if QUIET_NATIVE_LOGS:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # TensorFlow's (and its XLA's) C++ INFO, WARNING and ERROR lines

# What TensorFlow's shared libraries log while they load, before TF_CPP_MIN_LOG_LEVEL applies: absl's
# preamble, its `I0000 00:00:1795586393.834920    2481 port.cc:153] ...` lines (I, W or E), the older
# `2025-01-01 00:00:00.000000: I path/file.cc:12] ...` form, and cpu_feature_guard's second line.
_LOAD_LOG_LINE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\)"
                            r"|[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] "
                            r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] \S+:\d+\] "
                            r"|To enable the following instructions: ")


@contextlib.contextmanager
def load_logs_hidden():
    """File descriptor 2 sent to a temporary file for the block, then what is not a framework's load-time
    log (`_LOAD_LOG_LINE`) written back to stderr; everything when the block raises."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to hide
        yield
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines = capture.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if failed or not _LOAD_LOG_LINE.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


def import_tensorflow_quietly():
    """Imports TensorFlow with its load-time C++ logs hidden: "oneDNN custom operations are on",
    "Could not find cuda drivers", absl's "All log messages before absl::InitializeLog()", twice (two
    shared libraries). The commands that build a model read their data through `tf.data` (on every backend) or
    run on Keras' TensorFlow backend, which import it anyway. Not when the user asked for the logs
    (`QUIET_NATIVE_LOGS`) or TensorFlow is already imported."""
    if not QUIET_NATIVE_LOGS or "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is None:
        return
    try:
        with load_logs_hidden():
            import tensorflow  # noqa: F401
    except ImportError:  # a broken install: Keras goes on without it, as it would have; its output was shown
        pass
