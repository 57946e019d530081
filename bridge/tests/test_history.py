"""The bridge keeping PyTorch's allocation history, against the stand-in torch (bridge/tests/faketorch) without a
driver (FAKETORCH_TOTAL): what it asks of torch, the records it sends through the shim's door (captured at the
door, after the bridge's own encoding) and the snapshots it writes. The tests are the sampler, with their own
clock; one runs a real process with the sampler thread. Run: python3 -m unittest discover -s bridge/tests"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BRIDGE = os.path.dirname(HERE)
FAKETORCH = os.path.join(HERE, "faketorch")
sys.path.insert(0, BRIDGE)
sys.path.insert(0, FAKETORCH)

import torch  # noqa: E402  (the stand-in)
from vramtrace_bridge import _exit, _history, _sampler, _shim, _state, _torch  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30


class Door(object):
    """The shim's two C functions, as _shim calls them: records decoded back into (what, device, body, ack), the
    body the JSON object the bridge sent."""

    def __init__(self):
        self.records = []

    def sample(self, framework, device, values, n, ts):
        return _shim.QUEUED

    def record(self, what, device, text, n, ack):
        assert n == len(text)
        body = json.loads(text.decode("utf-8"))
        what = what.decode("ascii")
        check_schema(what, body)
        self.records.append((what, None if device == _shim.NO_DEVICE else device, body, ack))
        return _shim.QUEUED


with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "schema.json")) as _f:
    SCHEMA = json.load(_f)


def check_schema(what, body):
    """Every record the bridge makes is of a kind that bridge/schema.json names, and carries only the keys it
    names for it, each of its type (`count` an int >= 0, `flag` a bool, `text` a str, `[type]` a list of them),
    with the values `values` lists where it lists them: the collector's reader is held to the same file."""
    if what not in SCHEMA["kinds"]:
        raise AssertionError("a bridge record of kind %r, which schema.json does not name" % what)
    _check_object(what, body, SCHEMA["kinds"][what], what)


def _check_object(where, body, declared, values_key):
    if not isinstance(body, dict):
        raise AssertionError("%s is %r, not an object" % (where, body))
    for k, v in body.items():
        if k not in declared:
            raise AssertionError("%s carries %r, which schema.json does not name for it" % (where, k))
        _check_value("%s.%s" % (where, k), v, declared[k], "%s.%s" % (values_key, k))


def _check_value(where, v, ty, values_key):
    if isinstance(ty, list):
        if not isinstance(v, list):
            raise AssertionError("%s is %r, not a list" % (where, v))
        for i, x in enumerate(v):
            _check_value("%s[%d]" % (where, i), x, ty[0], values_key)
        return
    if isinstance(ty, dict):
        _check_object(where, v, ty, values_key)
        return
    ok = {
        "count": lambda x: isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 64,
        "flag": lambda x: isinstance(x, bool),
        "text": lambda x: isinstance(x, str),
    }[ty]
    if not ok(v):
        raise AssertionError("%s is %r, not a %s" % (where, v, ty))
    listed = SCHEMA["values"].get(values_key)
    if listed is not None and v not in listed:
        raise AssertionError("%s says %r, which schema.json does not list" % (where, v))


class _NoAtexit(object):
    @staticmethod
    def register(fn):
        pass  # the tests call the exit themselves; the test process's own exit must not run it


class Schema(unittest.TestCase):
    def test_the_schema_refuses_what_it_does_not_name(self):
        check_schema("note", {"text": "x"})
        check_schema("attach", {"problems": ["x"], "sample_ms": 20})
        check_schema("holders", {"at": "request", "partial": True, "holders": [{"kind": "graph", "bytes": 5}]})
        bad = [
            ("note", {"txt": "x"}),
            ("oops", {}),
            ("values", {}),
            ("history", {"state": "half"}),
            ("holders", {"at": "later"}),
            ("holders", {"holders": [{"colour": "red"}]}),
            ("holders", {"holders": [{"kind": "weights"}]}),
            ("holders", {"holders": {"kind": "graph"}}),
            ("holders", {"partial": "1"}),
            ("attach", {"problems": "x"}),
            ("attach", {"sample_ms": "20"}),
            ("attach", {"sample_ms": True}),
            ("attach", {"sample_ms": -1}),
            ("attach", {"torch": 2}),
        ]
        for what, body in bad:
            with self.assertRaises(AssertionError, msg=repr((what, body))):
                check_schema(what, body)


