"""TensorFlow's BFC allocator replayed over a process's own allocation records:
``python -m tests.scripts.allocator_replay --model resnet34 --strategy lms
[--batch-size 8] [--image-size 64] [--steps 4] [--split-above 128,4,1]``.

Why a measured device peak holds more than its tensors ask for, and what would change it.
In a fresh process (swap emulation on; a strategy that takes a cost model gets one
profiled in a child process first, so this process's allocator has no other history; the
test setup reserves the accelerator's region, :func:`ome.host.reserve_device_memory`), the
strategy's training step is built, its variables initialised and ``--steps`` steps run,
all under TensorFlow's profiler, whose records carry every chunk the BFC allocator handed
out (bytes asked, chunk given, address). :class:`BestFitAllocator` then replays the same
requests and frees in the same order:

- with TensorFlow's rules and the reserved region, it should hand out the chunk sizes the
  records show (the line "chunk sizes as recorded") and reach the same device peak: then
  the waste is decided by the sequence of requests alone, nothing the allocator draws at
  random;
- reserved, with the host's chunks in an allocator of their own, as on a GPU machine,
  where the host's memory is not the device's: for records where the host's copies came
  from the device's allocator (a ``DeepCopy`` on ``CPU:1``, as ome's swaps were made
  until 2026-11-29 19:00; now they are numpy buffers outside it, and the records hold
  no host chunks, so this trial gives what the one before gives);
- growing from regions of 2 MiB, doubling, as TensorFlow's CPU allocator does by itself
  (and a GPU's with memory growth on), which the benchmark measures with
  ``--growing-allocator``;
- growing, with the host's chunks in an allocator of their own (on a GPU the host's memory is not
  the device's, while the emulation shares one allocator);
- growing, splitting any chunk whose excess over the request reaches each ``--split-above`` MiB
  (TensorFlow splits only at twice the request or 128 MiB beyond it; on a GPU,
  ``ConfigProto.gpu_options.experimental.internal_fragmentation_fraction`` times the
  device's memory sets that threshold; the CPU allocator has no such option).

Prints the device peak and the chunk waste at it for each. A replay, not a measurement.
"""
import argparse
import bisect
import collections
import contextlib
import os
import subprocess
import sys
import tempfile

MiB = 2 ** 20
#: TensorFlow's BFC allocator rounds every request up to a multiple of this.
MIN_ALLOCATION = 256
#: Its first region when growing (``allow_growth``); each later one doubles.
FIRST_REGION = 2 * MiB
#: It splits a chunk whose excess over the request reaches this (default) or when the
#: chunk is at least twice the request.
DEFAULT_SPLIT_ABOVE = 128 * MiB


class _Chunk:
    __slots__ = ("start", "size", "free", "prev", "next", "requested")

    def __init__(self, start, size):
        self.start, self.size, self.free = start, size, True
        self.prev = self.next = None
        self.requested = 0


