"""Names of the ops the rewrite adds in place of a tensor: copies, swap-ins, gates, held
gradients.

Grappler sorts the inputs of a commutative op by name (its canonicalizer) before its
arithmetic optimizer regroups trees of sums and products, so an op read in place of a
tensor must sort among the graph's names where that tensor's producer does, or the
regrouping and a gradient's last bits change. Such an op is named beside the producer
(past the identities Grappler removes first: a SiLU's product, not the IdentityN of its
custom gradient), ``<producer>-ome_<kind>``: ``-`` sorts before every other character a
name may go on with. It is outside the backward pass's name scope, so it records the
scope it was made in (:func:`in_scope`).
"""
import tensorflow as tf

from ome.tf import tfprivate

MARK = "-ome_"
_SCOPE_ATTR = "_ome_scope"


def beside(producer, kind, build):
    """``build(name)``'s result (a tensor or an op), named beside op ``producer`` (a name)
    for ``kind`` and marked with the current name scope."""
    graph = tf.compat.v1.get_default_graph()
    scope = graph.get_name_scope()
    with graph.name_scope(None):
        made = build(f"{producer}{MARK}{kind}")
    tfprivate.set_string_attr(getattr(made, "op", made), _SCOPE_ATTR, scope)
    return made


def in_scope(op, scope):
    """Whether ``op`` is under name scope ``scope``, or stands in for a tensor there."""
    prefix = scope + "/"
    return op.name.startswith(prefix) or \
        (tfprivate.string_attr(op, _SCOPE_ATTR) + "/").startswith(prefix)


def is_stand_in(name, kind=""):
    """Whether op ``name`` (from a trace or a graph) was named by :func:`beside` (for
    ``kind``, if given: ``"recomputed"``, ``"swapped_in"``, ``"gate"``, ``"held"``)."""
    return MARK + kind in name
