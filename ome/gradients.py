"""``ome.gradients``: ``tf.gradients`` with the memory of a plan that recomputes and swaps.

The flow is validate -> build ``tf.gradients`` -> capture -> plan (a policy) -> apply.
The backward ops are ``tf.gradients``' own; the plan only changes where they read forward
tensors from.

Where a copy of the graph is used, and why (the one place that says it): options that can
be refused (explicit checkpoints, pins, swap lists, a budget, the bottleneck policy,
unknown sizes) are planned on a copy, so an error leaves the user's graph exactly as it
was; ``ome.plan`` and ``ome.capture_view`` are previews, made on a copy; ``apply_plan``
checks a saved plan's step on a copy before building. The copy carries the graph's
gradient caches (``tfprivate.copy_gradient_caches``), so ``tf.gradients`` builds the same
ops on it, and the plan made there is the plan built. Only where the copy's step still
differs from the graph's (a gradient function of TensorFlow's that reads state a copy
does not have) is the plan made again on the graph itself, so it is always the plan of
the ops built. A graph a copy cannot rebuild (a gradient function of its own, nested
functional control flow, a ``tf.function`` graph whose captured variables lose their
shapes in a copy) is planned on the graph itself, after ``tf.gradients`` built its ops
there.
"""
import dataclasses
import functools
import inspect
import logging
import time

import tensorflow as tf

from ome.tf import capture as capture_mod
from ome import errors, measured_calls
from ome.core import plans, sizes
from ome.policies import planner, search, select, transformer
from ome.tf import host, measure, rewrite, tfprivate, xla
from ome.core.costs import STATIC, CostModel
from ome.core.plans import Plan, make_plan
from ome.core.schedule import Decision

log = logging.getLogger(__name__)

CHECKPOINT_MODES = ("auto", "optimal", "memory", "speed", "collection", "none", "selective",
                    "full")
# Transformer policies (ome.policies.transformer): named by the user for their trade, so built as
# asked even where the simulator predicts no lower peak.
TRANSFORMER_MODES = ("selective", "full")
_UNCONNECTED = ("none", "zero")
# How a plan made from static estimates gets measured costs, said by the warnings that
# name its shortfall.
_MEASURE_HINT = ("a step that measures itself is planned again from what it measured "
                 "(ome.Session, ome.function, ome.keras.wrap), or pass cost_model= "
                 "(ome.profile, ome.profile_steps)")
#: The batch unknown dimensions are planned at when no budget needs the real one.
ASSUMED_BATCH = 64


def _as_list(value):
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _unwrap_variable(value):
    """The ``tf.Variable`` behind a Keras 3 variable (TensorFlow backend), else ``value``."""
    inner = getattr(value, "value", None)
    if not isinstance(value, (tf.Variable, tf.Tensor)) and isinstance(inner, tf.Variable):
        return inner
    return value


def _graph_tensor(value, what):
    """``value`` as a graph tensor; variables become what ``tf.gradients`` differentiates,
    and ``tensor.ref()`` its tensor (what a dict key must be inside ``tf.function``)."""
    if isinstance(value, tfprivate.REFERENCE_TYPE):
        value = value.deref()
    value = _unwrap_variable(value)
    if isinstance(value, tf.Variable):
        graph = tf.compat.v1.get_default_graph()
        if not hasattr(value, "handle"):  # a reference variable: its ref tensor
            return tfprivate.reference_tensor(value)
        handle = value.handle
        if not hasattr(handle, "graph") and hasattr(graph, "capture"):
            # Inside tf.function: the eager variable's handle enters as a capture.
            handle = graph.capture(handle)
        if not hasattr(handle, "graph"):
            raise errors.InvalidTypeError(
                f"{what} {value.name} is a variable outside any graph being built; ome "
                "rewrites graphs: call it inside tf.function or a tf.Graph")
        return handle
    if isinstance(value, tf.IndexedSlices):
        raise errors.InvalidTypeError(f"{what} is IndexedSlices; pass a dense tensor")
    if not isinstance(value, tf.Tensor):
        raise errors.InvalidTypeError(
            f"{what} must be tf.Tensor or tf.Variable, got {type(value).__name__}")
    if not hasattr(value, "graph"):
        raise errors.InvalidTypeError(
            f"{what} {value!r} is an eager tensor; ome rewrites graphs: use it inside "
            "tf.function, or build the model in graph mode "
            "(tf.compat.v1.disable_eager_execution() or tf.Graph().as_default())")
    return value


def _validate_inputs(ys, xs, grad_ys):
    ys = [_graph_tensor(y, "ys entry") for y in _as_list(ys)]
    xs = [_graph_tensor(x, "xs entry") for x in _as_list(xs)]
    if not ys:
        raise errors.InvalidArgumentError("ys is empty: pass the tensor(s) to differentiate")
    if not xs:
        raise errors.InvalidArgumentError("xs is empty: pass the tensor(s) or variables to "
                                          "differentiate with respect to")
    graph = ys[0].graph
    for what, items in (("ys", ys), ("xs", xs)):
        for t in items:
            if t.graph is not graph:
                raise errors.InvalidArgumentError(
                    f"{what} entry {t.name} belongs to another graph than ys[0] "
                    f"({ys[0].name}); all tensors must come from one graph")
    grad_ys = _as_list(grad_ys) or [None] * len(ys)
    if len(grad_ys) != len(ys):
        raise errors.InvalidArgumentError(
            f"grad_ys has {len(grad_ys)} entries for {len(ys)} ys; give one per y (or None)")
    grad_ys = [None if g is None else _graph_tensor(g, "grad_ys entry") for g in grad_ys]
    return ys, xs, grad_ys


