"""GPipe: pipeline-parallel training with micro-batches, in TensorFlow graph mode.

A model given as a sequence of layers (one-tensor functions ``x -> y``) is cut into K
contiguous *stages*, one per device (GPUs when present, else logical CPU devices
``/device:CPU:i``). Each mini-batch is split into M *micro-batches*. The schedule is
GPipe's (Huang et al., 2019):

- forward: each device runs its stage on micro-batch 0, 1, ..., M-1, one at a time; the
  output goes to the next device, so stage k works on micro-batch m while stage k+1 works
  on micro-batch m-1;
- flush: backprop starts only when every micro-batch has reached the loss;
- backward: each device runs its stage's backward on micro-batch M-1, ..., 0, one at a
  time, and sends the gradient of the stage input to the previous device;
- the gradients of each variable are accumulated over the micro-batches (a running sum,
  so one partial gradient at a time is alive) and applied in one optimizer update.

The loss is the mean over micro-batches of each micro-batch's mean loss, so for models
without batch statistics the accumulated gradient equals the full-batch gradient. Batch
normalisation sees per-micro-batch statistics (as in GPipe) and updates its moving
averages once per micro-batch.

The backward of every (stage, micro-batch) is one gradient call, from the stage output to
the stage input and the variable reads of that stage. With checkpointing off it keeps
every activation (plain ``tf.gradients``, what ``ome.gradients(checkpoints="none")``
builds); with checkpointing on, ome's capture, plan and rewrite keep only the stage input
and recompute every other tensor the backward reads, when the stage's backward reaches it
(what ``ome.gradients(checkpoints=[])`` builds). The plans and rewrite infos are kept on
the :class:`PipelineStep`, so callers can check what was recomputed.

Variables live on the device of the stage that creates them (``tf.device`` around the
stage); a variable read by a later stage too (a tied embedding) gets gradient
contributions from both, summed on its own device. Layers must read their variables with
dense reads (``ReadVariableOp``, what ``tf.matmul(x, var)`` or ``var.value()`` make).

Between two logical CPU devices a tensor would keep its buffer, so the stage input is a
real copy (``DeepCopy``) on the receiving device, as a transfer between GPUs would be.
"""
import dataclasses
import logging
import math
from typing import Any, Callable, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf

from ome.policies import select
from ome.tf import capture, rewrite
from ome.errors import DeviceError, InvalidArgumentError, InvalidTypeError, \
    UnsupportedGraphError
from ome.tf.host import canonical_device, logical_cpu_count
from ome.tf.measure import measure

logger = logging.getLogger(__name__)

__all__ = [
    "BALANCE_BY",
    "DeviceUsage",
    "Layer",
    "LayerEstimate",
    "Partition",
    "PipelineMeasurement",
    "PipelineStep",
    "balanced_sizes",
    "build_pipeline",
    "default_devices",
    "estimate_layers",
    "make_partition",
    "measure_pipeline",
    "classification_loss",
]

#: What automatic partitioning balances: estimated forward FLOPs, estimated memory
#: (activations per micro-batch plus 12 bytes per parameter), or parameters.
BALANCE_BY = ("cost", "memory", "parameters")
#: Bytes per parameter counted as parameter memory: weights, gradient and one optimizer
#: slot (momentum), the published log's convention (12 B x 89,762,304 = 1.00 GiB).
PARAMETER_BYTES = 12
_MiB = float(1 << 20)


# ---------------------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------------------


def default_devices(count):
    """``count`` devices for ``count`` stages: ``/device:GPU:0..`` when GPUs are visible,
    else the logical CPUs ``/device:CPU:0..`` (see :func:`ome.host.emulate_host`)."""
    count = _positive_int("stages", count)
    gpus = tf.config.get_visible_devices("GPU")
    kind, available = ("GPU", len(gpus)) if gpus else ("CPU", logical_cpu_count())
    if count > available:
        fix = ("" if gpus else f" Call ome.host.emulate_host(devices={count}) at the start "
               "of the program, before TensorFlow initialises its runtime.")
        raise DeviceError(
            f"{count} stages need {count} devices but only {available} {kind} device(s) "
            f"exist.{fix}")
    return tuple(f"/device:{kind}:{i}" for i in range(count))


def _check_devices(devices):
    """Canonical, distinct, existing device names."""
    if isinstance(devices, str) or not isinstance(devices, (list, tuple)):
        raise InvalidTypeError(
            f"devices must be a list of device names, got {type(devices).__name__}")
    names = tuple(canonical_device(d, argument="devices entry") for d in devices)
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"devices must be distinct, got {list(devices)}")
    existing = {d.name for d in tf.config.list_logical_devices()}
    for given, name in zip(devices, names):
        if name not in existing:
            raise DeviceError(
                f"device {given!r} does not exist; the logical devices are "
                f"{', '.join(sorted(existing))}. For more CPU devices call "
                "ome.host.emulate_host(devices=K) at the start of the program.")
    return names


