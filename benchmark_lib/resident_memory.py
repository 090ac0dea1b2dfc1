"""What stays allocated between steps: a momentum slot's constant-folded initial value.

One 64 MiB weight trained by ``GradientDescentOptimizer`` or ``MomentumOptimizer``, with
Grappler's constant folding on (TensorFlow's default) or off; the allocator's bytes in use
after the initializer and after each step. With momentum and folding on, the first update
finds the slot sharing its buffer with a constant the session's cached initializer run
still holds, copies the slot (copy-on-write), and the constant stays: one extra copy of
every constant-initialized slot for the life of the session.

Run ``python -m benchmark_lib.resident_memory`` (a few seconds).
"""
import os
import subprocess
import sys

from benchmark_lib.units import MiB

SIDE = 4096  # a 4096 x 4096 float32 weight: 64 MiB
CASES = (("sgd", True), ("momentum", True), ("momentum", False))


def measure(optimizer, folding, steps=3):
    """Bytes in use (MiB) after the initializer and after each of ``steps`` steps."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2

    tf.compat.v1.disable_eager_execution()
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, (8, SIDE))
        w = tf.compat.v1.get_variable(
            "w", (SIDE, SIDE), use_resource=True,
            initializer=tf.compat.v1.random_normal_initializer(stddev=0.01))
        loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
        opt = (tf.compat.v1.train.GradientDescentOptimizer(0.1) if optimizer == "sgd"
               else tf.compat.v1.train.MomentumOptimizer(0.1, 0.9))
        train = opt.minimize(loss)
        config = tf.compat.v1.ConfigProto()
        if not folding:
            config.graph_options.rewrite_options.constant_folding = \
                rewriter_config_pb2.RewriterConfig.OFF
        with tf.compat.v1.Session(config=config) as session:
            def in_use():
                return tf.config.experimental.get_memory_info("CPU:0")["current"] / MiB

            session.run(tf.compat.v1.global_variables_initializer())
            figures = [in_use()]
            for _ in range(steps):
                session.run(train, {x: np.ones((8, SIDE), np.float32)})
                figures.append(in_use())
    return figures


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if args:  # one case, in this (fresh) process
        figures = measure(args[0], args[1] == "on")
        print(" ".join(f"{f:.1f}" for f in figures))
        return 0
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="1", TF_CPP_MIN_LOG_LEVEL="2")
    print("| optimizer | constant folding | after init MiB | after step 1 | after step 3 |")
    print("|---|---|---|---|---|")
    for optimizer, folding in CASES:
        done = subprocess.run([sys.executable, "-m", "benchmark_lib.resident_memory",
                               optimizer, "on" if folding else "off"],
                              capture_output=True, text=True, env=env, check=True)
        figures = done.stdout.split()
        print(f"| {optimizer} | {'on' if folding else 'off'} | {figures[0]} | {figures[1]} | "
              f"{figures[-1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
