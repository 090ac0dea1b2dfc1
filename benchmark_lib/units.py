"""Sizes, durations and one-line text: parsing and formatting shared by the benchmark."""
import math
import re

__all__ = ["MiB", "parse_bytes", "format_mib", "format_duration", "format_percent", "one_line",
           "plural"]

MiB = 2**20

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text):
    """Parse a memory size: plain bytes (``"1048576"``) or a number with a unit.

    Decimal units ``KB MB GB TB`` are powers of 1000, binary units ``KiB MiB GiB TiB`` powers
    of 1024 (case-insensitive). Fractions need a unit and are rounded down to whole bytes.

    >>> parse_bytes("1.5GB"), parse_bytes("512MiB"), parse_bytes("2048")
    (1500000000, 536870912, 2048)

    Raises ``ValueError`` naming the accepted forms when ``text`` is not a positive size.
    """
    match = _BYTES_RE.match(str(text))
    hint = ("give bytes (e.g. 1073741824) or a number with a unit: "
            "KB, MB, GB, TB, KiB, MiB, GiB, TiB")
    if not match:
        raise ValueError(f"cannot parse memory size {text!r}; {hint}")
    number, unit = match.groups()
    unit = unit.lower()
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {match.group(2)!r} in {text!r}; {hint}")
    if unit in ("", "b") and "." in number:
        raise ValueError(f"{text!r} is a fraction of a byte; {hint}")
    value = math.floor(float(number) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"memory size {text!r} must be positive")
    return int(value)


def format_mib(nbytes, digits=1):
    """``nbytes`` as MiB with ``digits`` decimals, or an em dash when unknown."""
    if nbytes is None:
        return "—"
    return f"{nbytes / MiB:.{digits}f}"


def format_duration(seconds):
    """A short ``1h02m``/``3m05s``/``12s`` rendering of a duration in seconds."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def format_percent(fraction):
    """``0.034`` as ``3%``, or an em dash when unknown."""
    return "—" if fraction is None else f"{100 * fraction:.0f}%"


def one_line(text, limit=300):
    """``text`` with its whitespace (newlines included) collapsed, cut to ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def plural(count, word, words=None):
    """``1 run``, ``3 runs``; ``words`` for an irregular plural (``1 batch``/``2 batches``)."""
    return f"{count} {word if count == 1 else words or word + 's'}"
