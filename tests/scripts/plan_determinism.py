"""The same plan on an idle machine and beside a CPU-bound process: ResNet-50 (batch 16,
112x112) planned with ``checkpoints="optimal"`` and with a profiled ``memory_budget``
(0.7 of plain backprop's profiled peak), each twice in one process from one profile.

    python -m tests.scripts.plan_determinism

Prints, per load and option, the plan's JSON digest, its solver and the seconds planning
took, then whether the two plans of each option are JSON-equal.
"""
import hashlib
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")

import tensorflow as tf  # noqa: E402

import models  # noqa: E402
import ome  # noqa: E402


def main():
    tf.compat.v1.disable_eager_execution()
    with tf.Graph().as_default():
        step = models.build_train_step("resnet50", 16, 112)
        with tf.compat.v1.Session() as sess:
            sess.run(step.init_op)
            costs = ome.profile(sess, step.train_op, step.feed_dict)
        settings = {"optimal": dict(checkpoints="optimal"),
                    "budget": dict(memory_budget=int(0.7 * costs.plain_peak_bytes),
                                   cost_model=costs)}
        plans = {}
        for load in ("idle", "busy"):
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) \
                if load == "busy" else None
            try:
                for name, options in settings.items():
                    start = time.perf_counter()
                    plans[load, name] = ome.plan(step.loss, step.variables, **options).to_json()
                    digest = hashlib.sha256(plans[load, name].encode()).hexdigest()[:16]
                    print(f"{load} {name} {digest} {time.perf_counter() - start:.1f} s",
                          flush=True)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
    for name in settings:
        same = plans["idle", name] == plans["busy", name]
        print(f"{name}: {'JSON-equal' if same else 'DIFFERENT'}")
    return 0 if all(plans["idle", n] == plans["busy", n] for n in settings) else 1


if __name__ == "__main__":
    sys.exit(main())