def _resolve_devices(stages, devices):
    if devices is None:
        return default_devices(1 if stages is None else stages)
    names = _check_devices(devices)
    if stages is not None and _positive_int("stages", stages) != len(names):
        raise InvalidArgumentError(
            f"stages={stages} but {len(names)} devices were given; give one device per stage")
    return names


def _is_cpu(device):
    return device.split(":")[-2] == "CPU"


# ---------------------------------------------------------------------------------------
# Layers and their estimates
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer of a sequential model: ``fn(x) -> y`` on one tensor.

    ``fn`` creates its variables with ``tf.compat.v1.get_variable`` (resource variables);
    it is called once per micro-batch, the later calls under ``reuse=True``. ``scope`` is
    the variable scope the call runs in (None: the caller's scope; ``fn`` then names its
    variables uniquely itself). ``name`` is what partitions print.
    """

    fn: Callable[[Any], Any]
    name: str = ""
    scope: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class LayerEstimate:
    """What one layer costs per micro-batch, from a dry build on a scratch graph.

    ``parameters``: elements of the trainable variables it creates; ``flops``: forward
    FLOPs (:func:`ome.tf.capture.estimate_cost` summed over its ops); ``activation_bytes``:
    bytes of the floating-point tensors its forward computes (what plain backprop may
    keep); ``output_shape``: its output's static shape.
    """

    name: str
    parameters: int
    flops: float
    activation_bytes: int
    output_shape: Tuple[Optional[int], ...]

    def weight(self, balance_by):
        """This layer's weight for :func:`balanced_sizes` under ``balance_by``."""
        if balance_by == "cost":
            return self.flops
        if balance_by == "memory":
            return self.activation_bytes + PARAMETER_BYTES * self.parameters
        return float(self.parameters)


def _as_layers(layers):
    """``layers`` as a tuple of :class:`Layer`; a bare callable ``i`` runs in scope ``layer{i}``."""
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise InvalidTypeError(
            f"layers must be a sequence of Layer or callables, got {type(layers).__name__}")
    found = []
    for i, layer in enumerate(layers):
        if isinstance(layer, Layer):
            if not callable(layer.fn):
                raise InvalidTypeError(f"layers[{i}].fn is not callable")
            found.append(layer if layer.name else dataclasses.replace(layer, name=f"layer{i}"))
        elif callable(layer):
            found.append(Layer(layer, name=f"layer{i}", scope=f"layer{i}"))
        else:
            raise InvalidTypeError(
                f"layers[{i}] must be a Layer or a callable x -> y, got {type(layer).__name__}")
    if not found:
        raise InvalidArgumentError("layers is empty: give at least one layer")
    return tuple(found)


def _call_layer(layer, x, *, reuse, index):
    """``layer.fn(x)`` in its variable scope; ``reuse`` for every call after the first."""
    scope = layer.scope if layer.scope is not None else tf.compat.v1.get_variable_scope()
    with tf.compat.v1.variable_scope(scope, reuse=True if reuse else None):
        try:
            y = layer.fn(x)
        except (ValueError, TypeError) as err:
            raise InvalidArgumentError(
                f"layer {index} ({layer.name}) fails on its input of shape {x.shape} "
                f"(dtype {x.dtype.name}): {err}") from err
    if not isinstance(y, tf.Tensor):
        raise InvalidTypeError(
            f"layer {index} ({layer.name}) must return one tf.Tensor, got {type(y).__name__}")
    return y


def _placeholder_like(tensor, batch):
    return tf.compat.v1.placeholder(tensor.dtype, [batch] + tensor.shape.as_list()[1:])


