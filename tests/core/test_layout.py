"""The package layout (docs/ALGORITHM.md, section "Layout"): each folder of ome one layer,
importing only itself and the layers below; no cycles, no private names across modules,
nothing from the benchmark's models/, and the layers below TensorFlow free of it.

Read from the sources with ``ast`` (no TensorFlow), except the run-time checks, which import
the TensorFlow-free layers in a fresh interpreter."""
import ast
import functools
import subprocess
import sys

import networkx as nx
import pytest
from tests import subprocesses

ROOT = subprocesses.ROOT
OME = ROOT / "ome"
# Each layer, by rank: a module may import its own layer and the layers of lower rank. The
# two side products are layers of their own: neither imports the other.
RANKS = {"base": 0, "core": 1, "policies": 2, "tf": 3, "front doors": 4, "pipeline": 5,
         "estimate": 5}
LAYERS = {"ome": "base", "ome.errors": "base", "ome.core": "core", "ome.policies": "policies",
          "ome.tf": "tf", "ome.gradients": "front doors", "ome.tape": "front doors",
          "ome.keras": "front doors", "ome.patch": "front doors", "ome.host": "front doors",
          "ome.timeline": "front doors", "ome.measured_steps": "front doors",
          "ome.step_function": "front doors", "ome.session": "front doors",
          "ome.measured_calls": "front doors", "ome.largest_batch": "front doors",
          "ome.batch_probes": "front doors",
          "ome.measure": "front doors", "ome.pipeline": "pipeline", "ome.estimate": "estimate"}
TENSORFLOW = ("tensorflow", "keras")


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(OME.rglob("*.py"))}


def layer(module):
    """The layer ``module`` belongs to, by its longest prefix in LAYERS."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/ALGORITHM.md")


def resolve(name):
    """The ome module an imported dotted name stands for (a module or a package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


@functools.lru_cache(maxsize=None)
def imports(module):
    """``(imported module names, private names taken from ome modules)`` of ``module``:
    every import statement, at the top or inside a function."""
    tree = ast.parse(MODULES[module].read_text())
    found, private, bound = [], [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(alias.name)
                if alias.asname and alias.name in MODULES:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{module}: use absolute imports"
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in MODULES:  # from ome.core import schedule: the module
                    found.append(full)
                    bound[alias.asname or alias.name] = full
                else:
                    found.append(node.module)
                    if node.module.startswith("ome") and alias.name.startswith("_") and \
                            not alias.name.startswith("__"):
                        private.append(f"from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id in bound and node.attr.startswith("_") and \
                not node.attr.startswith("__"):
            private.append(f"{bound[node.value.id]}.{node.attr}")
    return tuple(found), tuple(private)


@functools.lru_cache(maxsize=None)
def ome_graph():
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for module in MODULES:
        for name in imports(module)[0]:
            target = resolve(name) if name.split(".")[0] == "ome" else None
            if target and target != module:
                graph.add_edge(module, target)
    return graph


def test_every_module_is_in_a_layer():
    assert {"ome.core.schedule", "ome.policies.search", "ome.tf.rewrite", "ome.gradients",
            "ome.pipeline.gpipe", "ome.estimate.memory"} <= set(MODULES)
    for module in MODULES:
        layer(module)


def test_nothing_under_ome_imports_the_model_zoo():
    found = [(m, name) for m in MODULES for name in imports(m)[0]
             if name.split(".")[0] in ("models", "benchmark_lib", "baselines", "benchmark")]
    assert not found


def test_the_import_graph_has_no_cycle():
    cycles = list(nx.simple_cycles(ome_graph()))
    assert not cycles


def test_each_layer_imports_only_itself_and_the_layers_below():
    wrong = []
    for module, target in ome_graph().edges:
        own, other = layer(module), layer(target)
        if other != own and RANKS[other] >= RANKS[own]:
            wrong.append(f"{module} -> {target}")
    assert not wrong


def test_no_module_takes_another_modules_private_names():
    found = [(m, p) for m in MODULES for p in imports(m)[1]]
    assert not found


@pytest.mark.parametrize("package", ["core", "policies"])
def test_the_layers_below_tensorflow_import_none_of_it(package):
    found = [(m, name) for m in MODULES if layer(m) == package
             for name in imports(m)[0] if name.split(".")[0] in TENSORFLOW]
    assert not found


def test_the_layers_below_tensorflow_import_none_of_it_at_run_time():
    light = [m for m in MODULES if layer(m) in ("base", "core", "policies")]
    script = (f"import importlib, sys\nfor m in {light!r}:\n    importlib.import_module(m)\n"
              f"print(sorted(m for m in sys.modules if m.split('.')[0] in {TENSORFLOW!r}))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    assert out == ["[]"]


def test_the_core_tests_run_without_tensorflow():
    """tests/core tests the layers below TensorFlow in milliseconds: its modules import
    none of it (tests/conftest.py, which configures TensorFlow for the other folders, is
    not imported here)."""
    core = sorted(f"tests.core.{p.stem}" for p in (ROOT / "tests" / "core").glob("test_*.py"))
    script = (f"import importlib, sys\nfor m in {core!r}:\n    importlib.import_module(m)\n"
              f"print(sorted(m for m in sys.modules if m.split('.')[0] in {TENSORFLOW!r}))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    assert len(core) >= 5 and out == ["[]"]


def test_public_names_and_paths_resolve_and_functions_keep_their_names():
    """Names are imported on first use; importing a submodule named like a function
    (``ome.gradients``, ``ome.patch``) leaves the function the attribute; ``ome.host`` and
    ``ome.measure`` (README's paths) are the modules of ``ome.tf``."""
    script = (
        "import sys, ome\n"
        "print('tf', 'tensorflow' in sys.modules)\n"
        "import ome.host, ome.measure, ome.keras, ome.tf.profile\n"
        "from ome.host import emulate_host\n"
        "print(ome.gradients.__module__, ome.profile.__module__, ome.patch.__module__,\n"
        "      ome.plan.__name__, ome.errors.BudgetError.__name__, ome.host.__name__,\n"
        "      ome.host is ome.tf.host, ome.measure is ome.tf.measure,\n"
        "      ome.pipeline.__name__, ome.estimate.TransformerConfig.__name__)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    assert out == ["tf", "False", "ome.gradients", "ome.tf.profile", "ome.patch", "plan",
                   "BudgetError", "ome.tf.host", "True", "True", "ome.pipeline",
                   "TransformerConfig"]
