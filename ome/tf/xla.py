"""XLA (``tf.function(jit_compile=True)``): tie recomputation to backprop by data, and
read what XLA allocates.

XLA drops control dependencies, and its common-subexpression elimination merges a copy
with its forward original when both read the same values; then the copy runs in the
forward pass and nothing is saved. So under XLA the rewrite (``ome.tf.rewrite``) makes a
group's copies read their saved inputs through

- :func:`barrier`: one optimization barrier over the saved inputs and the backward
  tensors the group waits for, where XLA keeps it through its passes (XLA:GPU expands it
  only after scheduling and rematerialization; XLA:CPU before its second CSE pass);
- :func:`tied`: ``x - z`` with ``z`` a ``+0.0`` (or integer 0) computed from the bits of
  those backward tensors. XLA's algebraic simplifier folds ``A - A`` for integers and
  ``A - 0`` only for a literal zero; it has no rule for shifts, so
  ``(bits >> (width - 1)) >> 1``, always 0, stays a computation it cannot prove zero.
  ``x - (+0.0)`` is ``x`` for every float, ``-0.0``, NaN and Inf included (``x + 0.0``
  would turn ``-0.0`` into ``+0.0``); integers subtract 0, booleans compare with False.

:func:`buffers` reads XLA's own plan of a compiled function: the buffer assignment of its
optimized HLO module.
"""
import dataclasses

import tensorflow as tf

from ome import errors
from ome.tf import tfprivate

# The unsigned integer of each width, for a tensor's bits.
_UNSIGNED = {1: tf.uint8, 2: tf.uint16, 4: tf.uint32, 8: tf.uint64}


def compiled(graph):
    """Whether ops built in ``graph`` are compiled by XLA (``jit_compile=True`` on the
    ``tf.function`` tracing it or one it is nested in)."""
    return tfprivate.in_xla_compilation(graph)


def can_tie(dtype):
    """Whether :func:`tied` can pass a tensor of ``dtype``, and a tensor of ``dtype`` can
    be a source of its zero."""
    return dtype == tf.bool or dtype.is_floating or dtype.is_complex or dtype.is_integer


def barrier(tensors):
    """``tensors`` through one XLA optimization barrier. Give it floats only: an integer
    may be a shape or an axis that XLA needs as a compile-time constant."""
    return tfprivate.optimization_barrier(tensors) if tensors else []


def tied(tensor, sources, name="tied"):
    """``tensor``, bit for bit, computed from the values of ``sources`` too: XLA runs it
    after them and cannot merge what reads it with what reads ``tensor``.

    Raises ``ome.errors.UnsupportedGraphError`` for a dtype :func:`can_tie` refuses.
    """
    dtype = tensor.dtype
    if not can_tie(dtype):
        raise errors.UnsupportedGraphError(
            f"under XLA ome ties recomputation to backprop through a {dtype.name} tensor "
            f"({tensor.name}), which it cannot pass unchanged: compile the step without "
            "jit_compile, or keep that tensor (pin={tensor: 'keep'})")
    with tf.name_scope(name):
        zero = _hidden_zero(sources)
        if dtype == tf.bool:
            return tf.not_equal(tensor, tf.cast(zero, tf.bool))
        if dtype.is_integer:
            return tf.subtract(tensor, tf.cast(zero, dtype))
        part = dtype.real_dtype
        float_zero = tf.bitcast(tf.cast(zero, _UNSIGNED[part.size]), part)  # +0.0
        if dtype.is_complex:
            float_zero = tf.complex(float_zero, float_zero)
        return tf.subtract(tensor, float_zero)


def _hidden_zero(sources):
    """A uint32 scalar 0 computed from one element of each of ``sources``."""
    zeros = []
    for source in sources:
        bits = tf.reshape(_bits(source), [-1])[:1]
        width = bits.dtype.size * 8
        sign = tf.bitwise.right_shift(bits, tf.constant(width - 1, bits.dtype))  # 0 or 1
        zero = tf.bitwise.right_shift(sign, tf.constant(1, bits.dtype))
        zeros.append(tf.cast(tf.reduce_max(zero), tf.uint32))  # an empty source: 0 too
    total = zeros[0]
    for zero in zeros[1:]:
        total = tf.bitwise.bitwise_or(total, zero)
    return total


def _bits(tensor):
    """``tensor``'s elements as unsigned integers of their width (a complex's real part)."""
    if tensor.dtype == tf.bool:
        return tf.cast(tensor, tf.uint8)
    if tensor.dtype.is_complex:
        tensor = tf.math.real(tensor)
    unsigned = _UNSIGNED[tensor.dtype.size]
    return tensor if tensor.dtype == unsigned else tf.bitcast(tensor, unsigned)


@dataclasses.dataclass(frozen=True)
class Buffers:
    """XLA's buffer assignment of one compiled function, in bytes: ``total`` sums every
    allocation (parameters, outputs, constants and the temporary buffers, which XLA packs
    into allocations shared by buffers whose lives do not overlap); ``parameters`` the
    entry computation's parameters (weights, inputs); ``temporary`` the rest."""

    total: int
    parameters: int

    @property
    def temporary(self):
        return self.total - self.parameters


def optimized_module(function, *args, **kwargs):
    """The optimized ``HloProto`` XLA compiles ``function`` (a ``tf.function`` with
    ``jit_compile=True``) into for these arguments."""
    serialized = function.experimental_get_compiler_ir(*args, **kwargs)(
        stage="optimized_hlo_proto_serialized")
    return tfprivate.hlo_module(serialized)


def buffers(function, *args, **kwargs):
    """:class:`Buffers` of ``function`` compiled for these arguments.

    Examples
    --------
    >>> f = tf.function(lambda x: tf.tanh(x) * 2, jit_compile=True)  # doctest: +SKIP
    >>> buffers(f, tf.ones([256, 1024])).total  # doctest: +SKIP
    """
    allocations = optimized_module(function, *args, **kwargs).buffer_assignment \
        .buffer_allocations
    return Buffers(total=sum(a.size for a in allocations),
                   parameters=sum(a.size for a in allocations
                                  if a.is_entry_computation_parameter))


def instructions(module):
    """``(opcode, TensorFlow op name)`` of every instruction of an ``HloProto``'s
    computations, fused ones included."""
    return [(i.opcode, i.metadata.op_name) for c in module.hlo_module.computations
            for i in c.instructions]
