"""What holds the CUDA tensors (vramtrace_bridge/_holders.py), against the stand-in torch's tensors, modules,
optimizers and autograd nodes (bridge/tests/faketorch/torch/_tensor.py), in this process and in a program of its
own; and the `holders` records the bridge sends. Run: python3 -m unittest discover -s bridge/tests"""

import gc
import json
import os
import subprocess
import sys
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BRIDGE = os.path.dirname(HERE)
FAKETORCH = os.path.join(HERE, "faketorch")
sys.path.insert(0, BRIDGE)
sys.path.insert(0, FAKETORCH)
sys.path.insert(0, HERE)

import torch  # noqa: E402  (the stand-in)
from torch._tensor import AccumulateGrad, AddBackward0, CatBackward0, MulBackward0, Parameter, Tensor  # noqa: E402
from test_history import GIB, MIB, WithTorch, check_schema  # noqa: E402
from vramtrace_bridge import _exit, _holders, _state, _steps, _walks  # noqa: E402

SCOPE = "global of %s" % __name__


def walk(**kw):
    return _holders.walk(torch, kw.pop("deadline_s", 10.0), **kw)


def named(result, name, kind=None):
    hs = [h for h in result["holders"] if h["name"] == name and (kind is None or h["kind"] == kind)]
    return hs[0] if len(hs) == 1 else hs


class Trainer(object):
    def __init__(self):
        self.outputs = [Tensor(3000 + i) for i in range(4)]


class Slotted(object):
    __slots__ = ("kept",)