def _names(values, what):
    return [_graph_tensor(t, what).name for t in _as_list(values)]


def _is_swap_mode(swap):
    """Whether ``swap`` names a mode (False, None, "auto") rather than tensors; tensors are
    never compared with a mode, which would build an op."""
    return swap is False or swap is None or (isinstance(swap, str) and swap == "auto")


def _pins_swap(pin):
    """Whether ``pin`` (``{tensor: decision}``) asks for a tensor to be swapped."""
    return any(getattr(v, "value", v) == "swap" for v in (pin or {}).values())


def check_options(*, checkpoints="auto", pin=None, swap=False, host_device=None,
                  memory_budget=None, batch_size=None, swap_ahead=1, cost_model=None,
                  hold_gradients=True, wait_for_leaves=None):
    """Raise a clear error for an option value :func:`gradients` would refuse, before any
    graph is built: ``ome.keras.wrap``, ``ome.GradientTape(...)`` and ``ome.patch(...)``
    check their options here when given, not at the first step. What needs the graph
    (the tensors of a list or of ``pin``, the collection of ``checkpoints="collection"``)
    is checked by each call. Returns ``(budget in bytes or None, host device or None)``."""
    if not isinstance(hold_gradients, bool):
        raise errors.InvalidTypeError(
            f"hold_gradients must be a bool, got {type(hold_gradients).__name__}")
    if wait_for_leaves is not None and not isinstance(wait_for_leaves, bool):
        raise errors.InvalidTypeError(
            f"wait_for_leaves must be None or a bool, got {type(wait_for_leaves).__name__}")
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise errors.InvalidTypeError(
            f"cost_model must be an ome.CostModel (from ome.profile), got "
            f"{type(cost_model).__name__}")
    if isinstance(checkpoints, str) and checkpoints not in CHECKPOINT_MODES:
        raise errors.InvalidArgumentError(
            f"unknown checkpoints mode {checkpoints!r}; use one of {CHECKPOINT_MODES} "
            "or a list of tensors")
    if not _is_swap_mode(swap) and (isinstance(swap, str) or swap is True):
        raise errors.InvalidArgumentError(
            f"swap must be False, 'auto' or a list of tensors, got {swap!r}")
    if pin is not None and not isinstance(pin, dict):
        raise errors.InvalidTypeError(
            f"pin must be a dict {{tensor: 'keep'|'recompute'|'swap'}}, got "
            f"{type(pin).__name__}")
    for value in (pin or {}).values():
        if getattr(value, "value", value) not in select.PIN_VALUES:
            raise errors.InvalidArgumentError(
                f"pin value {value!r}; use one of {sorted(select.PIN_VALUES)}")
    budget = None if memory_budget is None else \
        sizes.parse_bytes(memory_budget, what="memory budget")
    if batch_size is not None and (isinstance(batch_size, bool) or
                                   not isinstance(batch_size, int) or batch_size < 1):
        raise errors.InvalidArgumentError(
            f"batch_size must be a positive int, got {batch_size!r}")
    if isinstance(swap_ahead, bool) or not isinstance(swap_ahead, int) or swap_ahead < 0:
        raise errors.InvalidArgumentError(f"swap_ahead must be an int >= 0, got {swap_ahead!r}")
    asks_swaps = (isinstance(swap, str) and swap == "auto") or \
        (not _is_swap_mode(swap) and bool(_as_list(swap)))
    if asks_swaps or _pins_swap(pin) or (budget is not None and host_device is not None):
        return budget, (host.validate_host_device(host_device) if host_device
                        else host.default_host_device())
    return budget, None


