"""The accelerator side of `tools/bench.py`: which device a backend computes on, waiting for its
results, placing inputs on it and its peak memory. Every function is a no-op or None on the CPU."""

import functools
import sys


@functools.cache
def accelerator():
    """Name of the accelerator that this process's Keras backend computes on (`'NVIDIA H100 80GB HBM3'`), or None."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return None if device.platform == "cpu" else device.device_kind
    if backend == "torch":
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else None
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else None


def torch_cuda():
    """PyTorch's module when this process has used CUDA through it (open_clip, or Keras on torch), else None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_initialized() else None


class DevicePeakMemory:
    """Peak accelerator memory above the memory in use at entry, while the `with` block runs (MB; None on the CPU).

    Summed over the frameworks using the accelerator (open_clip's PyTorch beside Keras' JAX run in
    turn): PyTorch's `max_memory_allocated`, reset at entry (exact); JAX's `peak_bytes_in_use`, a
    high-water mark that cannot be reset, so exact when the block raises it, else a lower bound (the
    bytes in use at entry or exit, as `PeakMemory`).
    """

    def __enter__(self):
        import keras

        on_jax = keras.backend.backend() == "jax" and accelerator()
        self._jax, self._torch = sys.modules["jax"].local_devices()[0] if on_jax else None, torch_cuda()
        if self._jax is not None:
            stats = self._jax.memory_stats()
            self._jax_start = stats["bytes_in_use"], stats["peak_bytes_in_use"]
        if self._torch is not None:
            self._torch.cuda.synchronize()
            self._torch.cuda.reset_peak_memory_stats()
            self._torch_start = self._torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc):
        peaks = []
        if self._jax is not None:
            stats, (in_use, high) = self._jax.memory_stats(), self._jax_start
            end = stats["peak_bytes_in_use"] if stats["peak_bytes_in_use"] > high else max(stats["bytes_in_use"], in_use)
            peaks.append(end - in_use)
        if self._torch is not None:
            self._torch.cuda.synchronize()
            peaks.append(self._torch.cuda.max_memory_allocated() - self._torch_start)
        self.peak_mb = sum(peaks) / 2**20 if peaks else None


def wait_for(result):
    """Waits for `result` on an accelerator without copying it to the host (TensorFlow's tensors are copied)."""
    import keras

    for x in keras.tree.flatten(result):
        if hasattr(x, "block_until_ready"):  # a JAX array
            x.block_until_ready()
        elif hasattr(x, "numpy") and not hasattr(x, "detach"):  # a TensorFlow tensor: no wait without a copy
            x.numpy()
    if torch_cuda() is not None:  # torch's tensors, and open_clip's optimizer step after its loss
        torch_cuda().cuda.synchronize()


def to_accelerator(batch):
    """`batch` (numpy arrays) on the backend's accelerator once, as open_clip's (else every call times
    its copy: 9.6 MB for a ViT-B/16 batch of 16); unchanged on the CPU."""
    import keras

    return keras.tree.map_structure(keras.ops.convert_to_tensor, batch) if accelerator() else batch