class WithTorch(unittest.TestCase):
    """A fresh torch and a fresh bridge in this process, the door captured, the environment as `env` says."""

    env = {}

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.trace = os.path.join(self.tmp, "job.vtrace")
        env = {"FAKETORCH_TOTAL": str(GIB), "VRAMTRACE_TRACE": self.trace}
        env.update(self.env)
        saved = {k: os.environ.get(k) for k in list(env) + ["VRAMTRACE_TORCH_HISTORY"]}
        os.environ.pop("VRAMTRACE_TORCH_HISTORY", None)
        os.environ.update(env)
        self.addCleanup(self._restore_env, saved)
        torch.cuda._reset()
        self.door = Door()
        self.patch(_shim, "_fns", (self.door.sample, self.door.record))
        self.patch(_sampler, "start", lambda: None)
        self.patch(_torch, "atexit", _NoAtexit)
        fresh = dict(torch=None, attached=False, pid=None, thread=None, last={}, active=set(), ooms=0, history=0,
                     arming=None, exit_done=False, peaks={})
        self.patch(_state, "state", fresh)
        self.tensors = []

    def patch(self, obj, name, value):
        old = getattr(obj, name)
        setattr(obj, name, value)
        self.addCleanup(setattr, obj, name, old)

    @staticmethod
    def _restore_env(saved):
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def attach(self):
        _torch.on_import(torch)
        torch.cuda.init()
        self.assertTrue(_state.state["attached"])

    def tick(self, t_s):
        """One pass of the sampler at t_s seconds."""
        vals = _sampler.sample_device(0)
        _history.watch(0, vals, int(t_s * 1e9))
        return vals

    def hold(self, nbytes):
        t = torch.cuda.empty(nbytes)
        self.tensors.append(t)
        return t

    def drop(self, t):
        self.tensors.remove(t)
        torch.cuda.release(t)

    def records(self, what):
        return [(dev, fields) for w, dev, fields, _ in self.door.records if w == what]

    def attach_fields(self):
        (dev, fields), = self.records("attach")
        return dict(fields)

    def calls(self):
        return list(torch.cuda._history["calls"])


ARM = ("all", {"context": "alloc", "stacks": "python", "max_entries": 20000})
DISARM = (None, {})