def estimate_layers(layers, inputs, targets=None, loss=None, *, micro_batch):
    """Per-layer :class:`LayerEstimate` from a dry build on a scratch graph.

    The layers are built in order on placeholders shaped like ``inputs`` (and ``targets``)
    with batch ``micro_batch``, so a layer that does not accept the previous one's output
    fails here, before anything is added to the caller's graph. The loss's cost, when
    ``loss`` is given, counts in the last layer.

    Raises
    ------
    InvalidArgumentError
        A layer fails on its input (the message names the layer and the shape it got).
    """
    layers = _as_layers(layers)
    if loss is not None and targets is None:
        raise InvalidArgumentError("estimate_layers: give targets with loss")
    estimates = []
    with tf.Graph().as_default() as scratch:
        x = _placeholder_like(inputs, micro_batch)
        for index, layer in enumerate(layers):
            before = len(scratch.get_operations())
            n_vars = len(tf.compat.v1.trainable_variables())
            x = _call_layer(layer, x, reuse=False, index=index)
            if index == len(layers) - 1 and loss is not None:
                _check_scalar(loss(x, _placeholder_like(targets, micro_batch)))
            created = scratch.get_operations()[before:]
            new_vars = tf.compat.v1.trainable_variables()[n_vars:]
            estimates.append(LayerEstimate(
                name=layer.name,
                parameters=sum(_elements(v) for v in new_vars),
                flops=sum(capture.estimate_cost(op) for op in created),
                activation_bytes=sum(_float_bytes(t) for op in created for t in op.outputs),
                output_shape=tuple(x.shape.as_list())))
    return tuple(estimates)


def _float_bytes(tensor):
    if not tensor.dtype.is_floating or not tensor.shape.is_fully_defined():
        return 0
    return tensor.shape.num_elements() * tensor.dtype.size


def _check_scalar(loss_value):
    if not isinstance(loss_value, tf.Tensor) or loss_value.shape.rank != 0 \
            or not loss_value.dtype.is_floating:
        raise InvalidArgumentError(
            f"loss(outputs, targets) must return a floating-point scalar tensor (the mean "
            f"loss of the micro-batch), got {loss_value!r}")
    return loss_value


# ---------------------------------------------------------------------------------------
# Partition
# ---------------------------------------------------------------------------------------


def balanced_sizes(weights, parts):
    """Contiguous split of ``weights`` into ``parts`` non-empty runs minimising the largest
    run's sum; returns the run lengths. Ties go to the split with earlier runs longer.

    >>> balanced_sizes([1, 1, 1, 1, 4], 2)
    (4, 1)
    """
    weights = [float(w) for w in weights]
    n = len(weights)
    if not 1 <= parts <= n:
        raise InvalidArgumentError(f"cannot split {n} layers into {parts} non-empty stages")
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    # best[p][i]: smallest possible largest sum splitting the first i weights into p runs.
    best = np.full((parts + 1, n + 1), math.inf)
    cut = np.zeros((parts + 1, n + 1), dtype=int)
    best[0][0] = 0.0
    for p in range(1, parts + 1):
        for i in range(p, n - (parts - p) + 1):
            for j in range(p - 1, i):
                value = max(best[p - 1][j], prefix[i] - prefix[j])
                if value <= best[p][i]:  # "<=": the latest cut wins, earlier runs longer
                    best[p][i], cut[p][i] = value, j
    sizes, i = [], n
    for p in range(parts, 0, -1):
        sizes.append(i - cut[p][i])
        i = cut[p][i]
    return tuple(int(s) for s in reversed(sizes))


@dataclasses.dataclass(frozen=True)
class Partition:
    """Which layers run on which device: ``sizes[k]`` consecutive layers on ``devices[k]``."""

    sizes: Tuple[int, ...]
    devices: Tuple[str, ...]
    estimates: Tuple[LayerEstimate, ...]
    balance_by: str  # one of BALANCE_BY, or "manual"

    def bounds(self):
        """``[(start, stop), ...]``: the layer index range of each stage."""
        stops = np.cumsum(self.sizes).tolist()
        return list(zip([0] + stops[:-1], stops))

    def stage_total(self, field):
        """Per stage, the sum of ``field`` over its layers' estimates."""
        return [sum(getattr(e, field) for e in self.estimates[a:b]) for a, b in self.bounds()]

    def describe(self):
        """The balance, one line per stage: layers, parameters, estimated compute share and
        activation bytes per micro-batch."""
        flops = self.stage_total("flops")
        total = sum(flops) or 1.0
        params = self.stage_total("parameters")
        acts = self.stage_total("activation_bytes")
        how = "by hand" if self.balance_by == "manual" else f"balanced by {self.balance_by}"
        lines = [f"partition of {len(self.estimates)} layers over {len(self.sizes)} "
                 f"device(s), {how}:"]
        for k, (a, b) in enumerate(self.bounds()):
            names = self.estimates[a].name if b - a == 1 else \
                f"{self.estimates[a].name} .. {self.estimates[b - 1].name}"
            lines.append(
                f"  stage {k} on {self.devices[k]}: layers {a}-{b - 1} ({names}), "
                f"{params[k] / 1e6:.2f}M parameters, {100 * flops[k] / total:.1f}% of the "
                f"estimated compute, {acts[k] / _MiB:.1f} MiB of activations per micro-batch")
        return "\n".join(lines)

    def __str__(self):
        return self.describe()


