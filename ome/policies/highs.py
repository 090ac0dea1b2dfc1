"""Solve the optimal planner's mixed-integer program with HiGHS (``highspy``), from a start.

scipy's ``milp`` runs the same solver but takes no starting solution. The planner knows
plans that fit before it asks (the smallest-peak plan, an earlier round's): given one,
HiGHS begins with an incumbent, so a solve whose limit is near the smallest modelled peak
returns at least that plan instead of spending its node limit finding none (minutes on
ResNet-50). HiGHS's branch and bound is deterministic: the same program, start and node
limit give the same answer on any machine load.
"""
import os
from typing import NamedTuple, Optional

import numpy as np

import highspy

_BANNER_SILENCED = []


class Result(NamedTuple):
    x: Optional[np.ndarray]  # None: no feasible point found
    optimal: bool  # proven within the gap (else stopped by the node or time limit)
    gap: float
    message: str


def solve(objective, integrality, lower, upper, matrix, row_lower, row_upper, *,
          starts=(), options):
    """Minimise ``objective @ x`` with ``lower <= x <= upper``, ``row_lower <= matrix @ x <=
    row_upper``, ``x[i]`` integral where ``integrality[i]``. ``starts``: ``{column: value}``
    of the integer columns of known solutions, best first: HiGHS begins from the first
    that fits. ``options``: HiGHS option values (``mip_rel_gap``, ``mip_max_nodes``,
    ``time_limit``)."""
    matrix = matrix.tocsc()
    lower = np.asarray(lower, dtype=float)
    upper = np.asarray(upper, dtype=float)
    model = _model(objective, integrality, lower, upper, matrix, row_lower, row_upper)
    highs = _silent_highs()
    for name, value in options.items():
        highs.setOptionValue(name, value)
    highs.passModel(model)
    completed = next((c for c in (_completed(objective, lower, upper, matrix, row_lower,
                                             row_upper, start) for start in starts)
                      if c is not None), None)
    if completed is not None:
        # HiGHS's postsolve maps the columns its presolve removed back to the start's
        # values: it reports the optimum found on the reduced program and returns a
        # solution worse than it (the start's), so a started solve skips presolve
        highs.setOptionValue("presolve", "off")
        solution = highspy.HighsSolution()
        solution.col_value = completed
        solution.value_valid = True
        highs.setSolution(solution)
    highs.run()
    status = highs.getModelStatus()
    info = highs.getInfo()
    message = highs.modelStatusToString(status)
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible
        return Result(None, False, float("nan"), message)
    x = np.array(highs.getSolution().col_value)
    return Result(x, status == highspy.HighsModelStatus.kOptimal, float(info.mip_gap), message)


def _completed(objective, lower, upper, matrix, row_lower, row_upper, start):
    """A whole solution for the integer values ``start``: the program's linear part
    solved with them fixed (None where they do not fit). HiGHS is given whole starts:
    from the integer columns alone it has proven a worse start optimal."""
    lower, upper = lower.copy(), upper.copy()
    for column, value in start.items():
        lower[column] = upper[column] = value
    highs = _silent_highs()
    highs.passModel(_model(objective, np.zeros(len(lower)), lower, upper, matrix,
                           row_lower, row_upper))
    highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return list(highs.getSolution().col_value)


def _model(objective, integrality, lower, upper, matrix, row_lower, row_upper):
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = matrix.shape[1], matrix.shape[0]
    lp.col_cost_ = np.asarray(objective, dtype=float)
    lp.col_lower_ = lower
    lp.col_upper_ = upper
    lp.row_lower_ = np.asarray(row_lower, dtype=float)
    lp.row_upper_ = np.asarray(row_upper, dtype=float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = matrix.indptr
    lp.a_matrix_.index_ = matrix.indices
    lp.a_matrix_.value_ = matrix.data
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                       for i in integrality]
    return lp


def _silent_highs():
    """A ``highspy.Highs`` that logs nothing. The first one made in a process prints
    HiGHS's banner on the C stdout before any option can be set: that one is made with
    the stdout descriptor pointed at /dev/null."""
    if _BANNER_SILENCED:
        highs = highspy.Highs()
    else:
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                highs = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _BANNER_SILENCED.append(True)
    highs.setOptionValue("output_flag", False)
    return highs
