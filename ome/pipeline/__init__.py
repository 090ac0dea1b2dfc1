"""GPipe pipelines over K devices (:mod:`ome.pipeline.gpipe`). A side product: it uses only
ome's front doors and the lower layers' public names."""
from ome.pipeline.gpipe import *  # noqa: F401,F403
from ome.pipeline.gpipe import __all__  # noqa: F401