def make_partition(estimates, devices, *, sizes=None, balance_by="cost"):
    """A :class:`Partition` of layers with ``estimates`` over ``devices``: the given
    ``sizes`` (layers per stage, in order), or balanced by ``balance_by``."""
    devices = tuple(devices)
    n, parts = len(estimates), len(devices)
    if parts > n:
        raise InvalidArgumentError(
            f"{parts} stages for {n} layers: every stage needs at least one layer; use at "
            f"most {n} devices or split the model into more layers")
    if sizes is not None:
        sizes = tuple(sizes)
        if len(sizes) != parts or any(isinstance(s, bool) or not isinstance(s, (int, np.integer))
                                      or s < 1 for s in sizes) or sum(sizes) != n:
            raise InvalidArgumentError(
                f"partition={list(sizes)} must give {parts} positive layer counts (one per "
                f"stage) summing to the {n} layers")
        return Partition(tuple(int(s) for s in sizes), devices, tuple(estimates), "manual")
    if balance_by not in BALANCE_BY:
        raise InvalidArgumentError(f"balance_by must be one of {BALANCE_BY}, got {balance_by!r}")
    weights = [e.weight(balance_by) for e in estimates]
    return Partition(balanced_sizes(weights, parts), devices, tuple(estimates), balance_by)


# ---------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PipelineStep:
    """What :func:`build_pipeline` built.

    Attributes
    ----------
    loss : tf.Tensor
        The mini-batch's mean loss (mean of the micro-batches' mean losses).
    grads, variables : tuple
        The accumulated gradient of each trainable variable, in creation order.
    train_op : tf.Operation or None
        One optimizer update with the accumulated gradients (None without an optimizer).
    optimizer : the optimizer given, or None.
    partition : Partition
    micro_batches, batch_size : int
    checkpoint : tuple of bool, one per stage.
    rewrites : dict
        ``{(stage, micro_batch): (ome.Plan, RewriteInfo)}`` of every backward built.
    stage_variables : tuple of tuples
        The variables each stage created (and whose memory its device holds).
    """

    loss: Any
    grads: Tuple[Any, ...]
    variables: Tuple[Any, ...]
    train_op: Any
    optimizer: Any
    partition: Partition
    micro_batches: int
    batch_size: int
    checkpoint: Tuple[bool, ...]
    rewrites: Mapping[Tuple[int, int], Tuple[Any, Any]]
    stage_variables: Tuple[Tuple[Any, ...], ...]

    @property
    def devices(self):
        """The stages' devices, in order."""
        return self.partition.devices

    def copied_ops(self, stage=None):
        """Forward ops ome copied to recompute them (for one stage, or all)."""
        return sum(info.copied_ops for (k, _), (_, info) in self.rewrites.items()
                   if stage is None or k == stage)


@dataclasses.dataclass
class _StageCall:
    """One stage run on one micro-batch: its input, output, and the reads of trainable
    variables its output depends on (``{read tensor: variable}``)."""

    input: Any
    output: Any
    reads: dict


