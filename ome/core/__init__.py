"""TensorFlow-free core: the graph view, plans and their schedules, the simulator, the cost
model and sizes. Imports nothing above itself (docs/ALGORITHM.md, section "Layout")."""
