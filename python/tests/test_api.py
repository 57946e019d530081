"""The `vramtrace` Python package (python/vramtrace): holders() against the stand-in torch, the verbs through a
stand-in binary, the `%vramtrace` magic's answers, and what ships with it. Standard library only.
Run: python3 -m unittest discover -s python/tests"""

import gc
import os
import re
import stat
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bridge", "tests", "faketorch"))
os.environ.setdefault("FAKETORCH_TOTAL", str(8 << 30))  # the stand-in's host driver: no CUDA library needed

import vramtrace  # noqa: E402
from vramtrace import _magic  # noqa: E402

GIB = 1 << 30


def stand_in_binary(d, body):
    """A `vramtrace` that runs `body` (sh), named by VRAMTRACE_BIN as a traced kernel names its own."""
    p = os.path.join(d, "vramtrace")
    with open(p, "w") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(p, 0o755)
    return p


class Env(object):
    def __init__(self, **kw):
        self.kw = kw

    def __enter__(self):
        self.old = {k: os.environ.get(k) for k in self.kw}
        for k, v in self.kw.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def __exit__(self, *a):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Holders(unittest.TestCase):
    def tearDown(self):
        globals().pop("kept", None)
        gc.collect()

    def test_without_torch_imported_nothing_holds_memory(self):
        saved = sys.modules.pop("torch", None)
        try:
            h = vramtrace.holders()
        finally:
            if saved is not None:
                sys.modules["torch"] = saved
        self.assertEqual((h.holders, h.tensors), ([], 0))

    def test_a_global_is_named_with_its_bytes_and_the_cache_as_a_holder(self):
        import torch

        torch.cuda._reset()
        torch.cuda.init()
        globals()["kept"] = [torch.empty_cuda(GIB) for _ in range(2)]
        spare = torch.empty_cuda(GIB)
        del spare  # freed into the cache: reserved, not allocated
        h = vramtrace.holders()
        self.assertIsInstance(h, vramtrace.Holders)
        kept = [x for x in h if x.name == "kept"]
        self.assertEqual(kept, [vramtrace.Holder(kind="variable", name="kept", scope="global of %s" % __name__,
                                                 what="list", tensors=2, bytes=2 * GIB)])
        cache = [x for x in h if x.kind == "cache"]
        self.assertEqual([c.bytes for c in cache], [GIB])
        self.assertEqual(h.tensor_bytes, 2 * GIB)
        self.assertIsNone(h.partial)
        text = str(h)
        self.assertTrue(text.startswith("2 CUDA tensors, 2.00 GiB, held by:"), text)
        self.assertRegex(text, r"kept \(list, global of %s\)\s+2\.00 GiB\s+2\s+variable" % re.escape(__name__))

    def test_the_html_table_escapes_what_the_program_named(self):
        h = vramtrace.Holders(holders=[vramtrace.Holder("variable", "<b>x</b>", "global of __main__", "list", 1, 5)],
                              tensors=1, tensor_bytes=5)
        page = h._repr_html_()
        self.assertIn("&lt;b&gt;x&lt;/b&gt;", page)
        self.assertNotIn("<b>x", page)
        self.assertIn("<td style=\"text-align:right\">5 B</td>", page)


class Verbs(unittest.TestCase):
    def test_trace_path_is_none_outside_a_traced_process(self):
        with Env(VRAMTRACE_TRACE=None):
            self.assertIsNone(vramtrace.trace_path())
            with self.assertRaises(vramtrace.VramtraceError) as e:
                vramtrace.report()
            self.assertIn("not traced", str(e.exception))
        with Env(VRAMTRACE_TRACE="/t/x.vtrace"):
            self.assertEqual(str(vramtrace.trace_path()), "/t/x.vtrace")

    def test_the_verbs_json_comes_back_as_a_dict_and_a_refusal_as_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            args = os.path.join(d, "args")
            exe = stand_in_binary(d, 'echo "$@" > %s\n[ "$2" = bad ] && { echo "vramtrace: bad trace" >&2; '
                                     'exit 2; }\necho \'{"oom_records": 1}\'' % args)
            with Env(VRAMTRACE_BIN=exe, VRAMTRACE_TRACE=os.path.join(d, "k.vtrace")):
                self.assertEqual(vramtrace.binary(), exe)
                self.assertEqual(vramtrace.oom(), {"oom_records": 1})
                with open(args) as f:
                    self.assertEqual(f.read().split(), ["oom", os.path.join(d, "k.vtrace"), "--json"])
                self.assertEqual(vramtrace.whatif("/x.vtrace", cap="4GiB"), {"oom_records": 1})
                with open(args) as f:
                    self.assertEqual(f.read().split(), ["whatif", "/x.vtrace", "--json", "--cap", "4GiB"])
                with self.assertRaises(vramtrace.VramtraceError) as e:
                    vramtrace.report("bad")
                self.assertEqual((str(e.exception), e.exception.code), ("vramtrace: bad trace", 2))