class Automatic(WithTorch):
    def test_attach_says_auto_and_arms_nothing(self):
        self.attach()
        f = self.attach_fields()
        self.assertEqual((f["history_entries"], f["history_mode"]), (0, "auto"))
        self.assertEqual(f["problems"], [])
        self.assertEqual(self.records("history"), [])
        self.assertEqual(self.calls(), [])

    def test_pressure_arms_and_its_end_disarms_after_the_hold(self):
        self.attach()
        self.hold(800 * MIB)
        self.tick(0.0)
        self.assertEqual(self.records("history"), [])
        spike = self.hold(150 * MIB)  # 950 MiB of 1 GiB: over 90%
        self.tick(1.0)
        self.assertEqual(self.records("history"), [(0, {
            "state": "armed", "reason": "pressure", "entries": 20000, "allocated": 950 * MIB,
            "reserved": 950 * MIB, "limit": GIB, "t_ns": 10 ** 9,
        })])
        self.assertEqual(self.calls(), [ARM])
        self.assertEqual(_state.state["history"], 20000)
        self.drop(spike)  # 800 MiB: 78%, under 80%
        for t in (1.5, 5.0, 10.9):
            self.tick(t)
        self.assertEqual(len(self.records("history")), 1)
        self.tick(11.0)
        dev, fields = self.records("history")[1]
        self.assertEqual((dev, fields["state"], fields["reason"], fields["allocated"]),
                         (0, "disarmed", "pressure_gone", 800 * MIB))
        self.assertEqual(list(fields), ["state", "reason", "entries", "allocated", "reserved", "limit", "t_ns"])
        self.assertEqual(self.calls(), [ARM, DISARM])
        self.assertEqual(_state.state["history"], 0)

    def test_the_limit_is_read_once_and_follows_the_per_process_fraction(self):
        self.attach()
        torch.cuda.set_per_process_memory_fraction(0.5)
        reads = []
        real = torch.cuda.mem_get_info
        self.patch(torch.cuda, "mem_get_info", lambda d=0: reads.append(d) or real(d))
        self.tick(0.0)
        self.assertEqual(reads, [])  # nothing held yet: nothing to read
        self.hold(470 * MIB)
        for i in range(5):
            self.tick(1.0 + i)
        self.assertEqual(reads, [0])
        (dev, fields), = self.records("history")
        self.assertEqual(dict(fields)["reason"], "pressure")
        self.assertEqual(dict(fields)["limit"], 512 * MIB)

    def test_a_retry_arms(self):
        self.attach()
        cached = self.hold(600 * MIB)
        self.tick(0.0)
        self.drop(cached)  # free, but PyTorch keeps the segment
        self.hold(700 * MIB)  # refused by the driver, the cache flushed, retried: 68%, no pressure
        self.assertEqual(torch._C._cuda_memoryStats(0)["num_alloc_retries"], 1)
        self.tick(0.02)
        (dev, fields), = self.records("history")
        self.assertEqual((dev, dict(fields)["reason"]), (0, "retry"))

    def test_growth_arms_and_the_exit_dumps_the_growing_tensors_lines(self):
        os.environ["FAKETORCH_TOTAL"] = str(80 * GIB)
        self.attach()
        self.hold(2 * GIB)
        t = 0.0
        while t < 90 and not self.records("history"):
            if int(t / 0.5) != int((t - 0.02) / 0.5):
                self.hold(4 * MIB)  # the leak: 8 MiB a second, kept
            step = self.hold(256 * MIB)
            self.tick(t)
            self.drop(step)
            t += 0.02
        (dev, fields), = self.records("history")
        self.assertEqual(dict(fields)["reason"], "growth")
        self.assertGreaterEqual(t, 60)
        for _ in range(10):  # tensors kept while armed carry their lines
            self.hold(4 * MIB)
        _exit.exit_unsafe()
        (dev, fields), = self.records("snapshot")
        path = dict(fields)["path"]
        self.assertEqual(path, "%s.torch-%d-exit.pickle" % (self.trace, os.getpid()))
        import pickle

        with open(path, "rb") as f:
            self.assertEqual(f.read(2), b"\x80\x04")
            f.seek(0)
            snap = pickle.load(f)
        files = {fr["filename"] for s in snap["segments"] for b in s["blocks"] for fr in b["frames"]}
        self.assertIn(os.path.abspath(__file__), files)

    def test_an_oom_while_armed_dumps_the_history(self):
        self.attach()
        self.hold(950 * MIB)
        self.tick(0.0)
        self.assertEqual(len(self.records("history")), 1)
        with self.assertRaises(torch.OutOfMemoryError):
            torch.cuda.empty(200 * MIB)
        (dev, fields), = self.records("oom")
        path = dict(fields)["snapshot"]
        self.assertEqual(path, "%s.torch-%d-oom1.pickle" % (self.trace, os.getpid()))
        self.assertTrue(os.path.isfile(path))

    def test_a_link_planted_at_the_snapshots_name_is_never_written_through(self):
        # Another user (or the traced program) plants the names the dump writes at: links to a file of the job's
        # user. The dump replaces them; the file they point at is untouched, the snapshot is ours alone.
        victim = os.path.join(self.tmp, "victim")
        with open(victim, "w") as f:
            f.write("theirs")
        final = "%s.torch-%d-oom1.pickle" % (self.trace, os.getpid())
        os.symlink(victim, final + ".part")
        self.attach()
        self.hold(950 * MIB)
        self.tick(0.0)
        with self.assertRaises(torch.OutOfMemoryError):
            torch.cuda.empty(200 * MIB)
        with open(victim) as f:
            self.assertEqual(f.read(), "theirs")
        self.assertFalse(os.path.islink(final))
        self.assertEqual(os.stat(final).st_mode & 0o777, 0o600)
        self.assertFalse(os.path.lexists(final + ".part"))

    def test_no_dump_at_exit_unless_armed_then(self):
        self.attach()
        self.hold(100 * MIB)
        self.tick(0.0)
        _exit.exit_unsafe()
        self.assertEqual(self.records("snapshot"), [])
        self.assertEqual(os.listdir(self.tmp), [])

    def test_no_dump_at_exit_once_disarmed(self):
        self.attach()
        spike = self.hold(1000 * MIB)
        self.tick(0.0)
        self.drop(spike)
        self.tick(10.0)
        self.assertEqual([dict(f)["state"] for _, f in self.records("history")], ["armed", "disarmed"])
        _exit.exit_unsafe()
        self.assertEqual(self.records("snapshot"), [])

    def test_nothing_moves_after_the_exit(self):
        self.attach()
        self.hold(1000 * MIB)
        _exit.exit_unsafe()
        self.tick(0.0)
        self.assertEqual(self.records("history"), [])
        self.assertEqual(self.calls(), [])

    def test_a_history_the_program_keeps_itself_is_left_alone(self):
        self.attach()
        torch.cuda.memory._record_memory_history(enabled="all", max_entries=7)
        self.hold(1000 * MIB)
        self.tick(0.0)
        self.tick(20.0)
        self.assertEqual(self.records("history"), [])
        self.assertEqual(self.calls(), [("all", {"max_entries": 7})])
        (dev, fields), = self.records("note")
        self.assertIn("keeps PyTorch's allocation history itself", dict(fields)["text"])

    def test_a_refusal_is_swallowed_and_stops_the_arming(self):
        self.attach()

        def refuse(**kw):
            raise RuntimeError("no history today")

        self.patch(torch.cuda.memory, "_record_memory_history", staticmethod(refuse))
        self.hold(1000 * MIB)
        self.tick(0.0)  # no exception
        self.assertEqual(self.records("history"), [])
        (dev, fields), = self.records("note")
        self.assertIn("could not arm the allocation history", dict(fields)["text"])
        self.assertEqual(_state.state["arming"].mode, "off")
        self.assertEqual(_state.state["history"], 0)


