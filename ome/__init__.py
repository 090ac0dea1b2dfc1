"""ome: fit TensorFlow training in less accelerator memory by rewriting the gradient graph."""
from ome import errors

__all__ = ["errors"]
