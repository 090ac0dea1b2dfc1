"""Measurements each in a fresh process: the parent runs ``python -m <module> --child
SPEC`` (SPEC a JSON object) and reads the one ``RESULT`` line the child prints."""
import json
import os
import subprocess
import sys

__all__ = ["report", "run", "write_json", "write_outputs"]

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
