"""TensorFlow-free policies over a :class:`ome.core.graphview.GraphView`: heuristics, the
Transformer modes, the optimal planner and budget fitting. Import only ``ome.core``."""
