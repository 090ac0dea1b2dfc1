"""The TensorFlow layer: capture a graph into a view, rewrite it from a plan, devices and the
emulated host, measurement and profiles. ``tfprivate`` holds every TensorFlow private API."""
