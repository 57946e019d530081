"""The bridge's own tests: standard library only, no torch, no shim (those are in tests/e2e/tests/bridge.rs).
Run: python3 -m unittest discover -s bridge/tests"""

import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import unittest

BRIDGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BRIDGE)

from vramtrace_bridge import _hook, _oom, _settings, _shim  # noqa: E402


def run_python(code, pythonpath, extra_env=None, args=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTRACE")}
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    env.update(extra_env or {})
    return subprocess.run([sys.executable] + list(args) + ["-c", code], env=env, capture_output=True, text=True,
                          timeout=60)


class PostImportHook(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        sys.path.insert(0, self.dir)

    def tearDown(self):
        sys.path.remove(self.dir)

    def module(self, name, body="X = 1\n"):
        with open(os.path.join(self.dir, name + ".py"), "w") as f:
            f.write(body)

    def test_runs_once_after_the_import_and_restores_the_loader(self):
        self.module("vt_probe_a", "X = 41\n")
        seen = []
        _hook.when_imported("vt_probe_a", lambda m: seen.append(m.X + 1))
        self.assertEqual(seen, [])
        import vt_probe_a  # noqa: F401

        self.assertEqual(seen, [42])
        self.assertNotIsInstance(vt_probe_a.__loader__, _hook._Loader)
        self.assertNotIsInstance(vt_probe_a.__spec__.loader, _hook._Loader)
        import importlib

        importlib.reload(vt_probe_a)
        self.assertEqual(seen, [42])
        self.assertNotIn("vt_probe_a", _hook._watched)

    def test_already_imported_runs_at_once_and_a_failing_callback_never_raises(self):
        self.module("vt_probe_b")
        import vt_probe_b  # noqa: F401

        seen = []
        _hook.when_imported("vt_probe_b", lambda m: seen.append(m.__name__))
        self.assertEqual(seen, ["vt_probe_b"])
        self.module("vt_probe_c")

        def boom(m):
            raise RuntimeError("callback failed")

        _hook.when_imported("vt_probe_c", boom)
        import vt_probe_c  # noqa: F401  (no exception reaches the importer)

        self.assertEqual(vt_probe_c.X, 1)

    def test_an_import_from_a_thread_is_seen(self):
        self.module("vt_probe_d")
        seen = []
        _hook.when_imported("vt_probe_d", lambda m: seen.append(threading.current_thread().name))
        t = threading.Thread(target=lambda: __import__("vt_probe_d"), name="importer")
        t.start()
        t.join()
        self.assertEqual(seen, ["importer"])

    def test_a_failing_import_still_fails_the_same_way(self):
        self.module("vt_probe_e", "raise ValueError('broken module')\n")
        seen = []
        _hook.when_imported("vt_probe_e", lambda m: seen.append(m))
        with self.assertRaises(ValueError):
            import vt_probe_e  # noqa: F401
        self.assertEqual(seen, [])


class WithoutTheShim(unittest.TestCase):
    def test_calls_are_no_ops(self):
        if _shim.available():
            self.skipTest("the shim is preloaded here")
        self.assertEqual(_shim.sample(_shim.TORCH, 0, (1, 2, 3, 4, 5, 6, 7)), _shim.NOT_RECORDING)
        self.assertEqual(_shim.record("note", None, [("text", "x")]), _shim.NOT_RECORDING)


class SegmentFigures(unittest.TestCase):
    def test_largest_free_block_and_free_bytes_held_by_live_segments(self):
        def block(size, state):
            return {"size": size, "state": state}

        snap = {
            "segments": [
                # A segment with live tensors: its free blocks cannot go back to the driver.
                {"device": 0, "blocks": [block(4, "active_allocated"), block(3, "inactive"), block(2, "inactive")]},
                # A wholly free segment: releasable, but still a free block.
                {"device": 0, "blocks": [block(5, "inactive")]},
                {"device": 1, "blocks": [block(100, "inactive"), block(1, "active_allocated")]},
                {"device": 0, "is_expandable": True, "blocks": [block(1, "active_pending_free"), block(1, "inactive")]},
            ]
        }
        segments, largest, stuck, expandable = _oom.segment_figures(snap, 0)
        self.assertEqual((segments, largest, stuck, expandable), (3, 5, 3 + 2 + 1, True))
        self.assertEqual(_oom.segment_figures(snap, 1)[:3], (1, 100, 100))
        self.assertEqual(_oom.segment_figures({}, 0), (0, 0, 0, False))

    def test_allocator_settings_are_read_from_the_environment(self):
        old = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True, max_split_size_mb:128"
        try:
            self.assertEqual(_settings.conf_value("expandable_segments"), "True")
            self.assertEqual(_settings.conf_value("max_split_size_mb"), "128")
            self.assertIsNone(_settings.conf_value("garbage_collection_threshold"))
        finally:
            if old is None:
                del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
            else:
                os.environ["PYTORCH_CUDA_ALLOC_CONF"] = old


class Layout(unittest.TestCase):
    """The package's modules, one a concern: each says what it is for, they import one another downwards only, and
    none takes another's state into a name of its own (a rebinding there, a fork's reset or a test's fresh dict,
    would not be seen through it)."""

    PACKAGE = os.path.join(BRIDGE, "vramtrace_bridge")

    def modules(self):
        import ast

        out = {}
        for n in sorted(os.listdir(self.PACKAGE)):
            if n.endswith(".py"):
                with open(os.path.join(self.PACKAGE, n)) as f:
                    out[n[:-3]] = ast.parse(f.read())
        return out

    @staticmethod
    def imports(tree):
        """(module, names) of each `from . import m` and `from .m import names` at the module's top level."""
        import ast

        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module is None:
                    for a in node.names:
                        yield a.name, None
                else:
                    yield node.module, [a.name for a in node.names]

    def test_each_module_says_what_it_is_for(self):
        import ast

        for name, tree in self.modules().items():
            self.assertTrue(ast.get_docstring(tree), name)

    def test_no_import_cycle(self):
        mods = self.modules()
        deps = {m: {d for d, _ in self.imports(t) if d in mods} for m, t in mods.items()}
        done, path = set(), []

        def visit(m):
            if m in path:
                self.fail("an import cycle: %s" % " -> ".join(path[path.index(m):] + [m]))
            if m in done:
                return
            path.append(m)
            for d in sorted(deps[m]):
                visit(d)
            path.pop()
            done.add(m)

        for m in sorted(mods):
            visit(m)
        self.assertIn("_state", deps["_sampler"])  # the check sees the package's own imports

    def test_no_module_takes_another_modules_state_into_a_name_of_its_own(self):
        import ast

        mods = self.modules()
        for m, tree in mods.items():
            for src, names in self.imports(tree):
                if names is None or src not in mods:
                    continue
                defined = {n.name for n in mods[src].body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
                rebound = {g for n in ast.walk(mods[src]) if isinstance(n, ast.Global) for g in n.names}
                for name in names:
                    ok = name in defined or (name.isupper() and name not in rebound)
                    self.assertTrue(ok, "%s: from .%s import %s (use %s.%s)" % (m, src, name, src, name))


class Injection(unittest.TestCase):
    """sitecustomize.py as `vramtrace run` puts it first on PYTHONPATH, in real Python processes."""

    PROBE = "import sys, json; print(json.dumps([sys.path, 'vramtrace_bridge' in sys.modules, " \
            "getattr(sys.modules.get('sitecustomize'), 'MARK', None)]))"

    def setUp(self):
        self.user = tempfile.mkdtemp()

    def probe(self, pythonpath, **kw):
        r = run_python(self.PROBE, pythonpath, **kw)
        self.assertEqual(r.returncode, 0, r.stderr)
        import json

        return json.loads(r.stdout.strip().splitlines()[-1]), r

    def test_sys_path_is_as_without_the_bridge_and_the_users_sitecustomize_runs(self):
        with open(os.path.join(self.user, "sitecustomize.py"), "w") as f:
            f.write("MARK = 'theirs'\nimport os\nos.environ['USER_SITE_RAN'] = '1'\n")
        (path0, _, mark0), _ = self.probe(self.user)
        (path1, loaded, mark1), r = self.probe(BRIDGE + os.pathsep + self.user)
        self.assertEqual(path1, path0)
        self.assertTrue(loaded)
        self.assertEqual((mark0, mark1), ("theirs", "theirs"))
        self.assertEqual(r.stderr, "")

    def test_empty_and_unset_pythonpath(self):
        (p_unset, _, _), _ = self.probe(None)
        (p_bridge, loaded, mark), r = self.probe(BRIDGE)
        self.assertEqual(p_bridge, p_unset)
        self.assertTrue(loaded)
        self.assertEqual(r.stderr, "")
        (p_empty, _, _), _ = self.probe("")
        self.assertEqual(p_empty, p_unset)

    def test_a_failing_user_sitecustomize_fails_as_it_would_have(self):
        with open(os.path.join(self.user, "sitecustomize.py"), "w") as f:
            f.write("raise RuntimeError('user site broke')\n")
        r0 = run_python("print('ran')", self.user)
        r1 = run_python("print('ran')", BRIDGE + os.pathsep + self.user)
        self.assertEqual((r0.returncode, r0.stdout), (r1.returncode, r1.stdout))
        self.assertIn("user site broke", r0.stderr)
        self.assertEqual(r0.stderr, r1.stderr)

    def test_exit_codes_and_output_are_unchanged(self):
        for code in ("import sys; sys.exit(7)", "import os; os._exit(9)", "raise SystemExit('bye')"):
            r0 = run_python(code, None)
            r1 = run_python(code, BRIDGE)
            self.assertEqual((r0.returncode, r0.stdout, r0.stderr), (r1.returncode, r1.stdout, r1.stderr), code)

    def test_off_and_isolated_modes_leave_python_alone(self):
        (_, loaded, _), _ = self.probe(BRIDGE, extra_env={"VRAMTRACE_PYTHON_AGENT": "off"})
        self.assertFalse(loaded)
        (_, loaded, _), _ = self.probe(BRIDGE, args=("-I",))
        self.assertFalse(loaded)
        (_, loaded, _), _ = self.probe(BRIDGE, args=("-E",))
        self.assertFalse(loaded)

    def test_the_program_never_sees_the_bridges_marker_in_os_environ(self):
        r = run_python("import os; print('VRAMTRACE_BRIDGE_PID' in os.environ)", BRIDGE)
        self.assertEqual(r.stdout.strip(), "False")
        # ...but a child process gets it, with the parent's pid until its own bridge replaces it.
        code = textwrap.dedent("""
            import os, subprocess, sys
            out = subprocess.run(['sh', '-c', 'echo $VRAMTRACE_BRIDGE_PID'], capture_output=True, text=True)
            print(out.stdout.strip() == str(os.getpid()))
        """)
        r = run_python(code, BRIDGE)
        self.assertEqual(r.stdout.strip(), "True", r.stderr)


if __name__ == "__main__":
    unittest.main()
