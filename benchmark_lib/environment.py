"""The machine, the TensorFlow version and the workers' environment, found without importing
TensorFlow."""
import datetime
import functools
import os
import platform
import shlex
import subprocess
import sys

__all__ = ["ROOT", "machine_info", "tensorflow_version", "worker_env", "now", "command_line",
           "source_commit"]

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


def command_line(argv=None):
    """The command that was run, as a user would type it: ``python benchmark.py --models ...``
    (``argv``: default ``sys.argv``; a module run with ``-m`` is named by its module)."""
    argv = list(sys.argv if argv is None else argv)
    program = argv[0] if argv else "benchmark.py"
    path = os.path.abspath(program)
    if path.startswith(ROOT + os.sep) and not program.endswith("benchmark.py"):
        module = os.path.relpath(path, ROOT)[:-len(".py")].replace(os.sep, ".")
        head = ["python", "-m", module[:-len(".__main__")] if module.endswith(".__main__")
                else module]
    else:
        head = ["python", os.path.basename(program)]
    return shlex.join(head + argv[1:])


@functools.cache
def source_commit():
    """The project's git commit (12 hex digits), with ``+changes`` when tracked files
    differ from it; None outside a git checkout. Read once per process: a run's first
    call, before it measures, names the code it measured, whatever is committed later."""
    def git(*args):
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+changes" if changed else "")
