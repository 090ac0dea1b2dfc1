"""Memory sizes: the one parser of sizes ome and its benchmark accept, and their display.

Imports nothing heavy, so the benchmark checks its arguments with it before TensorFlow loads.
"""
import math
import re

from ome import errors

__all__ = ["parse_bytes", "format_bytes"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*")
_HINT = ("give bytes (e.g. 1073741824) or a number with a unit: "
         "KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024)")


def parse_bytes(value, *, what="memory size"):
    """Whole bytes from a number or a string: ``2147483648``, ``"2GiB"``, ``"512 MiB"``,
    ``"1.5GB"``; fractions are rounded down (a string's only with a unit).

    >>> parse_bytes("1.5GB"), parse_bytes("512MiB"), parse_bytes("2048"), parse_bytes(4096)
    (1500000000, 536870912, 2048, 4096)

    Raises :class:`ome.errors.BudgetError` (a ``ValueError``) naming ``what`` and the
    accepted forms when ``value`` is not a positive whole number of bytes.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise errors.BudgetError(f"{what} must be a number of bytes or a string like '2GiB', "
                                 f"got {value!r}")
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        if not match:
            raise errors.BudgetError(f"cannot parse {what} {value!r}; {_HINT}")
        number, unit = match.group(1), match.group(2).lower()
        if unit not in _UNITS:
            raise errors.BudgetError(
                f"unknown unit {match.group(2)!r} in {what} {value!r}; {_HINT}")
        if _UNITS[unit] == 1 and "." in number:
            raise errors.BudgetError(f"{what} {value!r} is a fraction of a byte; {_HINT}")
        value = float(number) * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise errors.BudgetError(f"{what} must be positive, at least one byte, got {value!r}")
    return int(math.floor(value))


def format_bytes(n):
    """``n`` bytes in a unit that shows it (B, KiB, MiB, GiB)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
