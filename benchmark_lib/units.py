"""Sizes, durations and one-line text: formatting shared by the benchmark (sizes are parsed
by :func:`ome.core.sizes.parse_bytes`, the parser ome itself uses)."""
import re

__all__ = ["MiB", "format_mib", "format_duration", "format_percent", "one_line", "plural"]

MiB = 2**20


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
