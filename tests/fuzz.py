"""The long random-graph run: ``python -m tests.fuzz --graphs 500 [--seed 0]
[--settings all] [--size 16] [--out results/fuzz] [--shrink 3]``.

Judges ``--graphs`` programs (seeds ``--seed`` onwards) under each setting of
:data:`tests.fuzzing.SETTINGS`, prints a table of verdicts per setting and the figures for
the docs, and writes into ``--out``:

- ``verdicts.csv``: one row per program and setting;
- ``summary.md``: the table, the figures and the failure classes;
- ``failures/seed<N>-<setting>-<label>.py``: a replay script per failing case;
- ``minimal/<n>-<setting>.py`` with ``--shrink``: for the first classes of failure, the
  smallest program hypothesis finds that fails the same way (minutes per class).

Both folders are emptied first, so they hold this run's scripts only.
"""
import argparse
import collections
import csv
import logging
import os
import shutil
import sys
import time

import ome

ome.host.emulate_host()  # before TensorFlow's runtime starts: /device:CPU:1 is the host

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()

from tests import fuzzing, randomgraphs  # noqa: E402

try:
    from tqdm import tqdm
except ImportError:  # plain progress lines instead
    tqdm = None


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz",
                                     description="Judge ome.gradients on random graphs.")
    parser.add_argument("--graphs", type=int, default=500, help="programs to judge")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first program")
    parser.add_argument("--settings", default="all",
                        help="'all' or comma-separated names: "
                             + ", ".join(s.name for s in fuzzing.SETTINGS))
    parser.add_argument("--vocabulary", choices=sorted(randomgraphs.VOCABULARIES),
                        default="all", help="op families: 'classic' leaves out the "
                        "activations and norms of MODERN_FAMILIES (each seed draws the "
                        "program it always drew)")
    parser.add_argument("--size", type=int, default=16,
                        help="generation steps per program, at most")
    parser.add_argument("--out", default=os.path.join("results", "fuzz"), help="output folder")
    parser.add_argument("--shrink", type=int, default=0, metavar="N",
                        help="shrink the first N failure classes with hypothesis (slow)")
    args = parser.parse_args(argv)
    try:
        args.settings = fuzzing.settings_named(args.settings)
    except ValueError as err:
        parser.error(str(err))
    return args


