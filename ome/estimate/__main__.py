"""``python -m ome.estimate``: the estimator's command line."""
import sys

from ome.estimate.memory import main

sys.exit(main())
