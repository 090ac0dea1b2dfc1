"""Measurements each in a fresh process: the parent runs ``python -m <module> --child
SPEC`` (SPEC a JSON object) and reads the one ``RESULT`` line the child prints."""
import json
import os
import subprocess
import sys

__all__ = ["measured_on", "report", "run", "write_json", "write_outputs"]

_PREFIX = "RESULT "


def report(result):
    """Print ``result`` (JSON-able) as the child's ``RESULT`` line."""
    print(_PREFIX + json.dumps(result), flush=True)


def run(module, spec):
    """``python -m module --child json(spec)``'s result, or ``{"error": its last line of
    stderr}`` when it printed none."""
    done = subprocess.run([sys.executable, "-m", module, "--child", json.dumps(spec)],
                          capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith(_PREFIX):
            return json.loads(line[len(_PREFIX):])
    last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
    return {"error": last[0][:300]}


def write_json(out, stem, doc):
    """Write ``doc`` to ``out/stem.json`` (``out`` made if missing)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)


def write_outputs(out, stem, doc, text):
    """Write ``doc`` to ``out/stem.json`` and the markdown ``text`` to ``out/stem.md``
    (``out`` made if missing), and print ``text``: what each fresh-process measurement
    leaves behind."""
    write_json(out, stem, doc)
    with open(os.path.join(out, f"{stem}.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


def measured_on(doc):
    """When and on what the runs of ``doc`` (with ``date``, ``machine`` and
    ``load_average``) were measured: ``<date> on <n> cores (<cpu>), <memory> GiB, Python
    <version>; 1-minute load average <before> before, <after> after.``"""
    info, load = doc["machine"], doc["load_average"]
    return (f"{doc['date']} on {info.get('cpu_count')} cores ({info.get('processor')}), "
            f"{(info.get('memory_bytes') or 0) / 2**30:.1f} GiB, Python {info.get('python')}; "
            f"1-minute load average {load['before'][0]:.2f} before, {load['after'][0]:.2f} after.")