def build_pipeline(layers, loss, inputs, targets, *, micro_batches=1, stages=None,
                   devices=None, partition=None, balance_by="cost", checkpoint=False,
                   optimizer=None):
    """Build one GPipe training step in the current default graph.

    Parameters
    ----------
    layers : sequence of Layer or callables ``x -> y``
        The model, in order (see :class:`Layer`).
    loss : callable ``(outputs, targets) -> scalar``
        The mean loss of one micro-batch, built on the last device.
    inputs, targets : tf.Tensor
        The mini-batch (static batch dimension, split along axis 0).
    micro_batches : int
        M; must divide the batch.
    stages, devices
        K, and/or the K device names (default :func:`default_devices`).
    partition : sequence of int, optional
        Layers per stage, by hand (like torchgpipe's ``balance``); default: balanced.
    balance_by : one of :data:`BALANCE_BY`
        What automatic partitioning balances; the balance is logged at INFO.
    checkpoint : bool or sequence of bool (one per stage)
        Keep only each stage's input per micro-batch and recompute the stage in backprop.
    optimizer : tf.compat.v1.train.Optimizer, optional
        Builds ``train_op`` from the accumulated gradients.

    Returns
    -------
    PipelineStep

    Raises
    ------
    InvalidArgumentError, InvalidTypeError, DeviceError
        Bad arguments (M not dividing the batch, more stages than layers, an unknown
        device, a layer that rejects its input...), before anything is added to the graph.
    """
    layers = _as_layers(layers)
    if not callable(loss):
        raise InvalidTypeError(f"loss must be a callable (outputs, targets) -> scalar, "
                               f"got {type(loss).__name__}")
    batch = _check_batch(inputs, targets)
    micro_batches = _positive_int("micro_batches", micro_batches)
    if batch % micro_batches:
        raise InvalidArgumentError(
            f"micro_batches={micro_batches} does not divide the batch of {batch}; choose a "
            f"divisor of {batch}")
    devices = _resolve_devices(stages, devices)
    if len(devices) > len(layers):
        raise InvalidArgumentError(
            f"{len(devices)} stages for {len(layers)} layers: every stage needs at least "
            f"one layer")
    checkpoints = _per_stage_flags(checkpoint, len(devices))
    if optimizer is not None and not callable(getattr(optimizer, "apply_gradients", None)):
        raise InvalidTypeError(f"optimizer must be a tf.compat.v1.train.Optimizer, got "
                               f"{type(optimizer).__name__}")
    estimates = estimate_layers(layers, inputs, targets, loss,
                                micro_batch=batch // micro_batches)
    part = make_partition(estimates, devices, sizes=partition, balance_by=balance_by)
    logger.info("%s", part.describe())

    graph = inputs.graph
    n_trainable = len(graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES))
    n_updates = len(graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))
    with graph.as_default():
        calls, losses, stage_vars = _forward(layers, loss, part, inputs, targets,
                                             micro_batches)
        variables = tuple(
            graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)[n_trainable:])
        with tf.device(devices[-1]), tf.name_scope("pipeline_loss"):
            mean_loss = tf.math.divide(tf.add_n(losses), float(micro_batches), name="mean")
        grads, rewrites = _backward(calls, losses, variables, devices, checkpoints,
                                    micro_batches)
        train_op = None
        if optimizer is not None:
            updates = graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)[n_updates:]
            with tf.control_dependencies(updates):
                train_op = optimizer.apply_gradients(zip(grads, variables),
                                                     name="pipeline_train_op")
    return PipelineStep(
        loss=mean_loss, grads=tuple(grads), variables=variables, train_op=train_op,
        optimizer=optimizer, partition=part, micro_batches=micro_batches, batch_size=batch,
        checkpoint=checkpoints, rewrites=rewrites, stage_variables=stage_vars)


def _check_batch(inputs, targets):
    for what, t in (("inputs", inputs), ("targets", targets)):
        if not isinstance(t, tf.Tensor) or not hasattr(t, "graph"):
            raise InvalidTypeError(f"{what} must be a graph tf.Tensor (e.g. a placeholder), "
                                   f"got {type(t).__name__}")
        if t.shape.rank is None or t.shape.rank < 1 or t.shape[0] is None:
            raise InvalidArgumentError(
                f"{what} needs a static batch dimension to split into micro-batches, got "
                f"shape {t.shape}")
    if inputs.graph is not targets.graph:
        raise InvalidArgumentError("inputs and targets belong to different graphs")
    if inputs.shape[0] != targets.shape[0]:
        raise InvalidArgumentError(
            f"inputs and targets have different batch sizes ({inputs.shape[0]} and "
            f"{targets.shape[0]})")
    return int(inputs.shape[0])


def _per_stage_flags(checkpoint, stages):
    if isinstance(checkpoint, (bool, np.bool_)):
        return (bool(checkpoint),) * stages
    flags = tuple(checkpoint) if isinstance(checkpoint, (list, tuple)) else None
    if flags is None or len(flags) != stages or \
            not all(isinstance(f, (bool, np.bool_)) for f in flags):
        raise InvalidArgumentError(
            f"checkpoint must be a bool or {stages} bools (one per stage), got {checkpoint!r}")
    return tuple(bool(f) for f in flags)


def _forward(layers, loss, part, inputs, targets, micro_batches):
    """Every (stage, micro-batch) forward, one micro-batch at a time per device; returns
    ``(calls[k][m], micro-batch losses, variables created per stage)``."""
    graph = inputs.graph
    devices = part.devices
    with tf.device(devices[0]), tf.name_scope("pipeline_split"):
        micro_inputs = _split(inputs, micro_batches)
    with tf.device(devices[-1]), tf.name_scope("pipeline_split"):
        micro_targets = _split(targets, micro_batches)
    calls = [[] for _ in devices]
    stage_vars = []
    losses = []
    for m in range(micro_batches):
        x = micro_inputs[m]
        for k, ((start, stop), device) in enumerate(zip(part.bounds(), devices)):
            previous = [calls[k][-1].output.op] if m else []  # one micro-batch at a time
            with tf.device(device), tf.name_scope(f"pipeline_s{k}_m{m}"):
                x_in = _arrive(x, device, previous, "input")
                n_vars = len(graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES))
                y = x_in
                for index in range(start, stop):
                    y = _call_layer(layers[index], y, reuse=m > 0, index=index)
                if k == len(devices) - 1:
                    losses.append(_check_scalar(loss(y, micro_targets[m])))
                    y = losses[-1]
            trainable = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
            if m == 0:
                stage_vars.append(tuple(trainable[n_vars:]))
            calls[k].append(_StageCall(x_in, y, _variable_reads(x_in, y, trainable)))
            x = y
    return calls, losses, tuple(stage_vars)


