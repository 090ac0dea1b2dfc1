"""ome under XLA (``tf.function(jit_compile=True)``), one check per argument.

Run by tests/xla/test_xla.py (XLA's compiler IR needs eager execution, which the pytest
process turns off). Each check prints ``OK <name>``; a failed check raises.

- ``buffers``: ``ome.tf.xla.buffers`` of a function whose buffers are known by hand;
- ``ties``: ``ome.tf.xla.tied`` passes every value of every dtype bit for bit (NaN, Inf,
  -0.0, subnormals), and XLA keeps it apart from the tensor it ties;
- ``mlp``: an MLP step updating its weights, plain and with ome under XLA: same loss,
  gradients and weights, ome's plan recomputed, XLA kept the copies and allocates less;
- ``specials``: the same gradients when the incoming gradient holds NaN, Inf and -0.0;
- ``sums``: a bias's gradient ordered after its weight's is summed as in plain XLA;
- ``swap``: swapping under XLA is refused with ``ome.errors.UnsupportedGraphError``;
- ``function``: ``ome.function(jit_compile=True)`` measures itself and keeps plain's losses;
- ``order``: XLA keeps the plan's order of the ops, and so its saving, on ResNet-18,
  whose gradients equal plain XLA's;
- ``saving``: a plan predicted to save little is plain ``tf.gradients`` under XLA.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ome  # noqa: E402
from ome.tf import standins, xla  # noqa: E402

LAYERS, BATCH, WIDTH = 8, 1024, 256


def check_buffers():
    f = tf.function(lambda x: tf.tanh(x) * 2.0, jit_compile=True)
    found = xla.buffers(f, tf.ones([256, 1024]))  # 1 MiB in, 1 MiB out
    assert found.parameters == 2**20, found
    assert 2 * 2**20 <= found.total < 2 * 2**20 + 4096, found  # + the result tuple
    print("OK buffers", found)


SPECIALS = [0.5, -0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-40, -1e-42, 3e38]


def check_ties():
    cases = {
        tf.float32: np.array(SPECIALS, np.float32),
        tf.float16: np.array(SPECIALS[:7] + [6e-8, -6e-8, 6e4], np.float16),
        tf.float64: np.array(SPECIALS + [5e-324], np.float64),
        tf.bfloat16: np.array(SPECIALS, np.float32),
        tf.complex64: np.array(SPECIALS, np.float32) * (1 - 1j),
        tf.int32: np.array([0, -1, 2**31 - 1, -2**31], np.int32),
        tf.uint8: np.array([0, 1, 255], np.uint8),
        tf.bool: np.array([True, False]),
    }
    for source in (np.array([np.nan, 1], np.float32), np.array([-np.inf], np.float32),
                   np.array([-0.0], np.float32), np.array([7], np.int64)):
        for dtype, values in cases.items():
            @tf.function(jit_compile=True)
            def both(x, s):
                return x, xla.tied(x, [s])

            x = tf.cast(tf.constant(values), dtype)
            original, passed = (t.numpy() for t in both(x, tf.constant(source)))
            assert original.tobytes() == passed.tobytes(), (dtype, source, original, passed)
    print("OK ties pass every value unchanged")

    @tf.function(jit_compile=True)
    def twice(x, g):  # the same op on x and on x tied to g: XLA keeps two
        return tf.tanh(x), tf.tanh(xla.tied(x, [g]))

    hlo = twice.experimental_get_compiler_ir(tf.ones([8]), tf.ones([2]))(stage="optimized_hlo")
    assert hlo.count(" tanh(") == 2, hlo
    assert "shift-right-logical" in hlo, hlo
    print("OK ties not folded by XLA")


def mlp_step(use_ome, output_gradient=None, jit_compile=True, **options):
    """An MLP step (jit-compiled by default) with its weights updated inside, ome's tape
    given ``options``; returns (step, weights, tapes)."""
    weights = [tf.Variable(tf.random.stateless_normal([WIDTH, WIDTH], [i, 0]) * 0.1)
               for i in range(LAYERS)]
    tapes = []

    @tf.function(jit_compile=jit_compile)
    def step(x):
        tape = ome.GradientTape(**options) if use_ome else tf.GradientTape()
        with tape:
            h = x
            for w in weights:
                h = tf.tanh(h @ w)
            loss = tf.reduce_sum(h)
        target = loss if output_gradient is None else h
        grads = tape.gradient(target, weights, output_gradients=output_gradient)
        for w, g in zip(weights, grads):
            w.assign_sub(0.01 * g)
        tapes.append(tape)
        return loss, grads

    return step, weights, tapes


def same_bits(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, what
    nan = np.isnan(a)
    assert np.array_equal(nan, np.isnan(b)), f"{what}: NaNs differ"
    assert np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)), \
        f"{what}: {np.max(np.abs(a[~nan] - b[~nan]))} apart"


def recomputed_ops(module):
    return [op for op, name in xla.instructions(module)
            if standins.is_stand_in(name, "recomputed") and op in ("dot", "tanh")]


def check_mlp():
    x = tf.random.stateless_normal([BATCH, WIDTH], [7, 7])
    results = {}
    for use_ome in (False, True):
        step, weights, tapes = mlp_step(use_ome)
        module = xla.optimized_module(step, x)
        loss, grads = step(x)
        results[use_ome] = (loss.numpy(), [g.numpy() for g in grads],
                            [w.numpy() for w in weights], xla.buffers(step, x), module, tapes)
    plain, mine = results[False], results[True]
    plan, info = mine[5][0].plans[0]
    assert len(plan.recomputed) > 0 and info.tied > 0, (plan, info)
    same_bits(plain[0], mine[0], "loss")
    for i, (a, b) in enumerate(zip(plain[1], mine[1])):
        same_bits(a, b, f"gradient {i}")
    for i, (a, b) in enumerate(zip(plain[2], mine[2])):
        same_bits(a, b, f"updated weight {i}")
    print(f"OK mlp: loss, gradients and weights equal plain XLA's; {len(plan.recomputed)} "
          f"tensors recomputed, {info.tied} copies tied")
    copies = recomputed_ops(mine[4])
    assert copies, "XLA merged every recomputed op with its original"
    assert plain[3].parameters == mine[3].parameters, (plain[3], mine[3])
    assert mine[3].temporary < 0.75 * plain[3].temporary, (plain[3], mine[3])
    print(f"OK mlp: {len(copies)} recomputed dot/tanh in XLA's optimized HLO; temporary "
          f"buffers {mine[3].temporary / 2**20:.1f} MiB against plain's "
          f"{plain[3].temporary / 2**20:.1f}")


def check_specials():
    special = np.ones([BATCH, WIDTH], np.float32)
    special[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    special[1:3] = -0.0
    seed = tf.constant(special)
    x = tf.random.stateless_normal([BATCH, WIDTH], [7, 7])
    grads = {}
    for use_ome in (False, True):
        step, _, tapes = mlp_step(use_ome, output_gradient=seed)
        grads[use_ome] = [g.numpy() for g in step(x)[1]]
    plan, _ = tapes[0].plans[0]
    assert len(plan.recomputed) > 0, plan
    assert any(np.isnan(g).any() for g in grads[False]), "the seed made no NaN gradient"
    for i, (a, b) in enumerate(zip(grads[False], grads[True])):
        same_bits(a, b, f"gradient {i}")
    print("OK specials: NaN, Inf and -0.0 in the incoming gradient give plain XLA's "
          "gradients bit for bit")


def check_sums():
    """A bias's gradient sums over the batch; made to wait for its weight's gradient
    through a tied input, XLA:CPU summed it in another order than plain's (a chain of
    ``sin(-(x @ w + b) * c)``: 3e-10 apart)."""
    x = tf.random.stateless_normal([BATCH, WIDTH], [1, 2])
    weights = [tf.Variable(tf.random.stateless_normal([WIDTH, WIDTH], [i, 0]) * 0.06)
               for i in range(2)]
    biases = [tf.Variable(tf.random.stateless_normal([WIDTH], [i, 1]) * 0.1) for i in range(2)]
    variables, tapes = weights + biases, []

    def loss_of(x):
        for w, b in zip(weights, biases):
            x = tf.sin(-(x @ w + b) * 0.70710677)
        return tf.reduce_mean(tf.square(x))

    @tf.function(jit_compile=True)
    def plain(x):
        loss = loss_of(x)
        return loss, tf.gradients(loss, variables)

    @tf.function(jit_compile=True)
    def mine(x):
        tapes.append(ome.GradientTape())
        with tapes[-1]:
            loss = loss_of(x)
        return loss, tapes[-1].gradient(loss, variables)

    expected, got = plain(x), mine(x)
    plan, info = tapes[0].plans[0]
    assert len(plan.recomputed) > 0 and info.ordered > 0, (plan, info)
    same_bits(expected[0], got[0], "loss")
    for variable, a, b in zip(variables, expected[1], got[1]):
        same_bits(a, b, variable.name)
    print("OK sums: a bias's gradient, ordered after its weight's, sums as plain XLA's")


def check_swap():
    w = tf.Variable(tf.ones([64, 64]))

    def step_with(options):
        @tf.function(jit_compile=True)
        def step(x):
            h = first = tf.tanh(x @ w)
            for _ in range(6):
                h = tf.tanh(h @ w)
            return ome.gradients(tf.reduce_sum(h), [w], **options(first))
        return step

    for options in (lambda first: dict(swap="auto"), lambda first: dict(swap=[first])):
        try:
            step_with(options)(tf.ones([32, 64]))
        except ome.errors.UnsupportedGraphError as err:
            assert "XLA" in str(err) and "host" in str(err), err
        else:
            raise AssertionError("swapping was not refused under XLA")
    print("OK swap refused under XLA: swap='auto' and a swap list")


def check_function():
    x = tf.random.stateless_normal([BATCH, WIDTH], [7, 7])
    losses = {}
    for use_ome in (False, True):
        weights = [tf.Variable(tf.random.stateless_normal([WIDTH, WIDTH], [i, 0]) * 0.1)
                   for i in range(LAYERS)]

        def step(x):
            with (ome.GradientTape() if use_ome else tf.GradientTape()) as tape:
                h = x
                for w in weights:
                    h = tf.tanh(h @ w)
                loss = tf.reduce_sum(h)
            for w, g in zip(weights, tape.gradient(loss, weights)):
                w.assign_sub(0.01 * g)
            return loss

        compiled = ome.function(step, jit_compile=True) if use_ome else \
            tf.function(step, jit_compile=True)
        losses[use_ome] = [compiled(x).numpy() for _ in range(4)]  # measured, then planned
    plan, info = compiled.plans[-1]
    assert len(plan.recomputed) > 0 and info.tied > 0, (plan, info)
    same_bits(np.array(losses[False]), np.array(losses[True]), "losses")
    print(f"OK ome.function(jit_compile=True): losses of 4 steps equal plain XLA's "
          f"({len(compiled.plans)} traces, {len(plan.recomputed)} tensors recomputed)")


def check_order():
    """XLA drops control inputs and runs each op as soon as its inputs are ready: the
    plan's order is kept by data ties, and backward ops read forward tensors tied to
    their gradient. ResNet-18's (112x112, batch 16) temporaries were 0.93x plain's
    without ties (ome predicted 0.85x), and 0.80x with the order tied but not the reads.
    Its loss and gradients stay plain XLA's bit for bit."""
    from benchmark_lib import xla_memory  # pylint: disable=import-outside-toplevel

    loss_of, variables, inputs = xla_memory.build_model("resnet18")
    temporary, values, tapes = {}, {}, []
    for use_ome in (False, True):

        def gradients(args):
            if not use_ome:
                loss = loss_of(*args)
                return loss, tf.gradients(loss, variables)
            tapes.append(ome.GradientTape())
            with tapes[-1]:
                loss = loss_of(*args)
            return loss, tapes[-1].gradient(loss, variables)

        @tf.function(jit_compile=True)
        def step(*args):
            loss, grads = gradients(args)
            for variable, grad in zip(variables, grads):
                variable.assign_sub(1e-6 * grad)  # updates in the step, as in training
            return loss

        temporary[use_ome] = xla.buffers(step, *inputs).temporary
        values[use_ome] = tf.function(lambda *args: gradients(args), jit_compile=True)(*inputs)
    plan, info = tapes[0].plans[0]
    assert info.ordered > 0 and info.read_late > 0 and len(plan.recomputed) > 0, (plan, info)
    ratio = temporary[True] / temporary[False]
    assert ratio < 0.74, ratio
    same_bits(values[False][0], values[True][0], "loss")
    for variable, plain, mine in zip(variables, values[False][1], values[True][1]):
        same_bits(plain, mine, variable.name)
    print(f"OK order: ResNet-18's temporary buffers {ratio:.2f}x plain's, {info.ordered} ops "
          f"kept in the plan's order, {info.read_late} forward reads after the gradient; "
          "loss and gradients equal plain XLA's")


def check_saving():
    """A plan predicted to save little is plain tf.gradients under XLA, which orders and
    fuses the ops itself: the MLP's "speed" plan (keep the matmuls, recompute the tanh),
    predicted to save 2%, gave XLA more buffers than plain's."""
    x = tf.random.stateless_normal([BATCH, WIDTH], [7, 7])
    policies = {}
    for jit_compile in (False, True):
        step, _, tapes = mlp_step(True, jit_compile=jit_compile, checkpoints="speed")
        step.get_concrete_function(x)
        policies[jit_compile] = tapes[0].plans[0][0].policy
    assert policies == {False: "speed", True: "speed (no saving: plain)"}, policies
    print("OK saving: checkpoints='speed' on the MLP is plain under XLA, a plan without")


CHECKS = {"buffers": check_buffers, "ties": check_ties, "mlp": check_mlp,
          "specials": check_specials, "sums": check_sums, "swap": check_swap, "function": check_function,
          "order": check_order, "saving": check_saving}

if __name__ == "__main__":
    for name in sys.argv[1:]:
        CHECKS[name]()