def check_front_door_options(options, *, front_door, sets):
    """Check the ``options`` a front door (``ome.keras.wrap``, ``ome.GradientTape``,
    ``ome.patch``) will pass to :func:`gradients`, when they are given: every name is a
    keyword of :func:`gradients` the front door does not set itself (``sets``), and every
    value passes :func:`check_options`."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    accepted = {name for name, parameter in inspect.signature(gradients).parameters.items()
                if parameter.kind in named} - {"ys", "xs"} - set(sets)
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise errors.InvalidArgumentError(
            f"{front_door}: unknown or not settable option(s) {', '.join(unknown)}; it "
            f"accepts {', '.join(sorted(accepted))}")
    checked = inspect.signature(check_options).parameters
    check_options(**{name: value for name, value in options.items() if name in checked})


def format_options(options):
    """``options`` of :func:`gradients` as a log line shows them: a cost model by its
    summary, not its thousands of op times."""
    return ", ".join(f"{name}={value if isinstance(value, CostModel) else repr(value)}"
                     for name, value in options.items())


class _Options:
    """The planning options of one call, validated before the graph is touched."""

    def __init__(self, checkpoints, pin, swap, host_device, memory_budget, batch_size,
                 swap_ahead, cost_model=None, hold_gradients=True, wait_for_leaves=None):
        self.budget, self.host_device = check_options(
            checkpoints=checkpoints, pin=pin, swap=swap, host_device=host_device,
            memory_budget=memory_budget, batch_size=batch_size, swap_ahead=swap_ahead,
            cost_model=cost_model, hold_gradients=hold_gradients,
            wait_for_leaves=wait_for_leaves)
        self.hold_gradients = hold_gradients
        self.wait_for_leaves = _replicas_in_sync() > 1 if wait_for_leaves is None \
            else wait_for_leaves
        self.model = cost_model or STATIC
        self.measured = cost_model is not None
        if isinstance(checkpoints, str) and checkpoints == "collection":
            collected = tf.compat.v1.get_collection("checkpoints")
            if not collected:
                raise errors.InvalidArgumentError(
                    "checkpoints='collection' but the graph collection 'checkpoints' is "
                    "empty: tf.compat.v1.add_to_collection('checkpoints', tensor) first")
            self.checkpoints = _names(collected, "checkpoints entry")
        elif callable(checkpoints) or isinstance(checkpoints, str):
            self.checkpoints = checkpoints
        else:
            self.checkpoints = _names(checkpoints, "checkpoints entry")
        self.swap = swap if _is_swap_mode(swap) else _names(swap, "swap entry")
        self.pins = {_graph_tensor(t, "pin key").name: v for t, v in (pin or {}).items()}
        if self.budget is not None and cost_model is None:
            log.warning("memory_budget without cost_model: planned from static estimates "
                        "(what stays allocated, no kernel scratch memory), which the "
                        "allocator can exceed; a step that measures itself holds it "
                        "(ome.Session, ome.function, ome.keras.wrap), or pass cost_model= "
                        "(ome.profile, ome.profile_steps)")
        if isinstance(checkpoints, str) and checkpoints == "optimal" and \
                cost_model is None and self.budget is None:
            log.warning("checkpoints='optimal' without cost_model: planned from static "
                        "estimates (each gradient alive to the step's end, no kernel "
                        "scratch memory), which can choose a plan that measures worse than "
                        "'auto''s; %s", _MEASURE_HINT)
        self.batch_size = batch_size
        # Without a budget a plan weighs tensors against each other, not against a limit,
        # so an unknown batch dimension is planned at a stand-in; a budget needs the real one.
        self.sizing_batch = ASSUMED_BATCH if batch_size is None and self.budget is None \
            else batch_size
        self.swap_ahead = swap_ahead
        self.pinned_swaps = _pins_swap(self.pins)

    def user_decided(self):
        """Whether the user chose tensors (a list, pins or swaps): honoured as given."""
        return (not isinstance(self.checkpoints, str) or bool(self.pins)
                or isinstance(self.swap, list) or self.checkpoints in TRANSFORMER_MODES)

    def can_fail(self, forward):
        """Whether planning may refuse these options on the ``forward`` ops (then it is
        tried on a copy first)."""
        return (not isinstance(self.checkpoints, str)
                or self.checkpoints in ("memory",) + TRANSFORMER_MODES
                or bool(self.pins) or isinstance(self.swap, list) or self.budget is not None
                or (self.checkpoints != "none"
                    and _has_unknown_sizes(forward, self.sizing_batch)))


def _replicas_in_sync():
    """Replicas a ``tf.distribute`` strategy runs this step on (1 outside one)."""
    context = tf.distribute.get_replica_context()
    if context is None:  # cross-replica context: the step runs on every replica
        return tf.distribute.get_strategy().num_replicas_in_sync
    return context.num_replicas_in_sync


def _has_unknown_sizes(forward, batch_size):
    """Whether a float tensor of the ``forward`` ops has a size planning cannot know,
    unknown dimensions read as ``batch_size``."""
    return any(t.dtype.is_floating and capture_mod.shape_and_bytes(t, batch_size)[1] is None
               for op in forward for t in op.outputs)


def _with_unknown_dimensions(forward):
    """Float outputs of the ``forward`` ops whose rank is known and some dimension is not
    (a tensor of unknown rank, a kernel's workspace output, is never sized)."""
    return (t for op in forward for t in op.outputs
            if t.dtype.is_floating and t.shape.rank is not None
            and not t.shape.is_fully_defined())


def _check_budget_sizes(options, forward):
    """Refuse a budget, before the graph is touched, where a tensor's bytes are unknown
    (a dimension shape inference left unknown, and no ``batch_size``) and no measured size
    stands in."""
    if options.budget is None or options.sizing_batch is not None:
        return
    for t in _with_unknown_dimensions(forward):
        if t.name not in options.model.output_bytes:
            raise errors.InvalidArgumentError(
                f"memory_budget needs every tensor's bytes, and the size of {t.name!r} "
                f"(shape {t.shape}) is unknown: pass batch_size= to resolve an unknown "
                "batch dimension, or give tensors static shapes")


def _log_assumed_batch(options, forward):
    """Say when the plan's sizes stand an unknown batch dimension in by ASSUMED_BATCH."""
    if options.batch_size is None and options.sizing_batch is not None and \
            next(_with_unknown_dimensions(forward), None) is not None:
        log.info("the batch dimension is unknown: planned with it as %d (the plan weighs "
                 "tensors against each other; pass batch_size= for its predicted bytes)",
                 options.sizing_batch)


def make_policy_plan(view, options, graph):
    """The Plan ``options`` ask for on captured ``view``, the one function every route
    plans through; its ``device_peak`` estimate counts what stays allocated between steps
    (the profile's resident bytes, else :func:`ome.tf.measure.resident_bytes`).

    In order: the policy's (or budget's) decisions and schedule, predicted, and plain
    backprop instead where they save nothing (:func:`_policy_plan`); the gradients held
    where that predicts no higher peak (:func:`_held`, the schedule rebuilt with the
    backward leaves first); the leaf waits of several replicas; the sibling pairs run
    side by side where the replay stays within the peak already predicted
    (``planner.side_by_side``). The result carries its whole schedule, so
    :func:`apply_plan` builds it again as it is."""
    resident = options.model.resident_bytes
    static_bytes = measure.resident_bytes(graph) if resident is None else resident
    view = options.model.sized(view)
    min_saving = planner.XLA_MIN_SAVING if xla.compiled(graph) else planner.MIN_SAVING
    plan = _held(view, _policy_plan(view, options, static_bytes, min_saving), options,
                 static_bytes)
    if options.wait_for_leaves:
        plan = plans.with_leaf_waits(view, plan)
    return planner.side_by_side(view, plan, options.model, static_bytes)


def _policy_plan(view, options, static_bytes, min_saving):
    """The plan of the policy (or budget) ``options`` name, predicted; plain backprop's
    where it is not predicted to save ``min_saving`` of plain's peak."""
    if options.budget is not None:
        return planner.fit_budget(
            view, options.budget, host_device=options.host_device, model=options.model,
            static_bytes=static_bytes, pins=options.pins,
            hold_gradients=options.hold_gradients)
    if callable(options.checkpoints):
        plan = options.checkpoints(view)
        if not isinstance(plan, Plan):
            raise errors.InvalidTypeError(
                f"checkpoints= policy {options.checkpoints!r} returned "
                f"{type(plan).__name__}, not an ome.Plan")
    elif options.checkpoints == "optimal":
        # swap="auto" swaps by measured costs only, as the warning below says; swaps the
        # user pinned go to the host regardless
        weighed = options.swap != "auto" or options.measured or options.pinned_swaps
        plan = search.optimal(view, model=options.model, pins=options.pins,
                               host_device=options.host_device if weighed else None,
                               hold_gradients=options.hold_gradients)
    elif isinstance(options.checkpoints, str):
        policies = transformer.POLICIES if options.checkpoints in TRANSFORMER_MODES \
            else select.POLICIES
        plan = policies[options.checkpoints](view, pins=options.pins,
                                             host_device=options.host_device)
        if options.checkpoints in ("auto", "speed") and options.measured:
            plan = planner.lowest_at_no_more_time(
                view, plan, options.model, pins=options.pins,
                host_device=options.host_device if options.pinned_swaps else None,
                hold_gradients=options.hold_gradients)
    else:
        plan = select.explicit(view, options.checkpoints, pins=options.pins,
                               host_device=options.host_device)
    if options.swap == "auto" and not options.measured:
        log.warning("swap='auto' weighs swaps against recomputation by measured costs: "
                    "planned from static estimates, this plan swaps nothing (they misjudge "
                    "both, and swaps chosen by them can raise the device peak); %s",
                    _MEASURE_HINT)
    elif options.swap == "auto":
        plan = planner.swap_auto(view, plan, options.host_device, options.model,
                                 pins=options.pins, hold_gradients=options.hold_gradients)
    elif options.swap:
        for t in options.swap:
            if t not in view.tensors or not view.is_forward_tensor(t):
                raise errors.InvalidArgumentError(
                    f"swap entry {t} is not a forward tensor of this step")
        plan = planner.with_swaps(view, plan, options.swap, options.host_device,
                                  reason="listed in swap=", swap_ahead=options.swap_ahead)
    elif options.host_device and plan.count(Decision.SWAP):
        plan = make_plan(view, plan.decisions(), {t.tensor: t.reason for t in plan.tensors},
                         plan.policy, checkpoints=plan.checkpoints,
                         host_device=options.host_device, swap_ahead=options.swap_ahead)
    plan = planner.with_predictions(view, plan, options.model, static_bytes)
    if not options.user_decided():
        assumed = options.batch_size is None and options.sizing_batch is not None
        plan = _no_worse_than_plain(view, plan, options.model, static_bytes, min_saving,
                                    assumed_batch=options.sizing_batch if assumed else None)
    return plan


def _held(view, plan, options, static_bytes):
    """``plan`` with its gradients held (``hold_gradients``), predicted again; ``plan``
    itself where holding predicts a higher peak (a gradient waiting for a read its update
    would otherwise have run before lives longer in the replay)."""
    if not options.hold_gradients:
        return plan
    holding = plans.with_gradient_holds(view, plan)
    if holding is plan:  # nothing to hold: no second prediction
        return plan
    held = planner.with_predictions(view, holding, options.model, static_bytes)
    if held.estimates["device_peak"] > plan.estimates["device_peak"]:
        log.info("hold_gradients: holding predicts %s against %s; gradients not held",
                 sizes.format_bytes(held.estimates["device_peak"]),
                 sizes.format_bytes(plan.estimates["device_peak"]))
        return plan
    return held


def _no_worse_than_plain(view, plan, model, static_bytes, min_saving, *, assumed_batch=None):
    """``plan``, or plain backprop when the simulator predicts ``plan`` saves less than
    ``min_saving`` of plain's peak (:data:`ome.policies.planner.MIN_SAVING`, under XLA
    ``XLA_MIN_SAVING``): ome never raises memory by its own choice, nor rewrites the graph
    for nothing. ``assumed_batch``: the rows an unknown batch dimension was sized as, named
    in the warning (a small stand-in can hide the saving)."""
    if plan.changes_nothing():
        return plan
    plain = planner.with_predictions(view, select.keep_all(view), model, static_bytes)
    if plan.estimates["device_peak"] <= (1.0 - min_saving) * plain.estimates["device_peak"]:
        return plan
    unknown = assumed_batch is not None and any(
        None in (t.shape or ()) for t in view.tensors.values())
    log.warning("checkpoints=%r: the predicted peak (%s) is not %.1f%% below plain "
                "backprop's (%s) on this graph, so ome builds plain tf.gradients%s", plan.policy,
                sizes.format_bytes(plan.estimates["device_peak"]), 100 * min_saving,
                sizes.format_bytes(plain.estimates["device_peak"]),
                f" (its batch dimension is unknown and was sized as {assumed_batch} rows: pass "
                "batch_size=, one replica's batch, to plan at its real size)" if unknown else "")
    return dataclasses.replace(plain, policy=f"{plan.policy} (no saving: plain)")


def _build_and_capture(ys, xs, grad_ys, scope, batch_size, tf_options):
    """``tf.gradients`` built under ``scope`` in ``ys``' graph, and its capture."""
    grads, created = rewrite.build_backward(ys, xs, grad_ys, scope=scope, **tf_options)
    seeds = rewrite.gradient_seeds(ys[0].graph, grad_ys, scope)
    return grads, capture_mod.capture(ys, xs, seeds, created, grads, batch_size=batch_size),\
        len(created)


def _scratch_view(ys, xs, grad_ys, scope, batch_size, tf_options):
    """Capture of ``tf.gradients`` built on a copy of the graph (the original untouched)."""
    graph = ys[0].graph
    scratch = tf.Graph()
    with scratch.as_default():
        if any(tfprivate.in_v1_control_flow(op) for op in graph.get_operations()):
            # a GraphDef drops TF1 loop and cond contexts, which tf.gradients needs; a
            # MetaGraphDef keeps them
            tf.compat.v1.train.import_meta_graph(
                tf.compat.v1.train.export_meta_graph(graph=graph), clear_devices=False)
        else:
            tf.graph_util.import_graph_def(graph.as_graph_def(), name="")
    # A GraphDef drops what a tf.function knows of its captured variables (their handles'
    # shapes), so reads of them, and all after, would have unknown sizes in the copy.
    for op in graph.get_operations():
        for tensor in op.outputs:
            scratch.get_tensor_by_name(tensor.name).set_shape(tensor.shape)
    tfprivate.copy_gradient_caches(graph, scratch)

    def local(t):
        return None if t is None else scratch.get_tensor_by_name(t.name)

    if tf_options.get("stop_gradients"):
        tf_options = {**tf_options,
                      "stop_gradients": [local(t) for t in tf_options["stop_gradients"]]}
    with tfprivate.functions_released(scratch):
        _, view, _ = _build_and_capture([local(t) for t in ys], [local(t) for t in xs],
                                        [local(g) for g in grad_ys], scope, batch_size,
                                        tf_options)
    return scratch, view


@tf.autograph.experimental.do_not_convert
def capture_view(ys, xs, grad_ys=None, *, batch_size=None):
    """The :class:`ome.core.graphview.GraphView` of ``tf.gradients(ys, xs, grad_ys)``, captured
    from a copy of the graph (the graph itself is never touched): what every policy reads."""
    ys, xs, grad_ys = _validate_inputs(ys, xs, grad_ys)
    _refuse_preview(ys, "ome.capture_view")
    scope = ys[0].graph.unique_name("gradients", False)
    return _scratch_view(ys, xs, grad_ys, scope, batch_size, {})[1]


def _uncopyable(forward):
    """Why ``tf.gradients`` of the ``forward`` ops cannot be built on a copy of their graph
    ("" when it can): a gradient function of the graph's own builds its ops from the
    tensors it closed over, which are the original graph's, not the copy's; nested
    functional control flow registers the inner gradient functions where the copy cannot
    let go of them (:func:`ome.tf.tfprivate.functions_released`), and the graph's own build
    would then find them registered."""
    own = [op.name for op in forward if capture_mod.has_own_gradient(op)]
    if own:
        return (f"a gradient function of its own ({own[0]}: tf.custom_gradient or "
                "gradient_override_map)")
    if capture_mod.nests_functions(forward):
        return ("nested functional control flow (a tf.cond or loop inside another, or a "
                "function call inside one)")
    return ""


def _refuse_preview(ys, what, advice=""):
    """Raise :class:`UnsupportedGraphError` if ``what`` (a preview on a copy of the graph)
    cannot be made for ``ys``; ``advice``: what to do instead."""
    reason = _uncopyable(capture_mod.upstream_ops(ys))
    if reason:
        raise errors.UnsupportedGraphError(
            f"{what} cannot preview a graph with {reason} in its forward pass: it works on "
            f"a copy of the graph, where that cannot be built{advice}")


def _tf_options(gate_gradients, aggregation_method, stop_gradients, unconnected_gradients,
                colocate_gradients_with_ops):
    mode = getattr(unconnected_gradients, "value", unconnected_gradients)
    if mode not in _UNCONNECTED:
        raise errors.InvalidArgumentError(
            f"unconnected_gradients must be 'none' or 'zero', got {unconnected_gradients!r}")
    options = {"gate_gradients": gate_gradients, "aggregation_method": aggregation_method,
               "unconnected_gradients": mode}
    if stop_gradients is not None:
        options["stop_gradients"] = [_graph_tensor(t, "stop_gradients entry")
                                     for t in _as_list(stop_gradients)]
    if colocate_gradients_with_ops is not None:
        options["colocate_gradients_with_ops"] = colocate_gradients_with_ops
    return options


@tf.autograph.experimental.do_not_convert  # plain Python graph code, also in tf.function
def plan(ys, xs, grad_ys=None, *, name="gradients", checkpoints="auto", pin=None,
         batch_size=None, swap=False, host_device=None, memory_budget=None, swap_ahead=1,
         cost_model=None, hold_gradients=True, wait_for_leaves=None):
    """The :class:`Plan` ``ome.gradients`` would follow, computed on a copy of the graph
    (the graph itself is never touched): :func:`apply_plan` with the same ``name`` builds
    it."""
    ys, xs, grad_ys = _validate_inputs(ys, xs, grad_ys)
    options = _Options(checkpoints, pin, swap, host_device, memory_budget, batch_size,
                       swap_ahead, cost_model, hold_gradients, wait_for_leaves)
    _refuse_preview(ys, "ome.plan", "; use ome.gradients(..., return_info=True), which "
                    "returns the plan it built")
    scope = ys[0].graph.unique_name(name, False)
    options.model = options.model.in_scope(scope)
    scratch, view = _scratch_view(ys, xs, grad_ys, scope, options.sizing_batch,
                                  {"gate_gradients": False})
    with scratch.as_default():  # what stays allocated is the step's graph's to tell
        return make_policy_plan(view, options, ys[0].graph)


@tf.autograph.experimental.do_not_convert
def gradients(ys, xs, grad_ys=None, name="gradients", gate_gradients=False,
              aggregation_method=None, stop_gradients=None, unconnected_gradients="none", *,
              checkpoints="auto", pin=None, batch_size=None, swap=False, host_device=None,
              memory_budget=None, swap_ahead=1, cost_model=None, hold_gradients=True,
              wait_for_leaves=None, colocate_gradients_with_ops=None, return_info=False):
    """Gradients of ``ys`` w.r.t. ``xs``, equal to ``tf.gradients``, in less memory.

    Parameters
    ----------
    ys, xs, grad_ys, name, gate_gradients, aggregation_method, stop_gradients,
    unconnected_gradients : as in ``tf.gradients`` (graph mode or inside ``tf.function``);
        they are passed to ``tf.gradients`` itself, which builds the backward ops. Variables
        (resource, reference, Keras 3) are accepted in ``xs``.
    checkpoints : "auto" (default: cuts of the graph, works without bottlenecks), "optimal"
        (the smallest peak the MILP planner finds, then the least added time at it), "memory"
        (OpenAI's bottleneck heuristic), "speed" (keep conv/matmul outputs, recompute the
        cheap ops after them), "collection" (the graph collection "checkpoints"), "none"
        (keep everything), "selective" / "full" (Transformers: recompute the attention
        core / each block, docs/TRANSFORMER.md), a list of tensors to keep, or a policy: a
        function ``(GraphView) -> Plan`` (the baselines are such functions). With
        ``cost_model``, "auto" and "speed" take the optimal planner's lowest plan instead
        where it predicts no higher peak and no more added time, one of them less
        (``planner.lowest_at_no_more_time``).
    pin : ``{tensor: "keep" | "recompute" | "swap"}``: decisions every policy honours.
    batch_size : the batch, which every dimension shape inference leaves unknown is read
        as. Needed only with ``memory_budget``; otherwise unknown dimensions are planned as
        :data:`ASSUMED_BATCH` (a plan weighs tensors against each other).
    swap : False, "auto" (with ``cost_model``: the optimal planner keeps, recomputes or
        swaps each tensor for a lower peak than ``checkpoints``' plan at no more added
        time, where one exists; without it nothing is swapped), or a list of forward
        tensors to move to the host.
    host_device : where swapped tensors go; default "/device:CPU:0" with a GPU, else the
        emulated host "/device:CPU:1" (see ``ome.host.emulate_host``).
    memory_budget : bytes or a string like "2GiB": keep / recompute / swap chosen by the
        optimal planner for the least added time with the predicted device peak, variables
        included, within it (ignores ``checkpoints``).
    swap_ahead : backward steps a swap-in starts before its first reader.
    cost_model : an :class:`ome.CostModel` measured by :func:`ome.profile` on a step built
        the same way: planning then uses measured op times, kernel scratch memory and the
        memory resident between steps (default: static estimates).
    hold_gradients : when the plan recomputes or swaps, each variable's gradient is
        returned through an identity that waits for the backward ops (and copies) reading
        the variable's value, so an optimizer update never finds a read still to come and
        never has to copy the variable first; the backward pass then takes each weight's
        gradient before the ops ready beside it, which frees the forward tensor it reads
        sooner, and the planners plan for that order (default True; the values are the
        same).
    wait_for_leaves : each recompute group also waits for the backward leaves (weight and
        bias gradients) the plan runs before it, so an executor whose threads are busy
        cannot put them off and keep the gradients they read alive. Default (None): on
        when a ``tf.distribute`` strategy runs the step on more than one replica (there
        ``fit`` saved nothing without it), off otherwise (on one device it measured no
        better and sometimes worse). Set it for TF1 towers built by hand.
    return_info : also return ``(plan, RewriteInfo)``.

    Example
    -------
    >>> grads = ome.gradients(loss, tf.compat.v1.trainable_variables())  # doctest: +SKIP
    """
    tf_args = (gate_gradients, aggregation_method, stop_gradients, unconnected_gradients,
               colocate_gradients_with_ops)
    options = dict(checkpoints=checkpoints, pin=pin, swap=swap, host_device=host_device,
                   memory_budget=memory_budget, batch_size=batch_size, swap_ahead=swap_ahead,
                   cost_model=cost_model, hold_gradients=hold_gradients,
                   wait_for_leaves=wait_for_leaves)
    ys, xs, grad_ys = _validate_inputs(ys, xs, grad_ys)
    grads, built = measured_calls.record(
        ys[0].graph, functools.partial(_gradients, ys, xs, grad_ys, name, tf_args), options)
    return (grads, built) if return_info else grads


def _gradients(ys, xs, grad_ys, name, tf_args, options):
    """The body of :func:`gradients`: ``(grads, (Plan, RewriteInfo))``."""
    start = time.perf_counter()
    tf_options = _tf_options(*tf_args)
    graph = ys[0].graph
    if options["swap"] is not None and options["swap"] is not False or \
            _pins_swap(options["pin"]) or options["host_device"] is not None:
        _refuse_swaps_under_xla(graph)  # before the host device is looked for
    options = _Options(**options)
    scope = graph.unique_name(name or "gradients", False)
    options.model = options.model.in_scope(scope)
    forward = capture_mod.upstream_ops(ys)
    _check_budget_sizes(options, forward)
    _log_assumed_batch(options, forward)
    planned = None
    if options.can_fail(forward) and not hasattr(graph, "captures") \
            and not _uncopyable(forward):
        scratch, planned_on = _scratch_view(ys, xs, grad_ys, scope, options.sizing_batch,
                                            tf_options)
        with scratch.as_default():
            planned = make_policy_plan(planned_on, options, scratch)  # raises here, on the copy
    graph.unique_name(name or "gradients")  # claim the scope
    grads, view, backward_ops = _build_and_capture(ys, xs, grad_ys, scope,
                                                   options.sizing_batch, tf_options)
    # The copy's plan is the plan when the copy's backward is this one, op for op (the
    # module's docstring says when it is not).
    if planned is not None and planned_on.same_steps(view):
        chosen = planned
    else:
        chosen = make_policy_plan(view, options, graph)
    info = _apply(chosen, view, graph, scope)
    info.backward_ops = backward_ops
    info.view, info.scope, info.xla = view, scope, xla.compiled(graph)
    info.graph_ops = frozenset(op.name for op in graph.get_operations())
    grads = _returned(grads, info.held)
    _log(chosen, info, time.perf_counter() - start)
    return grads, (chosen, info)


def _apply(chosen, view, graph, scope):
    if chosen.changes_nothing():
        return rewrite.RewriteInfo()
    if chosen.swapped:
        _refuse_swaps_under_xla(graph)
    emulated = bool(chosen.swapped) and host.is_emulated(chosen.host_device)
    return rewrite.apply(chosen, view, graph, emulated=emulated, scope=scope + "/ome",
                         xla=xla.compiled(graph))


def _refuse_swaps_under_xla(graph):
    """Swaps need ops XLA does not compile (the emulated host's ``numpy_function``) or a
    placement on the host that XLA's one-device cluster ignores: refused there."""
    if xla.compiled(graph):
        raise errors.UnsupportedGraphError(
            "swapping to the host is not available under XLA (jit_compile=True): XLA "
            "compiles the step for one device, so a copy placed on the host stays on the "
            "device (and the emulated host's copy cannot be compiled); recompute only "
            "(leave out swap= and pins to 'swap'), or compile without jit_compile")


def ordered_backprop(ys, xs, *, name="gradients"):
    """``tf.gradients(ys, xs)`` with its backward ops run in the order a rewrite enforces,
    nothing recomputed or swapped: a step built with it in place of ``tf.gradients`` is
    what :func:`ome.profile_order` times against the plain step to measure what the order
    itself costs. Its gradients are held and its sibling ops paired as ome's own plans'
    are by default."""
    ys, xs, grad_ys = _validate_inputs(ys, xs, None)
    graph = ys[0].graph
    scope = graph.unique_name(name)
    grads, view, _ = _build_and_capture(ys, xs, grad_ys, scope, None, {})
    held = plans.with_gradient_holds(view, select.keep_all(view), rewritten=True)
    info = rewrite.apply(plans.with_side_by_side(view, held), view, graph,
                         scope=scope + "/ome")
    return _returned(grads, info.held)


@tf.autograph.experimental.do_not_convert
def apply_plan(saved, ys, xs, grad_ys=None, *, name="gradients"):
    """Gradients of ``ys`` w.r.t. ``xs`` built from a saved :class:`Plan` (e.g.
    ``Plan.from_json``), exactly as saved: a plan carries its whole schedule (copies, swaps,
    holds, waits, pairs) and the fingerprint of the step it was made for, and this step,
    built under ``name``, must have the same one. A plan made for another graph raises a
    clear error (the graph unchanged)."""
    if not isinstance(saved, Plan):
        raise errors.InvalidTypeError(f"plan must be an ome.Plan, got {type(saved).__name__}")
    if not saved.step:
        raise errors.InvalidArgumentError(
            "the plan carries no step fingerprint (it was not made by ome's make_plan): "
            "plan the step again")
    ys, xs, grad_ys = _validate_inputs(ys, xs, grad_ys)
    graph = ys[0].graph
    for t in saved.tensors:
        try:
            graph.get_tensor_by_name(t.tensor)
        except (KeyError, ValueError):
            raise errors.InvalidArgumentError(
                f"the plan names tensor {t.tensor!r}, which this graph does not have: it was "
                "made for another graph") from None
    if saved.host_device:
        host.validate_host_device(saved.host_device)
    scope = graph.unique_name(name, False)
    forward = capture_mod.upstream_ops(ys)
    if not hasattr(graph, "captures") and not _uncopyable(forward):
        # checked on a copy first, so a plan for another step leaves the graph unchanged
        _, preview = _scratch_view(ys, xs, grad_ys, scope, None, {})
        if preview.step_fingerprint() != saved.step:
            _refuse_other_step(name)
    graph.unique_name(name)
    grads, view, _ = _build_and_capture(ys, xs, grad_ys, scope, None, {})
    if view.step_fingerprint() != saved.step:
        _refuse_other_step(name)
    return _returned(grads, _apply(saved.in_scope(view.backward_scope()), view, graph,
                                   scope).held)


def _refuse_other_step(name):
    raise errors.InvalidArgumentError(
        f"the plan was made for another step: tf.gradients here (under name={name!r}) "
        "builds other ops than the step the plan was made for (another graph, other ys, "
        "xs or grad_ys)")


def _returned(grads, held):
    """``grads`` with each held gradient replaced by its held identity."""
    out = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices) and g.values.name in held:
            g = tf.IndexedSlices(held[g.values.name], g.indices, g.dense_shape)
        elif isinstance(g, tf.Tensor) and g.name in held:
            g = held[g.name]
        out.append(g)
    return out


def _log(chosen, info, seconds):
    # The thesis's log line, followed by what it counts.
    log.info("total checkpoints disconnected count : %d (checkpoint tensors kept or swapped)",
             len(chosen.checkpoints))
    if chosen.swapped:
        log.info("%d tensors swap out to %s; %d checkpoints but not swap out",
                 len(chosen.swapped), chosen.host_device,
                 len(set(chosen.checkpoints) - set(chosen.swapped)))
    if chosen.changes_nothing() and chosen.policy not in ("none", "budget:none"):
        log.warning("checkpoints=%r changes nothing in this graph (no saved tensor can be "
                    "recomputed or swapped): this is plain tf.gradients", chosen.policy)
    log.info("ome.gradients: %s; %d ops copied in %d groups, %d reads re-pointed, %d ops "
             "made to wait for the planned order, %d ops added to tf.gradients' %d, %.3f s",
             chosen.policy, info.copied_ops, info.groups, info.rerouted, info.ordered,
             info.added_ops, info.backward_ops, seconds)
