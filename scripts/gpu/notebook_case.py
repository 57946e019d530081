"""Issue 52 on a real GPU: a notebook run through the traced kernel (scripts/gpu/notebook.sh installs the kernel and
runs this with a Python that has nbclient and nbformat).

    python notebook_case.py KERNEL_NAME OUT.ipynb

Builds a notebook as a user would write it, executes it with nbclient on the kernel KERNEL_NAME (as `jupyter
nbconvert --execute` and papermill do), errors allowed (the failed cell stays failed: nothing in it is caught), and
writes the executed notebook to OUT.ipynb. The cells:
    1. import torch, a model on the GPU (two Linear(4096, 4096), fp32: 128 MiB of weights)
    2. a loop that keeps every step's output (8192 x 4096 fp32, 128 MiB) in the global list `activations` until
       PyTorch raises torch.cuda.OutOfMemoryError under the kernel's cap
    3. what the program itself says it keeps (len(activations), their bytes)
    4. `%vramtrace holders`   5. `%vramtrace` (the post-mortem)   6. `%vramtrace report`
Then checks, from the executed cells: cell 2 failed with OutOfMemoryError; the holders' text has a row for
`activations (list, global of __main__)` with the tensors and bytes cell 3 printed; the post-mortem names
`activations`. Prints `CHECK name ok|FAIL detail` lines and one `NOTEBOOK {json}` line last."""

import json
import os
import re
import sys
import time

import nbformat
from nbclient import NotebookClient

CELLS = [
    "import torch\n"
    "model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096)).cuda()\n"
    "print(torch.__version__, torch.cuda.get_device_name(), f'{torch.cuda.memory_allocated() / 2**20:.0f} MiB')",
    "activations = []\n"
    "batch = torch.randn(8192, 4096, device='cuda')\n"
    "with torch.no_grad():\n"
    "    while True:\n"
    "        activations.append(model(batch))  # 128 MiB kept every step",
    "print(len(activations), 'tensors,', sum(t.untyped_storage().nbytes() for t in activations), 'bytes')",
    "%vramtrace holders",
    "%vramtrace",
    "%vramtrace report",
]

# NB_FAKE=1: the plumbing alone, on the simulated driver with the bridge's stand-in torch (bridge/tests/faketorch;
# the driver set up as tests/e2e/tests/kernel.rs sets it up): 1 GiB tensors, no model.
if os.environ.get("NB_FAKE") == "1":
    CELLS[:2] = ["import torch\nprint(torch.__version__)",
                 "activations = []\nwhile True:\n    activations.append(torch.empty_cuda(1 << 30))"]

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def text_of(cell):
    """A cell's outputs as text: streams, results' text/plain, errors' name and value."""
    parts = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            parts.append(o["text"])
        elif o["output_type"] in ("execute_result", "display_data"):
            parts.append(o["data"].get("text/plain", ""))
        elif o["output_type"] == "error":
            parts.append("%s: %s" % (o["ename"], o["evalue"]))
    return "".join(parts)


def main():
    name, out = sys.argv[1], sys.argv[2]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(
        "# A notebook that runs out of GPU memory\n"
        "Run on the kernel `%s` (`vramtrace kernel install --cap 8GiB`): a list of activations kept in a "
        "global until the cap refuses, then what holds the memory, the post-mortem and the report." % name)]
    nb.cells += [nbformat.v4.new_code_cell(c) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": name, "display_name": name, "language": "python"}
    t0 = time.monotonic()
    client = NotebookClient(nb, kernel_name=name, timeout=300, allow_errors=True, startup_timeout=120)
    client.execute()
    took = time.monotonic() - t0
    nbformat.write(nb, out)
    code = [c for c in nb.cells if c.cell_type == "code"]
    res = {"seconds": round(took, 1), "cells": [text_of(c) for c in code]}
    checks = []

    def check(what, ok, detail=""):
        checks.append((what, bool(ok), detail))
        print("CHECK %s %s %s" % (what, "ok" if ok else "FAIL", detail), flush=True)

    errs = [o for o in code[1].get("outputs", []) if o["output_type"] == "error"]
    check("cell2_oom", errs and errs[0]["ename"] == "OutOfMemoryError",
          errs[0]["ename"] + ": " + errs[0]["evalue"][:200] if errs else "no error")
    m = re.match(r"(\d+) tensors, (\d+) bytes", text_of(code[2]))
    n, nbytes = (int(m.group(1)), int(m.group(2))) if m else (None, None)
    check("program_says", m, text_of(code[2]).strip())
    holders = text_of(code[3])
    row = next((l for l in holders.splitlines() if l.startswith("activations (list, global of __main__)")), None)
    detail = row or holders[:300]
    ok = False
    if row and n:
        w = row.split()
        # NAME ... BYTES UNIT TENSORS KIND
        try:
            size = float(w[-4]) * UNITS[w[-3]]
            ok = w[-1] == "variable" and int(w[-2]) == n and abs(size - nbytes) <= 0.01 * UNITS[w[-3]]
            res["holders_row"] = {"bytes_shown": w[-4] + " " + w[-3], "tensors": int(w[-2]), "kind": w[-1],
                                  "program_tensors": n, "program_bytes": nbytes}
        except (ValueError, KeyError, IndexError) as e:
            detail += " (%s)" % e
    check("holders_names_activations", ok, detail)
    pm = text_of(code[4])
    check("postmortem_names_activations", "activations" in pm, pm.splitlines()[0] if pm else "empty")
    rep = text_of(code[5])
    check("report_answers", rep.strip() != "", rep.splitlines()[0] if rep else "")
    res["checks"] = [{"what": w, "ok": o, "detail": d} for w, o, d in checks]
    print("NOTEBOOK " + json.dumps(res), flush=True)
    sys.exit(0 if all(o for _, o, _ in checks) else 1)


if __name__ == "__main__":
    main()
