"""OpenAI's gradient checkpointing, and ome itself, both through ``ome.gradients``.

ome's ``memory`` policy is OpenAI's bottleneck test with its sqrt(N) thinning, ``speed``
keeps conv/matmul outputs, ``collection`` reads the graph collection "checkpoints", and
ome's rewrite is OpenAI's segment scheme, so the OpenAI baseline is ``ome.gradients`` with
one of those modes and no swapping. docs/BASELINES.md lists where it still differs from
OpenAI's TF1 library.
"""
import ome
from ome import errors
from ome.policies import select

from baselines.core import Built, Timer, graph_of

OPENAI_MODES = ("memory", "speed", "collection")


def plan_facts(plan, info):
    """The ``Built.info`` facts of an ome plan and its ``RewriteInfo``."""
    return dict(policy=plan.policy, checkpoints=tuple(plan.checkpoints),
                swapped=tuple(plan.swapped), groups=info.groups, copied_ops=info.copied_ops,
                host_device=plan.host_device, estimates=dict(plan.estimates))


def _facts(strategy, plan, info, timer):
    return timer.facts(strategy=strategy, **plan_facts(plan, info))


def openai(loss, variables, *, checkpoints="memory", batch_size=None, cost_model=None):
    """OpenAI's ``gradients(ys, xs, checkpoints=...)``: 'memory' (default), 'speed' or
    'collection'. Raises :class:`ome.errors.NoBottleneckError` where 'memory' finds no
    tensor that separates the graph, as OpenAI's library did. ``cost_model`` only informs
    the plan's predictions (OpenAI's choice ignores costs)."""
    if checkpoints not in OPENAI_MODES:
        raise errors.InvalidArgumentError(
            f"openai: checkpoints must be one of {OPENAI_MODES} (OpenAI's modes), got "
            f"{checkpoints!r}; a list of tensors is ome's own extension: use strategy 'ome'")
    timer = Timer(graph_of(loss))
    # ome's own "speed" takes its optimal planner's plan when a cost model finds a lower one
    # at no more time; given as a policy, the choice stays OpenAI's
    policy = select.speed if checkpoints == "speed" else checkpoints
    grads, (plan, info) = ome.gradients(loss, variables, checkpoints=policy,
                                        batch_size=batch_size, cost_model=cost_model,
                                        hold_gradients=False,  # ome's own addition
                                        return_info=True, name="openai_gradients")
    return Built(grads=grads, info=_facts(f"openai-{checkpoints}", plan, info, timer))


def openai_memory(loss, variables, *, batch_size=None, cost_model=None):
    """``openai`` with ``checkpoints='memory'`` (the same as plain ``openai``)."""
    return openai(loss, variables, checkpoints="memory", batch_size=batch_size,
                  cost_model=cost_model)


def openai_speed(loss, variables, *, batch_size=None, cost_model=None):
    """``openai`` with ``checkpoints='speed'``: keep every conv/matmul output."""
    return openai(loss, variables, checkpoints="speed", batch_size=batch_size,
                  cost_model=cost_model)


def openai_collection(loss, variables, *, batch_size=None, cost_model=None):
    """``openai`` with ``checkpoints='collection'``: the graph collection "checkpoints"."""
    return openai(loss, variables, checkpoints="collection", batch_size=batch_size,
                  cost_model=cost_model)


def _ome(strategy, loss, variables, **options):
    timer = Timer(graph_of(loss))
    grads, (plan, info) = ome.gradients(loss, variables, return_info=True, **options)
    return Built(grads=grads, info=_facts(strategy, plan, info, timer))


def ome_default(loss, variables, *, checkpoints="auto", swap=False, host_device=None,
                batch_size=None, cost_model=None):
    """``ome.gradients`` with its defaults (``checkpoints='auto'``, no swapping);
    ``cost_model``: a profile (``ome.profile``) the plan uses instead of static costs."""
    return _ome("ome", loss, variables, checkpoints=checkpoints, swap=swap,
                host_device=host_device, batch_size=batch_size, cost_model=cost_model)


def ome_swap(loss, variables, *, checkpoints="auto", swap="auto", host_device=None,
             batch_size=None, cost_model=None):
    """``ome.gradients(swap='auto')``: with ``cost_model``, a lower peak with swaps at no more
    added time than ``ome``'s plan, where one exists; without it, ``ome``'s plan."""
    return _ome("ome-swap", loss, variables, checkpoints=checkpoints, swap=swap,
                host_device=host_device, batch_size=batch_size, cost_model=cost_model)


def ome_speed(loss, variables, *, host_device=None, batch_size=None, cost_model=None):
    """``ome.gradients(checkpoints='speed')``: keep every conv/matmul output, recompute
    only the cheap ops after them, per tensor (a kept tensor's producer never runs again)."""
    return _ome("ome-speed", loss, variables, checkpoints="speed", host_device=host_device,
                batch_size=batch_size, cost_model=cost_model)


def ome_optimal(loss, variables, *, host_device=None, batch_size=None, cost_model=None):
    """``ome.gradients(checkpoints='optimal')``: the MILP planner's smallest peak, then the
    least added time at it (docs/ALGORITHM.md section 7)."""
    return _ome("ome-optimal", loss, variables, checkpoints="optimal",
                host_device=host_device, batch_size=batch_size, cost_model=cost_model)


def ome_budget(loss, variables, *, memory_budget, host_device=None, batch_size=None,
               cost_model=None):
    """``ome.gradients(memory_budget=...)``: keep / recompute / swap chosen to fit a budget
    (bytes or "2GiB"), swapping allowed; ``cost_model`` (``ome.profile``) makes the budget
    count kernel scratch memory and what stays allocated between steps."""
    return _ome("ome-budget", loss, variables, memory_budget=memory_budget, swap="auto",
                host_device=host_device, batch_size=batch_size, cost_model=cost_model)


def ome_budget_recompute(loss, variables, *, memory_budget, batch_size=None, cost_model=None):
    """``ome.gradients(memory_budget=...)`` as it comes, without a host: keep or recompute
    each tensor to fit the budget at the least added time, nothing swapped."""
    return _ome("ome-budget-recompute", loss, variables, memory_budget=memory_budget,
                batch_size=batch_size, cost_model=cost_model)


def ome_optimal_swap(loss, variables, *, host_device=None, batch_size=None, cost_model=None):
    """``ome.gradients(checkpoints='optimal', swap='auto')``: the MILP planner's smallest
    peak with the host to swap to (keep, recompute or swap per tensor), then the least
    added time at it; the leftmost point of ome's frontier."""
    return _ome("ome-optimal-swap", loss, variables, checkpoints="optimal", swap="auto",
                host_device=host_device, batch_size=batch_size, cost_model=cost_model)
