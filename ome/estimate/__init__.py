"""The Transformer memory estimator (:mod:`ome.estimate.memory`) and the measured split of a
training step (:mod:`ome.estimate.breakdown`). A side product: it uses only ome's public names."""
from ome.estimate.memory import *  # noqa: F401,F403
from ome.estimate.memory import __all__  # noqa: F401