def _split(tensor, parts):
    return [tensor] if parts == 1 else tf.split(tensor, parts, axis=0)


def _arrive(tensor, device, after, name):
    """``tensor`` on ``device``, not before the ops ``after`` ran.

    Across logical CPU devices a real copy (``DeepCopy``): an identity would share the
    buffer, so the sender's memory would hold the receiver's input. Elsewhere an identity
    placed on ``device`` makes TensorFlow insert the transfer.
    """
    source = canonical_device(tensor.op.device) if tensor.op.device else device
    with tf.device(device), tf.control_dependencies(after):
        if source != device and _is_cpu(source) and _is_cpu(device):
            return tf.raw_ops.DeepCopy(x=tensor, name=name)
        return tf.identity(tensor, name=name)


def _variable_reads(stage_input, stage_output, variables):
    """``{read tensor: variable}``: the dense reads of ``variables`` that the stage output
    depends on (through the stage's own ops, not its input).

    A stage's gradients are taken with respect to these reads, not the variables, so a
    variable another stage reads too (a tied embedding) gets only this stage's share here.
    """
    handles = {v.handle.name: v for v in variables}
    reads = {}
    for op in capture.upstream_ops([stage_output], stop={stage_input.op}):
        for t in op.inputs:
            variable = handles.get(t.name)
            if variable is None:
                continue
            if op.type != "ReadVariableOp":
                raise UnsupportedGraphError(
                    f"{op.name} ({op.type}) reads variable {variable.name} other than by a "
                    "dense read; pipeline stages need dense reads (e.g. "
                    "tf.gather(var.value(), ids) instead of a sparse lookup)")
            reads[op.outputs[0]] = variable
    return dict(sorted(reads.items(), key=lambda item: item[0].name))


def _backward(calls, losses, variables, devices, checkpoints, micro_batches):
    """Every (stage, micro-batch) backward through ome, last micro-batch first, one at a time
    per device, after the flush; returns (accumulated gradients, rewrites)."""
    sums = [{} for _ in devices]  # per stage: {variable ref: running sum of its gradients}
    rewrites, incoming = {}, {}  # incoming[k]: gradient of stage k's input, for stage k-1
    previous = [[] for _ in devices]  # per stage: what its next backward waits for
    last = len(devices) - 1
    for m in reversed(range(micro_batches)):
        for k in reversed(range(len(devices))):
            call = calls[k][m]
            with tf.device(devices[k]), tf.name_scope(f"pipeline_s{k}_m{m}_backward"):
                if k == last:  # the flush: every micro-batch's forward is done
                    with tf.control_dependencies([l.op for l in losses] + previous[k]):
                        seed = tf.constant(1.0 / micro_batches, dtype=call.output.dtype,
                                           name="seed")
                else:
                    seed = _arrive(incoming[k + 1], devices[k], previous[k], "seed")
                xs = ([call.input] if k > 0 else []) + list(call.reads)
                grads, rewrites[(k, m)] = _stage_gradients(call.output, xs, seed,
                                                           recompute=checkpoints[k])
                grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
                if k > 0:
                    incoming[k] = grads.pop(0)
                added = _accumulate(sums[k], zip(grads, call.reads.values()))
            previous[k] = added + ([incoming[k].op] if k > 0 else [])
    return _total_gradients(sums, variables), rewrites


def _accumulate(sums, grads_and_variables):
    """Add one micro-batch's gradients to ``sums`` (running sums, so that one micro-batch's
    gradients are alive at a time); returns the ops that made the new sums.

    The next micro-batch's backward waits for these ops: that keeps the sums from being
    merged by Grappler into one AddN of every micro-batch's gradients (which would keep
    them all alive until the last one), as it does with a plain chain of adds.
    """
    per_variable = {}
    for g, variable in grads_and_variables:
        if g is not None:  # a variable read twice in one stage gets two gradients
            per_variable.setdefault(variable.ref(), []).append(g)
    added = []
    with tf.name_scope("accumulate"):
        for key, parts in per_variable.items():
            grad = parts[0] if len(parts) == 1 else tf.add_n(parts)
            sums[key] = grad if key not in sums else tf.add(sums[key], grad)
            added.append(sums[key].op)
    return added