class Net(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.w = Parameter(2048)
        self.head = Head()
        self.register_buffer("mask", Tensor(512))


class Head(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.w = Parameter(1024)


class Walk(unittest.TestCase):
    def setUp(self):
        gc.collect()
        self.globals = []

    def tearDown(self):
        for name in self.globals:
            globals().pop(name, None)
        gc.collect()

    def set_global(self, name, value):
        globals()[name] = value
        self.globals.append(name)

    def test_a_global_list_is_named_with_its_module_and_counted_exactly(self):
        self.set_global("kept", [Tensor(1000 + i) for i in range(57)])
        r = walk()
        self.assertEqual(named(r, "kept"), {"kind": "variable", "name": "kept", "scope": SCOPE, "what": "list",
                                            "tensors": 57, "bytes": sum(1000 + i for i in range(57))})
        self.assertGreaterEqual(r["tensors"], 57)
        self.assertIsNone(r["partial"])
        self.assertGreater(r["objects"], 1000)

    def test_a_local_is_named_with_its_function_and_line(self):
        losses = [Tensor(7777), Tensor(1)]
        r = walk(); line = sys._getframe().f_lineno  # noqa: E702  (the line the frame is at during the walk)
        h = named(r, "losses")
        self.assertEqual((h["kind"], h["what"], h["tensors"], h["bytes"]), ("variable", "list", 2, 7778))
        self.assertEqual(h["scope"], "local of test_a_local_is_named_with_its_function_and_line() at "
                                     "test_holders.py:%d" % line)
        del losses

    def test_the_walk_keeps_nothing_alive_after_it(self):
        """A tensor the program lets go of after a walk is freed at once, not at the next cyclic collection: a
        program that catches its out-of-memory error and frees its tensors (a serving loop; cuDNN trying its next
        algorithm) would otherwise fail again. The walk's listing of the running frames held its own frame."""
        import weakref

        def step():
            out = Tensor(4096)
            kept = weakref.ref(out)
            walk()
            del out
            return kept

        gc.disable()
        try:
            self.assertIsNone(step()())
        finally:
            gc.enable()

    def test_locals_the_last_errors_traceback_keeps_are_named(self):
        """A notebook's failed cell: the failing function ended, its traceback (sys.last_traceback) keeps its
        frame, and so its tensors, alive; they are named by the local that holds them, and why it is kept."""

        def fill():
            batch = Tensor(6000)  # noqa: F841  (held by the frame the traceback keeps)
            raise RuntimeError("CUDA out of memory")

        try:
            fill()
        except RuntimeError as e:
            sys.last_traceback = e.__traceback__
        try:
            h = named(walk(), "batch")
            self.assertEqual((h["kind"], h["tensors"], h["bytes"]), ("variable", 1, 6000))
            self.assertTrue(h["scope"].startswith("local of fill() at test_holders.py:"), h["scope"])
            self.assertTrue(h["scope"].endswith("(kept by the last error's traceback)"), h["scope"])
        finally:
            del sys.last_traceback

    def test_attribute_paths_and_slots(self):
        self.set_global("trainer", Trainer())
        s = Slotted()
        s.kept = {"a": Tensor(999)}
        self.set_global("slotted", s)
        r = walk()
        h = named(r, "trainer.outputs")
        self.assertEqual((h["kind"], h["scope"], h["what"], h["tensors"], h["bytes"]),
                         ("variable", SCOPE, "list", 4, 3000 + 3001 + 3002 + 3003))
        self.assertEqual((named(r, "slotted.kept")["what"], named(r, "slotted.kept")["bytes"]), ("dict", 999))

    def test_a_shared_storage_is_counted_once(self):
        a = Tensor(4096)
        self.set_global("shared", [a, a.view(), a.view()])
        self.set_global("also", a.view())
        del a
        r = walk()
        # `also` is the shorter path (a variable, before the list's elements): the storage is counted there.
        self.assertEqual((named(r, "also")["tensors"], named(r, "also")["what"], named(r, "also")["bytes"]),
                         (1, "Tensor", 4096))
        h = named(r, "shared")
        self.assertEqual((h["tensors"], h["bytes"]), (3, 0))
        self.assertEqual(len([k for k in r["holders"] if k["bytes"] == 4096 and k["name"] in ("also", "shared")]), 1)

    def test_a_running_total_names_its_graph_and_the_batches_it_spans(self):
        total = None
        saved = 0
        weight = Parameter(64)
        self.set_global("weight", weight)
        for i in range(45):
            act = Tensor(10000 + i)
            loss_fn = MulBackward0([AccumulateGrad(weight)], self=act, other=weight)
            saved += 10000 + i
            total = AddBackward0(([total] if total is not None else []) + [loss_fn], alpha=1)
            del act
        self.set_global("total_loss", Tensor(4, grad_fn=total))
        del total, loss_fn
        import warnings

        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            r = walk()
        # A non-leaf's .grad is never asked for: PyTorch would warn on the program's stderr.
        self.assertEqual([str(w.message) for w in said], [])
        g = named(r, "total_loss", "graph")
        self.assertEqual((g["kind"], g["scope"], g["what"]), ("graph", SCOPE, "AddBackward0"))
        self.assertEqual(g["batches"], 45)
        self.assertEqual(g["nodes"], 45 * 3)  # the adds, the muls, the weight's AccumulateGrad nodes
        self.assertEqual((g["tensors"], g["bytes"]), (45, saved))  # the weight: counted as `weight`
        self.assertEqual(named(r, "total_loss", "variable")["bytes"], 4)
        # After backward() the saved tensors are freed: reading them raises, the graph holds nothing.
        node, stack = globals()["total_loss"].grad_fn, []
        while node is not None:
            node.release()
            stack.extend(n for n, _ in node.next_functions)
            node = stack.pop() if stack else None
        gc.collect()
        self.assertEqual(named(walk(), "total_loss", "graph"), [])

    def test_saved_tuples_and_a_graph_without_a_chain(self):
        parts = tuple(Tensor(100 + i) for i in range(3))
        self.set_global("cat", Tensor(8, grad_fn=CatBackward0(tensors=parts)))
        del parts
        g = named(walk(), "cat", "graph")
        self.assertEqual((g["tensors"], g["bytes"], g["nodes"]), (3, 303, 1))
        self.assertNotIn("batches", g)

    def test_a_reference_cycle_is_named_as_such(self):
        gc.disable()
        self.addCleanup(gc.enable)

        def make():
            c = [Tensor(5555)]
            c.append(c)

        make()
        r = walk()
        h = [h for h in r["holders"] if h["kind"] == "cycle"]
        self.assertEqual(len(h), 1, r["holders"])
        self.assertEqual((h[0]["what"], h[0]["tensors"], h[0]["bytes"]), ("list", 1, 5555))
        self.assertEqual(h[0]["name"], "reference cycle through a list, awaiting the garbage collector")
        gc.collect()
        self.assertEqual([h for h in walk()["holders"] if h["kind"] == "cycle"], [])

    def test_many_cycles_are_all_named_as_cycles(self):
        # More cycles than are asked about one by one (a loop making one a step with gc off): all of them are
        # found in the batched pass, none left as unreached.
        gc.disable()
        self.addCleanup(gc.enable)

        def make(i):
            a = {"t": Tensor(1000 + i)}
            a["self"] = a

        for i in range(63):
            make(i)
        r = walk()
        h = [h for h in r["holders"] if h["kind"] == "cycle"]
        self.assertEqual(len(h), 1, r["holders"])
        self.assertEqual((h[0]["tensors"], h[0]["bytes"]), (63, sum(1000 + i for i in range(63))))
        self.assertEqual([h for h in r["holders"] if h["kind"] == "unreached"], [])
        gc.collect()

    def test_parameters_and_optimizer_state_by_role(self):
        model = Net()
        opt = torch.optim.Adam(model.parameters())
        opt.step()
        self.set_global("model", model)
        self.set_global("opt", opt)
        del model, opt
        r = walk()
        p = named(r, "model", "parameters")
        self.assertEqual((p["scope"], p["what"], p["tensors"], p["bytes"]), (SCOPE, "Net", 3, 2048 + 1024 + 512))
        o = named(r, "opt", "optimizer")
        self.assertEqual((o["what"], o["tensors"], o["bytes"]), ("Adam", 4, 2 * (2048 + 1024)))
        # An optimizer whose model is gone still holds the parameters: named through it.
        globals().pop("model")
        r = walk()
        self.assertEqual(named(r, "opt.param_groups", "parameters")["bytes"], 2048 + 1024)

    def test_the_device_filter_and_cpu_tensors(self):
        self.set_global("mixed", [Tensor(100), Tensor(200, device="cuda:1"), Tensor(300, device="cpu")])
        self.assertEqual(named(walk(device=0), "mixed")["bytes"], 100)
        self.assertEqual(named(walk(device=1), "mixed")["bytes"], 200)
        self.assertEqual(named(walk(), "mixed")["bytes"], 300)

    def test_the_cache_is_a_holder(self):
        r = walk(cache_bytes=3 * GIB)
        self.assertEqual(r["holders"][0], {"kind": "cache", "name": "PyTorch's cache (reserved but free)",
                                           "scope": None, "what": "CUDACachingAllocator", "tensors": 0,
                                           "bytes": 3 * GIB})

    def test_a_zero_deadline_gives_a_partial_walk(self):
        self.set_global("kept", [Tensor(10)])
        r = walk(deadline_s=0)
        self.assertTrue(r["partial"].startswith("the 0s deadline stopped it while finding the CUDA tensors"),
                        r["partial"])
        f = _holders.record(r, "request")
        self.assertIs(f["partial"], True)
        check_schema("holders", {k: v for k, v in f.items() if v is not None})

    def test_at_most_16_holders_largest_first_and_the_fields(self):
        for i in range(20):
            self.set_global("g%d" % i, Tensor(1000 * (i + 1)))
        r = walk()
        self.assertEqual(len(r["holders"]), 16)
        sizes = [h["bytes"] for h in r["holders"]]
        self.assertEqual(sizes, sorted(sizes, reverse=True))
        self.assertEqual(r["holders"][0]["name"], "g19")
        f = _holders.record(r, "oom", oom=2)
        self.assertEqual(list(f)[:6], ["at", "oom", "elapsed_ms", "objects", "tensors", "tensor_bytes"])
        self.assertEqual(f["holders"][0], {"kind": "variable", "name": "g19", "scope": SCOPE, "what": "Tensor",
                                           "tensors": 1, "bytes": 20000})
        self.assertEqual(len(f["holders"]), 16)
        check_schema("holders", f)

    def test_it_never_raises(self):
        class Broken(object):
            Tensor = Tensor

            def __getattr__(self, name):
                raise RuntimeError("no")

        r = _holders.walk(Broken(), 1.0)
        self.assertIn("holders", r)
        r = _holders.walk(object(), 1.0)
        self.assertTrue(r["partial"].startswith("failed"))


class Bounded(unittest.TestCase):
    def test_500000_objects_and_2000_cuda_tensors_within_the_deadline(self):
        code = textwrap.dedent("""
            import gc, json, sys
            import torch
            from torch._tensor import Tensor
            from vramtrace_bridge import _holders

            class Row(object):
                def __init__(self, i):
                    self.i = i
                    self.tags = [i]
                    self.meta = {"n": i, "tags": self.tags}  # holds a list: gc tracks it

            rows = [Row(i) for i in range(150000)]  # 450,000 objects gc tracks, and their __dict__s
            cache = {"k%d" % i: [Tensor(1 << 20) for _ in range(4)] for i in range(500)}  # 2,000 tensors
            extra = [[i] for i in range(50000)]
            n = len(gc.get_objects())
            r = _holders.walk(torch, 1.0)
            print(json.dumps([n, r]))
        """)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VRAMTRACE", "FAKETORCH"))}
        env["PYTHONPATH"] = FAKETORCH + os.pathsep + BRIDGE
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        n, r = json.loads(p.stdout.strip().splitlines()[-1])
        sys.stderr.write("\n  holders walk: %d gc objects, %d CUDA tensors: %d ms, partial: %s\n"
                         % (n, r["tensors"], r["elapsed_ms"], r["partial"]))
        self.assertGreaterEqual(n, 500000)
        self.assertEqual(r["tensors"], 2000)
        self.assertLess(r["elapsed_ms"], 1500)
        if r["partial"] is None:
            h = [h for h in r["holders"] if h["name"] == "cache"][0]
            self.assertEqual((h["scope"], h["tensors"], h["bytes"]), ("global of __main__", 2000, 2000 << 20))


class Records(WithTorch):
    """The `holders` records the bridge sends (checked against schema.json at the door)."""

    def setUp(self):
        WithTorch.setUp(self)
        self.patch(_steps, "counters", _steps.Counters())

    def holders(self):
        return [(dev, dict(f), ack) for w, dev, f, ack in self.door.records if w == "holders"]

    def test_at_an_oom_after_the_oom_record_acknowledged(self):
        self.attach()
        kept = [Tensor(123456)]  # noqa: F841
        self.hold(950 * MIB)
        with self.assertRaises(torch.OutOfMemoryError):
            torch.cuda.empty(200 * MIB)
        whats = [r[0] for r in self.door.records]
        self.assertEqual(whats.index("holders"), whats.index("oom") + 1)
        (dev, f, ack), = self.holders()
        self.assertEqual((dev, f["at"], f["oom"], ack), (0, "oom", 1, 1))
        kept = next(h for h in f["holders"] if h["name"] == "kept")
        self.assertEqual((kept["kind"], kept["bytes"]), ("variable", 123456))
        self.assertTrue(kept["scope"].startswith("local of test_at_an_oom_after_the_oom_record_acknowledged"))
        self.assertNotIn("partial", f)

    def test_at_exit_only_when_memory_grew(self):
        self.attach()
        self.hold(100 * MIB)
        self.tick(0.0)
        _exit.exit_unsafe()
        self.assertEqual(self.holders(), [])
        self.setUp()
        os.environ["FAKETORCH_TOTAL"] = str(80 * GIB)
        self.attach()
        opt = torch.optim.SGD([])
        t = 0.0
        for _ in range(12):
            opt.step()
            for _ in range(4):
                self.tick(t)
                t += 0.02
            self.hold(64 * MIB)
        _exit.exit_unsafe()
        (dev, f, ack), = self.holders()
        self.assertEqual((dev, f["at"], ack), (None, "exit", 1))
        self.assertNotIn("oom", f)

    def test_on_request_once_and_the_request_is_taken_back(self):
        self.attach()
        self.patch(_state, "state", dict(_state.state, next_request_walk=0.0))
        self.hold(100 * MIB)
        self.tick(0.0)
        path = "%s.holders-%d.request" % (self.trace, os.getpid())
        _walks.holders_on_request()
        self.assertEqual(self.holders(), [])
        open(path, "w").close()
        _walks.holders_on_request()
        _walks.holders_on_request()
        (dev, f, ack), = self.holders()
        self.assertEqual((dev, f["at"]), (None, "request"))
        self.assertFalse(os.path.exists(path))
        # Another request within the minute: taken back, not answered (a walk costs the program up to 1 s).
        open(path, "w").close()
        _walks.holders_on_request()
        self.assertEqual(len(self.holders()), 1)
        self.assertFalse(os.path.exists(path))

    def test_a_link_or_another_users_file_is_no_request(self):
        self.attach()
        path = "%s.holders-%d.request" % (self.trace, os.getpid())
        target = path + ".target"
        open(target, "w").close()
        self.addCleanup(lambda: os.path.exists(target) and os.unlink(target))
        os.symlink(target, path)
        _walks.holders_on_request()
        self.assertEqual(self.holders(), [])
        self.assertFalse(os.path.lexists(path))
        self.assertTrue(os.path.exists(target))  # never followed
        # A file of another user (as root here: chown it away).
        if os.getuid() == 0:
            open(path, "w").close()
            os.chown(path, 12345, 12345)
            _walks.holders_on_request()
            self.assertEqual(self.holders(), [])


class Harmless(unittest.TestCase):
    """What the walk must not do to the program: keep its locals alive, run its unpack hooks, walk twice."""

    def test_a_running_frames_locals_are_not_kept_alive_after_the_walk(self):
        import weakref

        seen = []

        def step():
            t = Tensor(4096)
            ref = weakref.ref(t)
            walk()  # reads this frame's locals (as an OOM inside the step would)
            del t
            gc.collect()
            seen.append(ref() is None)

        step()
        # On 3.13 f_locals is a live view (nothing copied); before it, the copy the walk made was emptied.
        self.assertEqual(seen, [True])

    def test_no_code_of_the_programs_runs_by_any_route(self):
        """Issue 50: a `__dict__` property, a metaclass's `__flags__` and `__name__`, a tensor subclass's
        `is_cuda` and `grad_fn`, a property over a slot, a list subclass's `__iter__`, a `__class__` property:
        each would run the program's code if the walk looked them up; each records its call."""
        ran = []

        class Meta(type):
            @property
            def __flags__(cls):
                ran.append("__flags__")
                return 0

            @property
            def __name__(cls):
                ran.append("__name__")
                return "Meta"

        class Sneaky(object, metaclass=Meta):
            def __init__(self):
                self.inside = Tensor(111)

        class OwnDict(object):
            @property
            def __dict__(self):
                ran.append("__dict__")
                return {"t": Tensor(5)}

            @property
            def __class__(self):
                ran.append("__class__")
                return dict

        class Spy(Tensor):
            def _get(self):
                ran.append("is_cuda")
                return True

            def _set(self, v):  # the stand-in's constructor sets it; real torch's is a C getter
                vars(self)["is_cuda"] = v

            is_cuda = property(_get, _set)

        class Base(object):
            __slots__ = ("held",)

        class Shadow(Base):
            @property
            def held(self):
                ran.append("slot")
                return None

        class Lst(list):
            def __iter__(self):
                ran.append("__iter__")
                return iter([])

        shadow = Shadow.__new__(Shadow)
        Base.held.__set__(shadow, Tensor(222))
        self.addCleanup(globals().pop, "traps", None)
        globals()["traps"] = [Sneaky(), OwnDict(), Spy(333), shadow, Lst([Tensor(444)])]
        del shadow  # the list alone holds it
        r = walk()
        self.assertEqual(ran, [])
        # What the slots and the real dicts hold is still found, under the list that holds them.
        self.assertEqual(named(r, "traps")["bytes"], 111 + 333 + 222 + 444)

    def test_a_huge_container_is_read_to_a_bound_and_said_partial(self):
        big = list(range(_holders.MAX_ITEMS + 50000)) + [Tensor(999)]
        self.addCleanup(globals().pop, "big", None)
        globals()["big"] = big
        r = walk()
        self.assertIn("container", r["partial"] or "")

    def test_saved_tensors_are_not_unpacked_where_checkpointing_can_run(self):
        class Recompute(AddBackward0):
            calls = 0

            @property
            def _saved_self(self):  # an unpack hook: checkpointing would recompute the forward here
                Recompute.calls += 1
                return Tensor(777)

        total = None
        for _ in range(5):
            total = Recompute(([total] if total is not None else []))
        globals()["total_ck"] = Tensor(4, grad_fn=total)
        self.addCleanup(globals().pop, "total_ck", None)
        # Non-reentrant checkpointing's unpack hook, alive while its saved tensors are (a C++ SavedVariable holds it).
        def unpack_hook(holder):
            raise AssertionError("never called")

        unpack_hook.__module__ = "torch.utils.checkpoint"
        unpack_hook.__qualname__ = "_checkpoint_hook.__init__.<locals>.unpack_hook"
        r = walk()
        del unpack_hook
        self.assertEqual(Recompute.calls, 0)
        # Still named, with the iterations it spans; its bytes unread.
        g = named(r, "total_ck", "graph")
        self.assertEqual((g["batches"], g["bytes"]), (5, 0))

    def test_a_graph_reached_from_a_librarys_frame_says_so(self):
        r = _holders._result(_FakeWalk({("graph", "hidden_states", "local of forward() at m.py:9", "AddBackward0"):
                                        [1, 10, 3, 64]}, {"local of forward() at m.py:9"}), None)
        h = r["holders"][0]
        self.assertTrue(h["lib"])
        self.assertIs(_holders.record(r, "oom", 1)["holders"][0]["lib"], True)


class _FakeWalk(object):
    def __init__(self, holders, lib):
        import time

        self.holders = holders
        self.library_scopes = lib
        self.unpack = True
        self.partial = None
        self.deadline_s = 1.0
        self.t0 = time.monotonic()
        self.objects = 0
        self.cuda = {}


class WalkOnce(WithTorch):
    def test_an_error_inside_a_walk_is_not_walked_again_and_many_errors_are_paced(self):
        self.attach()
        calls = []
        self.patch(_holders, "walk", lambda *a, **k: calls.append(1) or {
            "elapsed_ms": 0, "objects": 0, "tensors": 0, "tensor_bytes": 0, "partial": None, "holders": []})
        self.patch(_state, "state", dict(_state.state, walking=True, next_oom_walk=0.0))
        _walks.send_holders("oom", 0, 0, oom=1)
        self.assertEqual(calls, [])
        _state.state["walking"] = False
        for n in range(1, 10):
            _walks.send_holders("oom", 0, 0, oom=n)
        # The first OOM_WALKS errors, then one a minute.
        self.assertEqual(len(calls), _walks.OOM_WALKS)


if __name__ == "__main__":
    unittest.main()
