"""The small per-backend decisions of the layers, losses, models, data pipelines and command line.

Each function answers one question whose answer depends on the running backend, so that the code
that asks holds no backend switch of its own. Each says what differs per backend, why, and when it
can be deleted (docs/workarounds.md has the figures):

- `refuses_flash_attention(lengths)`: JAX's cuDNN flash attention refuses these lengths in training.
- `needs_float32_logits(dtype)`: Keras' TensorFlow attention forms half-precision logits.
- `scans_blocks_by_default(training)`: a scanned stack of blocks trains faster on JAX's CPU.
- `needs_dense_lookup_gradient()`: TensorFlow's sparse gradient of a table lookup and Keras' Adam.
- `scans_micro_batches()`: gradient caching's micro-batches as one scan (JAX) or a loop.
- `loop(count, body, init)`: the chunked losses' loop with a static trip count.
- `steps_run_eagerly()`: Keras' train and test steps run eagerly (PyTorch).
- `hides_gpus_from_tf_data()`: tf.data under another backend needs no GPU.
- `one_intra_op_thread()`: PyTorch's intra-op threads for small models on a busy CPU.
- `untracked_inference(method)`: PyTorch's autograd records eager calls unless told not to.

Example:
>>> scans_blocks_by_default(training=False)
False
"""

import contextlib
import functools

import keras
from keras import ops


def refuses_flash_attention(lengths):
    """Whether the attention must tell Keras not to pick a flash attention for these sequence lengths.

    JAX: True when a length is unknown or not a multiple of 64. Keras checks cuDNN's flash attention
    for inference only; in training cuDNN also needs both sequence lengths to be multiples of 64, and
    a ViT-B/16's 197 tokens in bfloat16 on a GPU fail with "Unsupported sequence length Q 197, KV
    197". Off the GPU Keras never picks it. TensorFlow and PyTorch: False (Keras decides).

    Delete when Keras checks cuDNN's training constraints before picking its flash attention, or
    cuDNN trains at any sequence length.

    Args:
        lengths: the query's and the key's sequence lengths (ints, or None when unknown).

    Returns:
        bool.
    """
    return keras.backend.backend() == "jax" and any(n is None or n % 64 for n in lengths)


def needs_float32_logits(dtype):
    """Whether the attention's query and key must be cast to float32 before Keras' attention, so that
    the logits `q k^T` are formed in float32.

    TensorFlow: True for inputs not in float32. Keras' TensorFlow attention forms the logits in the
    inputs' dtype, where JAX and PyTorch form float32 logits from the same bfloat16 inputs; products
    of bfloat16 numbers are exact in float32, so the cast operands give the logits the other
    backends give (docs/precision.md). JAX and PyTorch: False.

    Delete when Keras' TensorFlow `dot_product_attention` forms half-precision inputs' logits in
    float32.

    Args:
        dtype: the query's dtype.

    Returns:
        bool.
    """
    return keras.backend.backend() == "tensorflow" and dtype != "float32"


def scans_blocks_by_default(training):
    """Whether a transformer's stack of blocks is scanned by default (`apply_blocks(scan=None)`): in
    training on JAX when it computes on the CPU.

    JAX on the CPU: given the unrolled stack, XLA's CPU compiler fuses the residual stream's gradient
    sums over all later blocks into every block's backward pass, so a training step costs more than
    the sum of its blocks; scanned, it costs their sum and compiles faster. On a GPU the scanned stack
    is the slower one and holds more memory. Inference does not scan (an eager scan would be traced
    again at every call). TensorFlow and PyTorch: never.

    Delete when XLA:CPU compiles an unrolled stack as fast as the sum of its blocks.

    Args:
        training: whether the call trains.

    Returns:
        bool.
    """
    if not training or keras.backend.backend() != "jax":
        return False
    return keras.distribution.list_devices()[0].startswith("cpu")


def needs_dense_lookup_gradient():
    """Whether a token embedding's table, in training, is read through `ops.where` so that its gradient is
    one dense gradient with a repeated token's rows summed.

    TensorFlow: True. There the gradient of a table lookup is an `IndexedSlices` with one row per
    looked-up token, and Keras' Adam and AdamW square those rows one by one before they are summed,
    so a token that occurs `k` times in a batch takes a step up to `sqrt(k)` times too large. JAX and
    PyTorch compute the summed gradient: False.

    Delete when Keras' optimizers sum an `IndexedSlices` gradient's repeated rows before squaring
    them.

    Returns:
        bool.
    """
    return keras.backend.backend() == "tensorflow"


def scans_micro_batches():
    """Whether gradient caching runs its micro-batches in one `ops.scan` rather than a Python loop.

    JAX: True; the towers are traced and compiled once, whatever the number of micro-batches (a
    Python loop would put one copy of each tower per micro-batch into the compiled step).
    TensorFlow's `ops.scan` needs outputs shaped like its carry, and PyTorch runs eagerly: False,
    they loop.

    Delete when TensorFlow's `ops.scan` takes outputs shaped unlike its carry and a loop costs
    PyTorch nothing over a scan: then every backend scans.

    Returns:
        bool.
    """
    return keras.backend.backend() == "jax"