class AutomaticWithItsOwnRing(WithTorch):
    env = {"VRAMTRACE_TORCH_HISTORY": "auto", "VRAMTRACE_TORCH_HISTORY_AUTO_ENTRIES": "500"}

    def test_the_ring_size_is_the_settings(self):
        self.attach()
        self.assertEqual(self.attach_fields()["history_mode"], "auto")
        self.hold(1000 * MIB)
        self.tick(0.0)
        self.assertEqual(self.calls(), [("all", {"context": "alloc", "stacks": "python", "max_entries": 500})])
        self.assertEqual(dict(self.records("history")[0][1])["entries"], 500)


class Requested(WithTorch):
    env = {"VRAMTRACE_TORCH_HISTORY": "1000"}

    def test_on_from_attach_and_never_disarmed(self):
        self.attach()
        f = self.attach_fields()
        self.assertEqual((f["history_entries"], f["history_mode"]), (1000, "requested"))
        first = self.door.records[1]
        self.assertEqual(first[:2], ("history", None), "the arming follows the attach record")
        self.assertEqual(list(first[2]), ["state", "reason", "entries", "allocated", "reserved", "t_ns"])
        self.assertEqual([first[2][k] for k in list(first[2])[:5]], ["armed", "requested", 1000, 0, 0])
        spike = self.hold(1000 * MIB)
        self.tick(0.0)
        self.drop(spike)
        for t in range(1, 60):
            self.tick(float(t))
        self.assertEqual(len(self.records("history")), 1)
        self.assertEqual(self.calls(), [("all", {"context": "alloc", "stacks": "python", "max_entries": 1000})])
        _exit.exit_unsafe()
        self.assertEqual(len(self.records("snapshot")), 1)


