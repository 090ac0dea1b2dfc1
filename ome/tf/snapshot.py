"""The values of a step's variables, copied to the host, and put back: a measured step
that refuses its budget after it has run leaves weights and optimizer state as they
were before its first step (:class:`ome.measured_steps.MeasuredSteps`' ``state``)."""
__all__ = ["eager", "in_session"]


def eager(variables):
    """Copy the values of ``variables`` (eager, or mirrored by a ``tf.distribute``
    strategy) to the host; returns ``restore()``, which assigns them back."""
    variables = _unique(variables)
    values = [variable.numpy() for variable in variables]

    def restore():
        for variable, value in zip(variables, values):
            variable.assign(value)
    return restore


def in_session(session, variables):
    """Copy the values of the graph ``variables`` in ``session`` to the host; returns
    ``restore()``, which loads them back through each variable's initializer (no op is
    added to the graph)."""
    variables = _unique(variables)
    values = session.run(variables)

    def restore():
        for variable, value in zip(variables, values):
            variable.load(value, session)
    return restore


def _unique(variables):
    """``variables`` without repeats (a variable can be both a model's and a metric's),
    in their first order."""
    return list({id(variable): variable for variable in variables}.values())
