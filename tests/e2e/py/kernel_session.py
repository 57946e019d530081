"""Starts the Jupyter kernel named argv[1] from its installed spec (jupyter_client, as JupyterLab does),
executes the cells of the JSON list argv[2] in order (a cell that starts with `# interrupt` is interrupted
after a second, as JupyterLab's stop button does), shuts the kernel down, and prints one JSON list: per cell,
its status, error name and outputs (streams' text, results' and displays' mime bundles)."""
import json
import sys
import time

from jupyter_client.manager import start_new_kernel

TIMEOUT = 60


def run(km, kc, code):
    msg_id = kc.execute(code)
    if code.startswith("# interrupt"):
        time.sleep(1)
        km.interrupt_kernel()
    cell = {"status": None, "ename": None, "outputs": []}
    while True:
        msg = kc.get_iopub_msg(timeout=TIMEOUT)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            cell["outputs"].append({"type": "stream", "name": content["name"], "text": content["text"]})
        elif kind in ("execute_result", "display_data"):
            cell["outputs"].append({"type": kind, "data": content["data"]})
        elif kind == "error":
            cell["ename"] = content["ename"]
            cell["outputs"].append({"type": "error", "ename": content["ename"], "evalue": content["evalue"]})
        elif kind == "status" and content["execution_state"] == "idle":
            break
    cell["status"] = kc.get_shell_msg(timeout=TIMEOUT)["content"]["status"]
    return cell


def main():
    name, cells = sys.argv[1], json.loads(sys.argv[2])
    km, kc = start_new_kernel(kernel_name=name, startup_timeout=TIMEOUT)
    try:
        out = [run(km, kc, c) for c in cells]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    print(json.dumps(out))


main()