class Magic(unittest.TestCase):
    def test_the_post_mortem_is_text_in_a_terminal_and_escaped_html_in_a_notebook(self):
        with tempfile.TemporaryDirectory() as d:
            exe = stand_in_binary(d, 'echo "OUT OF MEMORY at <module> & more"')
            with Env(VRAMTRACE_BIN=exe, VRAMTRACE_TRACE=os.path.join(d, "k.vtrace")):
                shown = _magic.vramtrace("")
        self.assertEqual(repr(shown), "OUT OF MEMORY at <module> & more")
        self.assertIn("<pre", shown._repr_html_())
        # Its columns line up only in a monospace font, which notebook styles do not give a `pre` by themselves.
        self.assertIn("font-family:ui-monospace", shown._repr_html_())
        self.assertIn("OUT OF MEMORY at &lt;module&gt; &amp; more", shown._repr_html_())
        self.assertFalse(shown.error)

    def test_an_untraced_kernel_and_a_bad_verb_say_so(self):
        with Env(VRAMTRACE_TRACE=None):
            shown = _magic.vramtrace("oom")
        self.assertTrue(shown.error)
        self.assertIn("not traced", repr(shown))
        for line in ("frobnicate", "holders --all", "oom --json", "oom 'unclosed"):
            shown = _magic.vramtrace(line)
            self.assertTrue(shown.error, line)
            self.assertIn(_magic.USAGE, repr(shown), line)

    def test_loading_the_extension_registers_one_magic_and_starts_nothing(self):
        class Shell(object):
            def __init__(self):
                self.magics = []

            def register_magic_function(self, fn, kind, name):
                self.magics.append((kind, name))

        threads = threading.active_count()
        hooks = (sys.gettrace(), sys.getprofile(), list(sys.meta_path), list(sys.path_hooks))
        shell = Shell()
        vramtrace.load_ipython_extension(shell)
        self.assertEqual(shell.magics, [("line", "vramtrace")])
        self.assertEqual(threading.active_count(), threads)
        self.assertEqual((sys.gettrace(), sys.getprofile(), list(sys.meta_path), list(sys.path_hooks)), hooks)


class Package(unittest.TestCase):
    def test_the_version_is_the_binarys(self):
        with open(os.path.join(ROOT, "Cargo.toml")) as f:
            cargo = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
        self.assertEqual(vramtrace.__version__, cargo)

    def test_the_wheel_carries_every_module_of_the_bridge(self):
        # python/vramtrace_bridge holds links to bridge/vramtrace_bridge (maturin follows file links, not a
        # folder's): a module added to the bridge needs its link, or `vramtrace.holders()` breaks when untraced.
        src = os.path.join(ROOT, "bridge", "vramtrace_bridge")
        links = os.path.join(ROOT, "python", "vramtrace_bridge")
        want = sorted(n for n in os.listdir(src) if n.endswith(".py"))
        self.assertEqual(sorted(n for n in os.listdir(links) if n.endswith(".py")), want)
        for n in want:
            p = os.path.join(links, n)
            self.assertTrue(stat.S_ISLNK(os.lstat(p).st_mode), n)
            self.assertEqual(os.path.realpath(p), os.path.realpath(os.path.join(src, n)))

    def test_the_package_is_typed(self):
        self.assertTrue(os.path.isfile(os.path.join(ROOT, "python", "vramtrace", "py.typed")))


if __name__ == "__main__":
    unittest.main()
