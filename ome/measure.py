"""``ome.measure``, the public path of :mod:`ome.tf.measure`, as README names it:
``ome.measure.measure(session, fetches, feed)``. The two names are one module object."""
import sys

from ome.tf import measure

sys.modules[__name__] = measure
