"""`%vramtrace`: the line magic of `%load_ext vramtrace` (a traced kernel loads it by itself).

    %vramtrace [oom] [--full]   the post-mortem of this kernel's out-of-memory errors (`vramtrace oom`)
    %vramtrace holders          what holds the GPU memory now (the bridge's walk, run in this process)
    %vramtrace report           `vramtrace report` of this kernel's trace
    %vramtrace whatif [ARGS]    `vramtrace whatif` of this kernel's trace (ARGS as the command line's)

Each answer is one object with a text and an HTML form: a terminal (`jupyter console`, IPython) shows the text,
a notebook the HTML. Registering the magic is all the extension does: no thread, no hook, no cost while idle."""

import html
import shlex
from typing import Any, Optional

from . import _holders, _verbs

USAGE = "usage: %vramtrace [oom [--full] | holders | report | whatif [ARGS]]"
VERBS = ("oom", "report", "whatif")
# The fonts a notebook's page is likely to have, monospace as the last word.
MONOSPACE = "ui-monospace,SFMono-Regular,Menlo,Consolas,'DejaVu Sans Mono','Liberation Mono',monospace"


class Shown(object):
    """A verb's text: as it is in a terminal, in a <pre> block in a notebook."""

    def __init__(self, title: str, body: str, error: bool = False) -> None:
        self.title = title
        self.body = body.rstrip("\n")
        self.error = error

    def __repr__(self) -> str:
        return self.body

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.body)

    def _repr_html_(self) -> str:
        style = "color:#b00;" if self.error else ""
        # A monospace font named here: the columns line up only in one, and JupyterLab's and nbconvert's lab
        # styles set `pre` in outputs to the page's own font (`font-family: inherit`).
        return ('<div class="vramtrace" title="%s"><pre style="%sfont-family:%s;white-space:pre-wrap">%s</pre></div>'
                % (html.escape(self.title), style, MONOSPACE, html.escape(self.body)))


def vramtrace(line: str) -> Optional[object]:
    try:
        words = shlex.split(line)
    except ValueError as e:
        return Shown("vramtrace", "%%vramtrace: %s\n%s" % (e, USAGE), error=True)
    verb = words[0] if words else "oom"
    args = words[1:]
    if verb == "holders":
        if args:
            return Shown("vramtrace", "%%vramtrace holders takes no arguments\n%s" % USAGE, error=True)
        return _holders.holders()
    if verb not in VERBS:
        return Shown("vramtrace", "%%vramtrace: no verb %r\n%s" % (verb, USAGE), error=True)
    if verb == "oom" and any(a != "--full" for a in args):
        return Shown("vramtrace", "%%vramtrace oom takes only --full\n%s" % USAGE, error=True)
    if _verbs.trace_path() is None:
        return Shown("vramtrace", "This kernel is not traced: `vramtrace kernel install` makes a kernel that is "
                     "(docs/NOTEBOOKS.md). %vramtrace holders works here too.", error=True)
    try:
        return Shown("vramtrace " + verb, _verbs.text(verb, None, args))
    except _verbs.VramtraceError as e:
        return Shown("vramtrace " + verb, str(e), error=True)


def register(ipython: Any) -> None:
    ipython.register_magic_function(vramtrace, "line", "vramtrace")
