"""What this process runs on: the CPU model and the vector units that decide its numerics and speed.

Which kernels the backends pick depends on the CPU's vector units: with `avx512_bf16` (or AMX)
TensorFlow's oneDNN and PyTorch run bfloat16 products natively, on AVX2-only CPUs they fall back to
other kernels, so rounding and speed differ between hosts. Benchmarks and the test suite's header
name the host with `describe_host()`.

>>> from vlzoo.host import describe_host
>>> describe_host()  # doctest: +SKIP
'AMD EPYC, 2 cores, Linux, CPU flags: avx avx2 fma f16c (none of avx512f avx512_bf16 ...)'
"""

import os
import platform

# The CPU features that select the frameworks' float32 and bfloat16 kernels (x86 names, as
# /proc/cpuinfo spells them).
VECTOR_FEATURES = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                   "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def cpu_info():
    """`(model, flags)`: the CPU's model name and its set of feature flags (empty where unknown).

    Read from `/proc/cpuinfo` (Linux); elsewhere the model is `platform.processor()` and the
    flags are unknown.
    """
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            first_cpu = f.read().split("\n\n")[0].splitlines()
    except OSError:
        return model, flags
    info = dict((key.strip(), value.strip()) for key, value in (line.split(":", 1) for line in first_cpu if ":" in line))
    return info.get("model name", model), set(info.get("flags", "").split())


def describe_host():
    """`"<CPU model>, <n> cores, <OS>, CPU flags: <present> (none of <absent>)"` over `VECTOR_FEATURES`."""
    model, flags = cpu_info()
    head = f"{model}, {os.cpu_count()} cores, {platform.system()}, CPU flags: "
    if not flags:
        return head + "unknown"
    present = [f for f in VECTOR_FEATURES if f in flags]
    absent = [f for f in VECTOR_FEATURES if f not in flags]
    return head + (" ".join(present) or "-") + (f" (none of {' '.join(absent)})" if absent else "")