def _total_gradients(sums, variables):
    """Each variable's gradient: its stages' sums added on its own device."""
    totals = []
    for v in variables:
        parts = [stage[v.ref()] for stage in sums if v.ref() in stage]
        if not parts:
            raise InvalidArgumentError(
                f"trainable variable {v.name} gets no gradient: the loss must depend on every "
                "variable, and each layer must read its variables inside its own function")
        with tf.device(v.device), tf.name_scope("pipeline_accumulate"):
            totals.append(parts[0] if len(parts) == 1 else tf.add_n(parts))
    return totals


def _stage_gradients(output, xs, seed, *, recompute):
    """``tf.gradients(output, xs, seed)`` and its ``(plan, RewriteInfo)``; with
    ``recompute``, rewritten by ome to keep only the stage input (``xs``) and recompute
    every other tensor the backward reads, when the backward reaches it.

    This is :func:`ome.gradients` with ``checkpoints=[]``, minus its first pass: that plans
    on a copy of the whole graph so that a refused plan leaves the graph untouched, which
    costs O(graph) per call (minutes for M x K calls), and this plan cannot be refused.
    """
    graph = output.graph
    scope = graph.unique_name("gradients")
    grads, created = rewrite.build_backward([output], xs, [seed], scope=scope,
                                            gate_gradients=False)
    if not recompute:
        return grads, (None, rewrite.RewriteInfo(backward_ops=len(created)))
    view = capture.capture([output], xs, rewrite.gradient_seeds(graph, [seed], scope),
                           created, grads)
    plan = select.recompute_plan(view, [], "gpipe", reason="stage input")
    info = rewrite.apply(plan, view, graph, scope=scope + "/ome") \
        if not plan.changes_nothing() else rewrite.RewriteInfo()
    info.backward_ops = len(created)
    return grads, (plan, info)


# ---------------------------------------------------------------------------------------
# Measure
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeviceUsage:
    """One device's memory during one step, in bytes.

    ``parameter_bytes``: weights, gradients and optimizer slots of the variables this device
    holds (12 bytes per parameter with momentum, the published log's convention).
    ``resident_bytes``: what the device holds before the step (weights, slots, other
    variables). ``step_peak_bytes``: most bytes the step allocated on the device at once
    (traced allocation records on logical CPUs; the allocator's peak minus
    ``resident_bytes`` on a GPU).
    """

    device: str
    parameter_bytes: int
    resident_bytes: int
    step_peak_bytes: int

    @property
    def max_bytes(self):
        """The device's maximum memory during the step."""
        return self.resident_bytes + self.step_peak_bytes

    @property
    def activation_bytes(self):
        """``max_bytes - parameter_bytes``: the published log's peak activation memory."""
        return self.max_bytes - self.parameter_bytes


@dataclasses.dataclass(frozen=True)
class PipelineMeasurement:
    """One (K, M, checkpoint) configuration measured: memory per device and times.

    ``forward_time``: median wall time of forward-only steps (fetching the loss);
    ``step_time``: median of full training steps; ``backward_time`` is their difference
    (backward and update). ``allocator_peak``: the process allocator's peak during the
    timed steps (every device together; a cross-check for the per-device figures).
    """

    stages: int
    micro_batches: int
    checkpoint: Tuple[bool, ...]
    batch_size: int
    devices: Tuple[DeviceUsage, ...]
    forward_time: float
    step_time: float
    step_times: Tuple[float, ...]
    forward_times: Tuple[float, ...]
    allocator_peak: int
    copied_ops: int

    @property
    def backward_time(self):
        return max(0.0, self.step_time - self.forward_time)

    @property
    def throughput(self):
        """Samples per second: the batch over the median step time."""
        return self.batch_size / self.step_time

    @property
    def parameter_bytes(self):
        return sum(d.parameter_bytes for d in self.devices)

    @property
    def total_bytes(self):
        """Sum of every device's maximum memory."""
        return sum(d.max_bytes for d in self.devices)

    @property
    def activation_bytes(self):
        """Peak activation memory: total minus parameter memory."""
        return self.total_bytes - self.parameter_bytes

    def row(self):
        """A flat dict for CSV/Markdown (bytes and seconds)."""
        return {
            "K": self.stages, "M": self.micro_batches,
            "checkpoint": "on" if all(self.checkpoint) else
            ("off" if not any(self.checkpoint) else "mixed"),
            "batch": self.batch_size,
            "parameter_bytes": self.parameter_bytes,
            "parameter_bytes_device0": self.devices[0].parameter_bytes,
            "parameter_per_device_bytes": " / ".join(str(d.parameter_bytes)
                                                     for d in self.devices),
            "peak_activation_bytes": self.activation_bytes,
            "total_bytes": self.total_bytes,
            "forward_s": self.forward_time, "backward_s": self.backward_time,
            "step_s": self.step_time, "samples_per_s": self.throughput,
            "max_per_device_bytes": " / ".join(str(d.max_bytes) for d in self.devices),
            "allocator_peak_bytes": self.allocator_peak,
            "copied_ops": self.copied_ops,
        }

    def __str__(self):
        flag = self.row()["checkpoint"]
        per_device = " / ".join(f"{d.max_bytes / _MiB:.1f}" for d in self.devices)
        first = self.devices[0].parameter_bytes
        return (f"K={self.stages} M={self.micro_batches} checkpoint={flag}: parameters "
                f"{self.parameter_bytes / _MiB:.1f} MiB ({first / _MiB:.1f} on device 0), "
                f"peak activations {self.activation_bytes / _MiB:.1f} MiB, total "
                f"{self.total_bytes / _MiB:.1f} MiB, forward {self.forward_time:.3f} s, "
                f"backward {self.backward_time:.3f} s, {self.throughput:.1f} samples/s, max "
                f"per device {per_device} MiB")


