"""``ome.host``, the public path of :mod:`ome.tf.host` (devices and the emulated host), as
README names it: ``ome.host.emulate_host()``. The two names are one module object."""
import sys

from ome.tf import host

sys.modules[__name__] = host
