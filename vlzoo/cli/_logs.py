"""Framework C++ logs on the command line: hidden unless the user asks for them.

TensorFlow's and XLA's load-time lines ("failed call to cuInit", "oneDNN custom
operations are on", "Could not find cuda drivers" on a machine without a GPU)
read as errors but are not. The command line sets `TF_CPP_MIN_LOG_LEVEL=3`
unless `VLZOO_VERBOSE=1` or the user set their own level; the processes the
commands start inherit it. `TF_ENABLE_ONEDNN_OPTS`, which changes numerics, is
left alone.
"""

import os
import sys


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