class Off(WithTorch):
    def test_off_and_zero_never_arm(self):
        for value in ("off", "0"):
            self.env = {"VRAMTRACE_TORCH_HISTORY": value}
            self.setUp()
            reads = []
            self.patch(torch.cuda, "mem_get_info", lambda d=0, reads=reads: reads.append(d))
            self.attach()
            f = self.attach_fields()
            self.assertEqual((f["history_entries"], f["history_mode"]), (0, "off"), value)
            self.hold(1000 * MIB)
            self.tick(0.0)
            self.assertEqual((self.records("history"), self.calls(), reads), ([], [], []), value)


class AsyncBackend(WithTorch):
    def test_cuda_malloc_async_never_arms_and_says_so_once(self):
        for value in ("", "1000"):
            self.env = {"VRAMTRACE_TORCH_HISTORY": value}
            self.setUp()
            self.patch(torch.cuda, "_backend", "cudaMallocAsync")
            self.attach()
            f = self.attach_fields()
            self.assertEqual((f["history_entries"], f["history_mode"]), (0, "off"), value)
            problems = f["problems"]
            self.assertEqual(len(problems), 1, problems)
            self.assertIn("allocation history", problems[0])
            self.hold(1000 * MIB)
            self.tick(0.0)
            self.assertEqual((self.records("history"), self.calls()), ([], []), value)


class InAProcess(unittest.TestCase):
    """The sampler thread and the exit as a program gets them: pressure arms, the exit dumps."""

    def test_the_sampler_arms_and_the_exit_dumps(self):
        tmp = tempfile.mkdtemp()
        trace = os.path.join(tmp, "job.vtrace")
        code = textwrap.dedent("""
            import atexit, json, sys, time
            from vramtrace_bridge import _shim, _torch
            seen = []
            def record(what, device, text, n, ack):
                seen.append([what.decode(), device, text.decode()])
                return 0
            _shim._fns = (lambda *a: 0, record)
            atexit.register(lambda: print(json.dumps(seen)))  # runs after the bridge's own exit
            import torch
            _torch.on_import(torch)
            x = torch.cuda.empty(95 << 20)  # of 100 MiB
            deadline = time.monotonic() + 10
            while not any(r[0] == "history" for r in seen) and time.monotonic() < deadline:
                time.sleep(0.01)
            print(json.dumps(torch.cuda._history["calls"]))
        """)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VRAMTRACE", "FAKETORCH"))}
        env.update(PYTHONPATH=FAKETORCH + os.pathsep + BRIDGE, FAKETORCH_TOTAL=str(100 * MIB),
                   VRAMTRACE_TORCH_SAMPLE_MS="5", VRAMTRACE_TRACE=trace)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        calls, records = [json.loads(line) for line in r.stdout.strip().splitlines()[-2:]]
        self.assertEqual(calls, [["all", {"context": "alloc", "stacks": "python", "max_entries": 20000}]])
        history = [r for r in records if r[0] == "history"]
        self.assertEqual(len(history), 1, records)
        self.assertEqual(history[0][1], 0)
        body = json.loads(history[0][2])
        self.assertEqual((body["state"], body["reason"], body["entries"]), ("armed", "pressure", 20000), body)
        snapshot = [r for r in records if r[0] == "snapshot"]
        self.assertEqual(len(snapshot), 1, records)
        path = json.loads(snapshot[0][2])["path"]
        self.assertTrue(path.startswith(trace + ".torch-") and path.endswith("-exit.pickle"), path)
        self.assertTrue(os.path.isfile(path))
        self.assertEqual(r.stderr, "")


if __name__ == "__main__":
    unittest.main()