def loop(count, body, init):
    """`carry = body(k, carry)` for `k = 0 .. count - 1`, a real loop with the static trip count
    `count`; returns `carry`.

    TensorFlow: `ops.while_loop` with `maximum_iterations`, whose gradient needs it to compile with
    XLA (`ops.fori_loop` does not pass it). JAX and PyTorch: `ops.fori_loop` (a scan on JAX,
    reverse-differentiable; a Python loop on PyTorch).

    Delete when Keras' TensorFlow `fori_loop` passes a static trip count as `maximum_iterations`:
    then `ops.fori_loop` serves every backend.

    Args:
        count: python int >= 1.
        body: `body(k, carry) -> carry`, `carry` a tuple of tensors of fixed shapes and dtypes, `k` a
            scalar loop index.
        init: the initial carry, a tuple of tensors.

    Returns:
        The final carry, a tuple.
    """
    if keras.backend.backend() == "tensorflow":
        out = ops.while_loop(
            lambda k, *carry: k < count,
            lambda k, *carry: (k + 1,) + tuple(body(k, carry)),
            (ops.convert_to_tensor(0, "int32"),) + init,
            maximum_iterations=count,
        )
        return tuple(out[1:])
    return tuple(ops.fori_loop(0, count, lambda k, c: tuple(body(k, c)),
                               init))


def steps_run_eagerly():
    """Whether Keras' train and test steps run eagerly, so that a model's forward pass in them gains from
    running as a traced program (`vlzoo.compiled.forward_function`).

    PyTorch: True; Keras' PyTorch steps dispatch each operation from Python. JAX and TensorFlow:
    False; Keras compiles their steps already.

    Delete when Keras compiles PyTorch's train and test steps, or its eager dispatch on PyTorch costs
    what PyTorch's own does.

    Returns:
        bool.
    """
    return keras.backend.backend() == "torch"


def hides_gpus_from_tf_data():
    """Whether TensorFlow, imported for a `tf.data` pipeline, is kept from the GPUs.

    JAX and PyTorch: True; there tf.data only needs the CPU, and a TensorFlow that sees the GPU would
    reserve its memory. TensorFlow: False, Keras computes through it.

    Delete when the pipelines no longer run on tf.data, or TensorFlow reserves no GPU memory it is
    not asked to use.

    Returns:
        bool.
    """
    return keras.backend.backend() != "tensorflow"


@contextlib.contextmanager
def one_intra_op_thread():
    """PyTorch's intra-op threads set to 1 inside the block (restored after); nothing on JAX and TensorFlow.

    For a small model's eager calls (the command line's demo): its operations are far too small to
    gain from threads, and on a busy machine PyTorch's thread pool makes each one 10 to 100 times
    slower. JAX and TensorFlow compile the calls into programs that their runtimes schedule.

    Delete when PyTorch's thread pool no longer slows small operations on a busy machine.
    """
    if keras.backend.backend() != "torch":
        yield
        return
    import torch  # already imported by Keras's torch backend

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def untracked_inference(method):
    """`method`, a model's inference method, run without PyTorch's autograd recording it, unless one of its
    arguments is a tensor that requires a gradient.

    PyTorch: autograd records every eager operation on a weight that requires a gradient (every trainable
    weight does), so an inference call's outputs hold a graph of its activations: embeddings kept from a
    loop keep every batch's activations alive, and `np.asarray` refuses them. Keras' `predict` runs under
    `torch.no_grad()` for that reason; decorated, `method` does too. An argument with `requires_grad` asks
    for a gradient: then `method` runs as it is, and autograd records it (gradients flow to that argument
    and to the weights). An enclosing `torch.no_grad()` keeps its effect either way. JAX and TensorFlow
    record gradients only inside a transform (`jax.grad`) or a `tf.GradientTape`: `method` runs as it is.

    Nothing to delete: PyTorch's autograd records by default, by design. The decorated method is marked
    (`untracked_inference` True), and a marked method is returned as it is.

    Args:
        method: a function whose first argument is `self` and whose other arguments are tensors, arrays,
            nested structures of them, or other values.

    Returns:
        The method, wrapped.
    """
    if getattr(method, "untracked_inference", False):
        return method

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if keras.backend.backend() != "torch" or any(
                getattr(leaf, "requires_grad", False) is True for leaf in keras.tree.flatten((args, kwargs))):
            return method(self, *args, **kwargs)
        import torch  # already imported by Keras's torch backend

        with torch.no_grad():
            return method(self, *args, **kwargs)

    call.untracked_inference = True
    return call
