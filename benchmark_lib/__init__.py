"""Pure helpers behind ``benchmark.py``: units, result files, plots and the batch bisection.

Nothing here imports TensorFlow, so the helpers are unit-tested without a session.
"""
import math
import re

__all__ = ["parse_bytes", "format_mib", "format_duration", "one_line", "progress_bar",
           "run_weight", "count_of", "device_peaks", "machine_info"]

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
    return f"{nbytes / 2**20:.{digits}f}"


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


def one_line(text, limit=300):
    """``text`` with its whitespace (newlines included) collapsed, cut to ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def progress_bar(done, total, width=20):
    """``[#####...............] 5/20``."""
    filled = int(width * done / total) if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def run_weight(model, batch, image):
    """Rough relative cost of one run, for the ETA (units of about 0.2 s on 2 cores).

    A fixed part (process start, TensorFlow import) plus a part growing with depth (graph
    building, Grappler) and with compute (batch x pixels); fitted to a quick sweep on two
    cores, where a run took about 5 s + 0.22 s per layer. Inception-v4 counts as depth 60.
    """
    match = re.match(r"^resnet(\d+)$", model)
    depth = int(match.group(1)) if match else 60
    return 25 + depth * (1.0 + 10 * batch * image * image / (32 * 224 * 224))


def count_of(value):
    """A count from a strategy's ``info`` entry: an int, or the length of a collection."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return len(value)
    except TypeError:
        return None


def device_peaks(per_device, *, max_mem):
    """``(device_peak, host_peak)`` in bytes from a measurement.

    ``per_device`` maps device names to objects with ``.peak``: the most bytes a traced step
    allocated on that device on top of what was already there. With a GPU, the accelerator
    has its own allocator: ``device_peak`` is ``max_mem`` and the host is CPU:0. In host
    emulation the accelerator (CPU:0) and host (CPU:1) share one allocator whose peak is
    ``max_mem``, so ``device_peak`` is ``max_mem`` minus the host's traced peak. It is exact
    when nothing goes to the host. With swapping it is a lower bound: the accelerator's true
    peak lies between it and ``max_mem``, and equals it when the host copies are all live at
    the allocator's peak (swapped out in the forward pass, brought back in the backward one).

    The accelerator's own traced peak is not used: its allocation records miss deallocations
    on rewritten graphs (tens of MiB still "live" at the end of a step whose resident memory
    did not grow), so it overstates.
    """
    peaks = {}
    for name, stats in (per_device or {}).items():
        for dev in ("GPU:0", "CPU:0", "CPU:1"):
            if str(name).upper().endswith(dev):
                peaks[dev] = getattr(stats, "peak", None)
    if "GPU:0" in peaks:
        return max_mem, peaks.get("CPU:0")
    host = peaks.get("CPU:1")
    return max_mem - (host or 0), host


def machine_info():
    """CPU count, physical memory and platform of this machine."""
    import os
    import platform
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    return {"cpu_count": os.cpu_count(), "memory_bytes": memory, "platform": platform.platform(),
            "python": platform.python_version(), "processor": platform.processor() or None}