def measure_pipeline(session, step, feed_dict=None, *, warmup=1, steps=5):
    """Measure a built :class:`PipelineStep` (variables initialised): memory per device
    from one traced step, forward and full step times (medians of ``steps`` runs)."""
    if step.train_op is None:
        raise InvalidArgumentError("the step has no train_op: build it with an optimizer")
    full = measure(session, step.train_op, feed_dict, warmup=warmup, steps=steps, trace=True)
    forward = measure(session, step.loss, feed_dict, warmup=warmup, steps=steps, trace=False)
    peaks = _step_peaks(session, step, feed_dict, full.per_device)
    resident, parameters = _device_bytes(step)
    usage = tuple(DeviceUsage(d, parameters.get(d, 0), resident.get(d, 0), peaks.get(d, 0))
                  for d in step.devices)
    return PipelineMeasurement(
        stages=len(step.devices), micro_batches=step.micro_batches, checkpoint=step.checkpoint,
        batch_size=step.batch_size, devices=usage, forward_time=forward.step_time,
        step_time=full.step_time, step_times=full.step_times, forward_times=forward.step_times,
        allocator_peak=full.max_mem, copied_ops=step.copied_ops())


def _step_peaks(session, step, feed_dict, traced):
    """Per device, the most bytes the step allocated at once: each GPU's own allocator, or
    the traced allocation records where devices share one allocator (logical CPUs)."""
    if not all(_is_cpu(d) for d in step.devices):
        peaks = {}
        before = {d: tf.config.experimental.get_memory_info(d[len("/device:"):])["current"]
                  for d in step.devices}
        for d in step.devices:
            tf.config.experimental.reset_memory_stats(d[len("/device:"):])
        session.run(step.train_op, feed_dict=feed_dict)
        for d in step.devices:
            info = tf.config.experimental.get_memory_info(d[len("/device:"):])
            peaks[d] = info["peak"] - before[d]
        return peaks
    return {d: traced[d].peak for d in step.devices if d in traced}


def _device_bytes(step):
    """``(resident, parameter)`` bytes per device. Resident: every global variable of the
    graph where it lives (optimizer slots with their variable). Parameter: each stage's
    trainable variables with their slots and one gradient each."""
    home, parameters = {}, {}
    for device, stage_vars in zip(step.devices, step.stage_variables):
        for v in stage_vars:
            slots = _slots(step.optimizer, v)
            home.update((owned.ref(), device) for owned in [v] + slots)
            # the weight, its gradient (as many bytes) and its optimizer slots
            parameters[device] = parameters.get(device, 0) + sum(
                capture.static_bytes(u.shape, u.dtype) for u in [v, v] + slots)
    resident = {}
    for v in step.loss.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        device = home.get(v.ref()) or (canonical_device(v.device) if v.device
                                       else step.devices[0])
        resident[device] = resident.get(device, 0) + capture.static_bytes(v.shape, v.dtype)
    return resident, parameters


def _slots(optimizer, variable):
    if optimizer is None:
        return []
    found = (optimizer.get_slot(variable, name) for name in optimizer.get_slot_names())
    return [slot for slot in found if slot is not None]


def _elements(variable):
    return int(np.prod(variable.shape.as_list(), dtype=np.int64))




# ---------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------


def classification_loss(logits, labels):
    """Mean softmax cross-entropy of ``[b, classes]`` logits against int labels ``[b]``."""
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits), name="loss")


# ---------------------------------------------------------------------------------------
# Utilities
# ---------------------------------------------------------------------------------------


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")
    return int(value)
