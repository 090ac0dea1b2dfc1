"""The machine, the TensorFlow version and the workers' environment, found without importing
TensorFlow."""
import datetime
import os
import platform

__all__ = ["ROOT", "machine_info", "tensorflow_version", "worker_env", "now"]

#: The project root: the folder holding ``benchmark_lib``, put on the workers' path.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos",
                     "tf-nightly")


def machine_info():
    """CPU count, processor, physical memory, platform and Python of this machine."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    return {"cpu_count": os.cpu_count(), "processor": _processor(), "memory_bytes": memory,
            "platform": platform.platform(), "python": platform.python_version()}


def _processor():
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def tensorflow_version():
    """The installed TensorFlow's version, from its package metadata, or None."""
    import importlib.metadata
    for name in _TF_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def worker_env():
    """The environment of a worker process.

    The project root goes first on ``PYTHONPATH``, TensorFlow's C++ logging is quiet, and
    the CPU allocator is the BFC allocator unless set otherwise: it keeps the memory
    statistics ``ome.measure`` reads. Without it they exist only where TensorFlow turns
    oneDNN on by itself (CPUs with AVX-512 and the like), and every run elsewhere (AVX2-only
    CPUs) would fail for want of statistics.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")
    return env


def now():
    """The current UTC time, to the second, in ISO 8601."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