class BestFitAllocator:
    """TensorFlow's best-fit-with-coalescing allocator (``BFCAllocator``, growing), as its
    source describes it: a request rounded up to 256 bytes takes the smallest free chunk
    that holds it (the lowest address among equals), split only when the chunk is at least
    twice the request or its excess reaches ``split_above``; a freed chunk merges with its
    free neighbours in its region; when nothing fits, a new region of the current region
    size (doubled until it holds the request; doubled again after a region that needed no
    doubling) is added. ``in_use`` counts chunk bytes, ``requested`` the bytes asked.
    ``reserved``: the allocator starts with the first region and one that held a tensor of
    ``reserved`` bytes (:func:`ome.host.reserve_device_memory`).

    >>> a = BestFitAllocator()
    >>> first, second = a.allocate(1 * MiB), a.allocate(1 * MiB)
    >>> a.release(first); a.release(second)   # merged back into the 2 MiB region
    >>> a.allocate(1536 * 1024).size == 2 * MiB  # 2 MiB < twice 1.5 MiB: handed out whole
    True
    >>> reserved = BestFitAllocator(reserved=1 << 30)
    >>> _ = reserved.allocate(1024)  # the first region takes the small requests
    >>> reserved.allocate(20 * MiB).size == 20 * MiB  # split from the reserved region
    True
    >>> BestFitAllocator().allocate(20 * MiB).size == 32 * MiB  # a new region, whole
    True
    """

    def __init__(self, split_above=DEFAULT_SPLIT_ABOVE, reserved=0):
        self.split_above = split_above
        self.region_size = FIRST_REGION
        self._next_region = 0
        self._free = []  # (size, start) of the free chunks, sorted
        self._chunks = {}  # start -> chunk
        self.in_use = self.requested = 0
        if reserved:  # as ome.host.reserve_device_memory leaves it after the first session
            self._add_region(MIN_ALLOCATION)
            self._add_region(reserved)

    def allocate(self, nbytes):
        rounded = max(MIN_ALLOCATION, -(-nbytes // MIN_ALLOCATION) * MIN_ALLOCATION)
        at = bisect.bisect_left(self._free, (rounded, -1))
        if at == len(self._free):
            self._add_region(rounded)
            at = bisect.bisect_left(self._free, (rounded, -1))
        chunk = self._chunks[self._free.pop(at)[1]]
        if chunk.size >= 2 * rounded or chunk.size - rounded >= self.split_above:
            rest = _Chunk(chunk.start + rounded, chunk.size - rounded)
            rest.prev, rest.next = chunk, chunk.next
            if chunk.next is not None:
                chunk.next.prev = rest
            chunk.next, chunk.size = rest, rounded
            self._chunks[rest.start] = rest
            bisect.insort(self._free, (rest.size, rest.start))
        chunk.free, chunk.requested = False, nbytes
        self.in_use += chunk.size
        self.requested += nbytes
        return chunk

    def release(self, chunk):
        self.in_use -= chunk.size
        self.requested -= chunk.requested
        chunk.free = True
        for left, right in ((chunk, chunk.next), (chunk.prev, chunk)):
            if left is not None and right is not None and left.free and right.free:
                other = right if left is chunk else left
                self._free.remove((other.size, other.start))
                del self._chunks[right.start]
                left.size += right.size
                left.next = right.next
                if right.next is not None:
                    right.next.prev = left
                chunk = left
        bisect.insort(self._free, (chunk.size, chunk.start))

    def _add_region(self, rounded):
        doubled = False
        while rounded > self.region_size:
            self.region_size *= 2
            doubled = True
        region = _Chunk(self._next_region, self.region_size)
        # regions are not adjacent: chunks never merge across them
        self._next_region += 2 * self.region_size
        self._chunks[region.start] = region
        bisect.insort(self._free, (region.size, region.start))
        if not doubled:
            self.region_size *= 2


Replay = collections.namedtuple("Replay", "device_peak requested_at_peak as_recorded allocations")


def replay(events, host_ops, *, host_apart=False, split_above=DEFAULT_SPLIT_ABOVE, reserved=0):
    """Replay ``events`` (:data:`ome.tf.tfprivate.AllocatorEvent` tuples of one allocator, in
    time order): the device peak (chunk bytes, host chunks left out), the bytes asked at
    it, and how many allocations got the chunk size the records show. ``host_apart``: the
    chunks of ``host_ops`` come from an allocator of their own (growing, as a GPU
    machine's pinned host memory does); ``reserved``: the device's allocator starts with
    a region of that many bytes (:class:`BestFitAllocator`)."""
    device = BestFitAllocator(split_above, reserved)
    host = BestFitAllocator(split_above) if host_apart else device
    live = {}  # address -> (its allocator, its chunk, whether it is the host's)
    shared_bytes = shared_requested = 0  # the host's chunks in the device's allocator
    peak = requested_at_peak = as_recorded = allocations = 0
    for _, _, op, address, nbytes, _, requested in events:
        if nbytes > 0:
            on_host = op in host_ops
            allocator = host if on_host else device
            chunk = allocator.allocate(requested or nbytes)
            live[address] = (allocator, chunk, on_host)
            allocations += 1
            as_recorded += chunk.size == nbytes
            change = (chunk.size, chunk.requested)
        elif address in live:
            allocator, chunk, on_host = live.pop(address)
            change = (-chunk.size, -chunk.requested)  # before a merge grows the chunk
            allocator.release(chunk)
        else:
            continue
        if on_host and not host_apart:
            shared_bytes += change[0]
            shared_requested += change[1]
        if device.in_use - shared_bytes > peak:
            peak = device.in_use - shared_bytes
            requested_at_peak = device.requested - shared_requested
    return Replay(peak, requested_at_peak, as_recorded, allocations)


def _record(args, costs_path):
    """The allocator events of this process from the step's variables' initialisation on,
    and the names of the ops on the emulated host."""
    import tests.conftest  # the emulated host (two CPU devices), the reserved region
    import tensorflow as tf

    import baselines
    import models
    from ome.tf import host, measure, tfprivate
    from ome.core.costs import CostModel

    options = {"batch_size": args.batch_size}
    if costs_path:
        with open(costs_path) as saved:
            options["cost_model"] = CostModel.from_json(saved.read())
    built = {}

    def gradients(ys, xs):
        built["built"] = baselines.build(args.strategy, ys, xs, **{
            k: v for k, v in options.items() if k in baselines.options_of(args.strategy)})
        return list(built["built"].grads)

    graph = tf.Graph()
    with graph.as_default():
        step = models.build_train_step(args.model, args.batch_size, args.image_size,
                                       gradients=gradients,
                                       **baselines.model_options(args.strategy))
    config = host.session_config(built["built"].config)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        def run():
            session.run(step.init_op)
            for _ in range(args.steps):
                session.run(step.train_op, step.feed_dict)

        events = tfprivate.profiler_trace(run).allocations
        metadata = tf.compat.v1.RunMetadata()
        session.run(step.train_op, step.feed_dict, run_metadata=metadata,
                    options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
    host_ops = measure.ops_sharing_allocator(metadata, "CPU:0")
    recorded = measure.shared_allocator_peaks(events, host_ops)
    name = collections.Counter(e.allocator for e in events).most_common(1)[0][0]
    return ([e for e in events if e.allocator == name], host_ops, recorded,
            tests.conftest.RESERVED)


def _profile(args, costs_path):
    """Save the cost model of the plain step (``ome.profile``, host link included)."""
    import tests.conftest  # noqa: F401
    import tensorflow as tf

    import models
    import ome
    from ome.tf import host

    with tf.Graph().as_default() as graph:
        step = models.build_train_step(args.model, args.batch_size, args.image_size)
    with tf.compat.v1.Session(graph=graph, config=host.session_config()) as session:
        session.run(step.init_op)
        costs = ome.profile(session, step.train_op, step.feed_dict,
                            host_device=host.default_host_device())
    with open(costs_path, "w") as out:
        out.write(costs.to_json())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet34")
    parser.add_argument("--strategy", default="lms")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--split-above", default="4,1",
                        help="MiB of excess at which the counterfactual replays split")
    parser.add_argument("--profile-into", help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args()
    if args.profile_into:
        _profile(args, args.profile_into)
        return
    import baselines

    with contextlib.ExitStack() as stack:
        costs_path = None
        if "cost_model" in baselines.options_of(args.strategy):
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="ome-replay-"))
            costs_path = os.path.join(folder, "costs.json")
            subprocess.run([sys.executable, "-m", "tests.scripts.allocator_replay",
                            *sys.argv[1:], "--profile-into", costs_path], check=True)
        events, host_ops, recorded, reserved = _record(args, costs_path)
    print(f"{args.model}, {args.strategy}, batch {args.batch_size}, {args.image_size}x"
          f"{args.image_size}: {len(events)} allocator events over initialisation and "
          f"{args.steps} steps")
    print(f"recorded: device peak {recorded.device_peak / MiB:.1f} MiB, of it chunk waste "
          f"{recorded.device_chunk_waste / MiB:.1f} MiB")
    trials = [(f"replayed, TensorFlow's rules, the {reserved / 2**30:.1f} GiB reserved",
               {"reserved": reserved}),
              ("replayed, reserved, the host's chunks in an allocator of their own",
               {"reserved": reserved, "host_apart": True}),
              ("replayed, growing from 2 MiB (--growing-allocator)", {}),
              ("replayed, growing, the host's chunks in an allocator of their own",
               {"host_apart": True})]
    trials += [(f"replayed, growing, chunks split at {mib} MiB of excess",
                {"split_above": int(float(mib) * MiB)}) for mib in args.split_above.split(",")]
    for label, options in trials:
        result = replay(events, host_ops, **options)
        print(f"{label}: device peak {result.device_peak / MiB:.1f} MiB, asked at it "
              f"{result.requested_at_peak / MiB:.1f}, waste "
              f"{(result.device_peak - result.requested_at_peak) / MiB:.1f}; chunk sizes as "
              f"recorded {result.as_recorded} of {result.allocations}")


if __name__ == "__main__":
    main()
