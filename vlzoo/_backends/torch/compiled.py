"""PyTorch: eager calls as a traced TorchScript program of the function of the variables' values."""

import warnings

import keras
import numpy as np
import torch

from vlzoo._backends.keras_internals import in_stateless_scope


def _signature(args, leaves):
    """What a traced program is specialised to: its inputs' structure, and each one's shape, dtype and device."""
    structure = keras.tree.flatten_with_path(args)
    return tuple((path, tuple(leaf.shape), leaf.dtype, leaf.device) for (path, _), leaf in zip(structure, leaves))


class _RecordingScope(keras.StatelessScope):
    """A `keras.StatelessScope` that records which of its variables were read, in the order first read, and
    whether the call had effects a traced program would not replay: an `assign` (the state of a
    `keras.random.SeedGenerator` among them) or an `add_loss`."""

    def __init__(self, state_mapping):
        super().__init__(state_mapping=state_mapping, collect_losses=True)
        self.read = {}
        self.assigned = False

    def get_current_value(self, variable):
        value = super().get_current_value(variable)
        if value is not None:
            self.read.setdefault(id(variable), variable)
        return value

    def add_update(self, update):
        self.assigned = True
        super().add_update(update)


def _trace(stateless, example):
    """`torch.jit.trace` of `stateless` on `example`, without its warnings: the deprecation notice (the
    pinned torch keeps the tracer) and the `TracerWarning`s on Python values read from shapes, which
    the program is specialised to anyway."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.trace` is deprecated", category=DeprecationWarning)
        return torch.jit.trace(stateless, example, check_trace=False, strict=False)


def inference_function(fn, variables):
    """`fn` traced once per input signature, run with the current values of the variables it reads
    (`vlzoo.compiled`).

    The values of the variables `fn` reads are inputs of the traced program, not constants, so an
    `assign` or a `fit` step is seen, and the program is differentiable (autograd gives the gradients
    of `fn`). It runs with TorchScript's graph optimisations off (`torch.jit.optimized_execution`), so
    it runs the eager call's kernels: outputs and gradients equal the eager ones bit for bit wherever
    the kernels are deterministic.

    Per input signature (structure, shapes, dtypes, devices, and the model's variables when traced:
    `enable_lora` and `quantize` cause a new trace), the first two calls run `fn` eagerly, noting the
    variables it reads; the third traces it; later calls run the program. `fn` must depend on its
    inputs' values only through tensor operations (as `jax.jit` requires). These run eagerly as `fn`,
    always: inputs with a non-array leaf; a function the tracer cannot record; one that assigns a
    variable (random operations advance their seed's state) or adds a loss; a call inside another
    `keras.StatelessScope` (a stateless call, Keras' shape inference). Why the tracer and what it
    buys: docs/benchmarks.md, *Host overhead*.

    Args:
        fn: a function of tensors (or dicts of them) that reads Keras variables.
        variables: a function returning the variables `fn` may read; called at each call.

    Returns:
        A function with `fn`'s arguments and outputs.

    Example:
    >>> encode = inference_function(lambda x: model.vision(x)["pooled"],
    ...                             lambda: model.vision.variables)  # doctest: +SKIP
    >>> [encode(x) for _ in range(3)][-1].shape  # the third call traces  # doctest: +SKIP
    torch.Size([2, 512])
    """
    programs = {}  # signature -> {"variables" (the model's when first seen), "read", "structure", "calls", "program"}

    def first_call(args, leaves, current):
        with _RecordingScope([(v, v.value) for v in current]) as scope:
            outputs = fn(*keras.tree.pack_sequence_as(args, leaves))
        stateful = scope.assigned or bool(scope.losses)
        programs[_signature(args, leaves)] = {
            "variables": tuple(current), "read": list(scope.read.values()), "calls": 1,
            "program": False if stateful else None,  # False: eager from now on
            "structure": keras.tree.map_structure(lambda _: 0, outputs),  # not the tensors themselves
        }
        if stateful:  # the scope kept the assignments and losses from the variables and layers: run it for real
            return fn(*args)
        return outputs

    def trace(args, leaves, entry):
        read = entry["read"]

        def stateless(*flat):
            with keras.StatelessScope(state_mapping=list(zip(read, flat[len(leaves):]))):
                return tuple(keras.tree.flatten(fn(*keras.tree.pack_sequence_as(args, list(flat[:len(leaves)])))))

        try:
            return _trace(stateless, (*leaves, *[v.value for v in read]))
        except (RuntimeError, TypeError, ValueError):
            return False  # not recordable: eager from now on

    def call(*args):
        leaves = keras.tree.flatten(args)
        if in_stateless_scope() or not all(isinstance(leaf, (np.ndarray, torch.Tensor)) for leaf in leaves):
            return fn(*args)
        leaves = [keras.ops.convert_to_tensor(leaf) for leaf in leaves]
        current = variables()
        entry = programs.get(_signature(args, leaves))
        if entry is None or len(entry["variables"]) != len(current) or any(
                a is not b for a, b in zip(entry["variables"], current)):
            return first_call(args, leaves, current)
        if entry["program"] is None:
            entry["calls"] += 1
            if entry["calls"] < 3:
                return fn(*args)
            entry["program"] = trace(args, leaves, entry)
        if entry["program"] is False:
            return fn(*args)
        with torch.jit.optimized_execution(False):
            flat = entry["program"](*leaves, *[v.value for v in entry["read"]])
        structure = entry["structure"]
        outputs = keras.tree.pack_sequence_as(structure, list(flat))
        return {key: outputs[key] for key in structure} if isinstance(structure, dict) else outputs  # packed sorted

    return call