class Progress:
    """A tqdm bar over the programs, or a line every tenth of the run without tqdm."""

    def __init__(self, total):
        self.total, self.done, self.failures = total, 0, 0
        self.bar = tqdm(total=total, unit="graph") if tqdm else None

    def step(self, failures):
        self.done += 1
        self.failures += failures
        if self.bar is not None:
            self.bar.set_postfix(failures=self.failures)
            self.bar.update()
        elif self.done % max(1, self.total // 10) == 0 or self.done == self.total:
            print(f"{self.done}/{self.total} graphs, {self.failures} failing cases", flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def run(args, settings):
    """Judge every program under every setting; return rows (seed, program, verdict)."""
    rows = []
    progress = Progress(args.graphs)
    for seed in range(args.seed, args.seed + args.graphs):
        program = randomgraphs.generate(seed, size=args.size, vocabulary=args.vocabulary)
        verdicts = [fuzzing.judge(program, setting) for setting in settings]
        rows += [(seed, program, v) for v in verdicts]
        progress.step(sum(not v.ok for v in verdicts))
    progress.close()
    return rows


def write_failures(rows, settings, folder):
    """A replay script per failing case; return {failure class: [(ops, setting, path)]}."""
    by_name = {s.name: s for s in settings}
    classes = collections.defaultdict(list)
    os.makedirs(folder, exist_ok=True)
    for seed, program, verdict in rows:
        if verdict.ok:
            continue
        label = verdict.label.replace(" ", "_")
        path = os.path.join(folder, f"seed{seed}-{verdict.setting}-{label}.py")
        with open(path, "w") as f:
            f.write(fuzzing.replay_script(program, by_name[verdict.setting]))
        classes[fuzzing.failure_class(verdict)].append((len(program.ops), verdict.setting, path))
    return classes


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["seed", "setting", "kind", "label", "ops", "seconds", "message"])
        for seed, program, v in rows:
            first = v.message.strip().splitlines()
            out.writerow([seed, v.setting, v.kind, v.label, len(program.ops),
                          f"{v.seconds:.3f}", first[-1] if first else ""])


def table(rows, settings):
    """Markdown: verdict labels per setting, and of the exact cases how many plans
    recomputed and how many swapped (the rest built plain backprop)."""
    counts = collections.Counter((v.setting, v.label) for _, _, v in rows)
    did = collections.Counter((v.setting, v.did) for _, _, v in rows if v.kind == "exact")
    labels = sorted({label for _, label in counts}, key=lambda l: (l != "exact", l))
    lines = ["| setting | " + " | ".join(labels) + " | exact, recomputing | exact, swapping |",
             "|---" * (len(labels) + 3) + "|"]
    for s in settings:
        cells = [str(counts.get((s.name, label), 0)) for label in labels]
        cells += [str(did[(s.name, "recompute")] + did[(s.name, "both")]),
                  str(did[(s.name, "swap")] + did[(s.name, "both")])]
        lines.append(f"| {s.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figures(rows, seconds):
    """The figures for the docs: totals, refusals by reason, failures by kind."""
    verdicts = [v for _, _, v in rows]
    total = len(verdicts)

    def share(n):
        return f"{n} ({100 * n / total:.1f}%)" if total else "0"

    exact = sum(v.kind == "exact" for v in verdicts)
    refused = collections.Counter(v.reason or "not documented (false refusal)"
                                  for v in verdicts if v.kind == "refused")
    failed = collections.Counter(v.kind for v in verdicts if v.kind in fuzzing.FAILURES)
    graphs = len({seed for seed, _, _ in rows})
    lines = [f"- cases: {total} ({graphs} graphs x {total // max(graphs, 1)} settings), "
             f"{seconds:.0f} s",
             f"- exact (bit-equal to tf.gradients): {share(exact)}",
             f"- Grappler's miscompilation (ome agrees with tf.gradients with the "
             f"arithmetic optimizer off): "
             f"{share(sum(v.kind == 'grappler_miscompiled' for v in verdicts))}",
             f"- refused: {share(sum(refused.values()))}"]
    lines += [f"  - {reason}: {n}" for reason, n in refused.most_common()]
    lines.append(f"- failures: {share(sum(failed.values()))}")
    lines += [f"  - {kind}: {n}" for kind, n in failed.most_common()]
    return "\n".join(lines)


def _ranked(classes):
    return sorted(classes, key=lambda description: -len(classes[description]))


def class_lines(classes):
    """Failure classes, most frequent first: the settings they occur under and the
    smallest replay script."""
    lines = []
    for description in _ranked(classes):
        cases = classes[description]
        per_setting = collections.Counter(setting for _, setting, _ in cases)
        ops, setting, path = min(cases)
        lines.append(f"- {description}\n  {len(cases)} cases ("
                     + ", ".join(f"{name} {n}" for name, n in per_setting.items())
                     + f"); smallest: {ops} ops under {setting}, {path}")
    return "\n".join(lines)


def shrink(classes, settings, count, folder, size):
    """For the ``count`` most frequent failure classes, the smallest program hypothesis
    finds that fails the same way (under the setting of the class's smallest case),
    written as replay scripts."""
    from hypothesis import HealthCheck, find, settings as hsettings
    from hypothesis.errors import NoSuchExample

    by_name = {s.name: s for s in settings}
    config = hsettings(max_examples=300, deadline=None, database=None,
                       suppress_health_check=list(HealthCheck))
    os.makedirs(folder, exist_ok=True)
    for n, description in enumerate(_ranked(classes)[:count]):
        setting = by_name[min(classes[description])[1]]

        def fails_alike(program):
            return fuzzing.failure_class(fuzzing.judge(program, setting)) == description

        try:
            program = find(randomgraphs.programs(size), fails_alike, settings=config)
        except NoSuchExample:
            print(f"shrink: found no other example of {description}")
            continue
        path = os.path.join(folder, f"{n}-{setting.name}.py")
        with open(path, "w") as f:
            f.write(fuzzing.replay_script(program, setting))
        print(f"shrink: {description}: {len(program.ops)} ops under {setting.name} -> {path}")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.getLogger("ome").setLevel(logging.ERROR)  # ome logs a line per call
    settings = args.settings
    start = time.perf_counter()
    rows = run(args, settings)
    seconds = time.perf_counter() - start
    for folder in ("failures", "minimal"):  # this run's scripts only
        shutil.rmtree(os.path.join(args.out, folder), ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    classes = write_failures(rows, settings, os.path.join(args.out, "failures"))
    write_csv(rows, os.path.join(args.out, "verdicts.csv"))
    summary = "\n\n".join([
        f"# Random graphs: ome.gradients against tf.gradients (seeds {args.seed}.."
        f"{args.seed + args.graphs - 1}, size {args.size})",
        table(rows, settings), figures(rows, seconds),
        "## Failure classes\n\n" + (class_lines(classes) or "none")])
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(summary + "\n")
    print(summary)
    if args.shrink and classes:
        shrink(classes, settings, args.shrink, os.path.join(args.out, "minimal"), args.size)
    return 1 if classes else 0


if __name__ == "__main__":
    sys.exit(main())
