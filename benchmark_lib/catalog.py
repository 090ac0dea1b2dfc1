"""The models and strategies the benchmark can run, known without importing TensorFlow.

``models`` and ``baselines`` import TensorFlow (several seconds), so the command line checks
its arguments against this catalog instead and fails in a fraction of a second.
``tests/integration/test_benchmark.py`` checks that it equals ``models.NAMES``, ``models.MIN_IMAGE_SIZE``,
``baselines.STRATEGIES``, ``baselines.ALIASES`` and ``baselines.required_options``: a model
or strategy added there must be added here too. The workers use ``models`` and
``baselines`` themselves.
"""
import re

__all__ = ["MODELS", "STRATEGIES", "ALIASES", "NEEDS_BUDGET", "resnet_depth", "family",
           "default_strategies"]

#: Model name -> smallest square image side it accepts, in ``models.NAMES`` order.
MODELS = {
    "resnet18": 32, "resnet34": 32, "resnet50": 32, "resnet101": 32, "resnet152": 32,
    "resnet200": 32, "inception_v4": 75,
}

#: Strategy name -> what it is (shown by ``--help``), in ``baselines.STRATEGIES`` order.
STRATEGIES = {
    "vanilla": "plain tf.gradients: the reference of every ratio",
    "openai": "OpenAI's gradient checkpointing, checkpoints='memory' (bottleneck tensors)",
    "openai-memory": "openai with checkpoints='memory' (the same as openai)",
    "openai-speed": "openai with checkpoints='speed' (keep every conv/matmul output)",
    "openai-collection": "openai with checkpoints='collection' (the graph collection)",
    "lms": "IBM Large Model Support: swap forward tensors to the host and back",
    "grappler-recompute": "tf.gradients + Grappler's RECOMPUTATION_HEURISTICS",
    "grappler-swap": "tf.gradients + Grappler's SWAPPING_HEURISTICS",
    "grappler-heuristics": "tf.gradients + Grappler's HEURISTICS",
    "tf-recompute-grad": "tf.recompute_grad around each model block",
    "ome": "ome.gradients: checkpoints='auto', recompute the rest",
    "ome-swap": "ome.gradients(swap='auto'): with a profile (--simulator-check, --frontier), "
                "a lower peak with swaps at no more added time than ome's; without, ome's",
    "ome-speed": "ome.gradients(checkpoints='speed'): keep every conv/matmul output, "
                 "recompute only the cheap ops after them",
    "ome-optimal": "ome.gradients(checkpoints='optimal'): the MILP planner's smallest peak, "
                   "then the least added time at it",
    "ome-optimal-swap": "ome.gradients(checkpoints='optimal', swap='auto'): the MILP planner's "
                        "smallest peak with the host to swap to, then the least added time at it",
    "ome-budget": "ome.gradients(memory_budget=--budget): keep, recompute or swap each tensor "
                  "to fit the budget at the least added time; runs only with --budget",
    "ome-budget-recompute": "ome.gradients(memory_budget=--budget) without a host: keep or "
                            "recompute each tensor, nothing swapped; runs only with --budget",
}

#: Strategies that repeat another one with an option fixed; the default sweep skips them.
ALIASES = {"openai-memory": "openai", "openai-collection": "openai", "ome-optimal": "ome",
           "ome-speed": "ome", "ome-optimal-swap": "ome-swap"}

#: Strategies that cannot run without a memory budget (``--budget``).
NEEDS_BUDGET = frozenset({"ome-budget", "ome-budget-recompute"})

_RESNET = re.compile(r"^resnet(\d+)$")


def resnet_depth(model):
    """The depth of a ``resnetNN`` model name, or None for other models."""
    match = _RESNET.match(model)
    return int(match.group(1)) if match else None


def family(strategy):
    """The system a strategy belongs to: its name up to the first dash (``ome-swap`` -> ``ome``,
    ``tf-recompute-grad`` -> ``tf``); plots draw a family in one colour."""
    return strategy.split("-", 1)[0]


def default_strategies(with_budget):
    """Every strategy once (no aliases); those needing a budget only ``with_budget``."""
    return [s for s in STRATEGIES
            if s not in ALIASES and (with_budget or s not in NEEDS_BUDGET)]
