"""The program's steps (optimizer steps, DataLoader batches) and the per-step growth rule (StepFloors): the
counters against the stand-in torch (bridge/tests/faketorch), the rule against synthetic series like
test_arming's. Run: python3 -m unittest discover -s bridge/tests"""

import gc
import threading
import time
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "faketorch"))
sys.path.insert(0, HERE)

import torch  # noqa: E402  (the stand-in)
from test_arming import GIB, loop, samples  # noqa: E402
from test_history import WithTorch  # noqa: E402
from vramtrace_bridge import _arming, _exit, _sampler, _settings, _state, _steps, _torch  # noqa: E402
from vramtrace_bridge._arming import MIB, Arming, StepFloors, steps_rising  # noqa: E402


def first_arm_by_steps(shape, step_s, seconds, seed=1, limit=80 * GIB):
    """Runs a series, the step index as the program's counter would say, through the policy; (t, reason, step)
    of the first arming, or None."""
    a = Arming("auto", 20000)
    a.set_limit(0, limit)
    for t, v in samples(shape, seconds, seed):
        step = int(t / step_s) + 1
        d = a.sample(0, t, v, v, 0, step)
        if d is not None and d[0] == "armed":
            return t, d[1], step
    return None


# 0.06 s and 0.15 s: the sampler (about 21 ms) drifts slowly in phase with the step: floors that rise for a while
STEPS = (0.001, 0.03, 0.06, 0.1, 0.15, 0.25, 0.5, 1.5, 5.0)


class StepRule(unittest.TestCase):
    def test_the_rule_on_step_floors(self):
        g = 10 * GIB
        self.assertTrue(steps_rising([g + i * 100 * MIB for i in range(6)]))
        # One flat step among six is allowed; two are not.
        self.assertTrue(steps_rising([g, g + 100 * MIB, g + 100 * MIB, g + 200 * MIB, g + 300 * MIB, g + 400 * MIB]))
        self.assertFalse(steps_rising([g, g, g + 100 * MIB, g + 100 * MIB, g + 200 * MIB, g + 300 * MIB]))
        # Rises under 0.5% of the floor, or under 1 MiB, do not count; nor a total under 4 MiB.
        self.assertFalse(steps_rising([g + i * 40 * MIB for i in range(6)]))
        self.assertFalse(steps_rising([i * MIB // 2 for i in range(6)]))
        self.assertTrue(steps_rising([i * MIB for i in range(6)]))
        self.assertFalse(steps_rising([0, MIB, 2 * MIB, 3 * MIB, 3 * MIB + MIB // 2, 3 * MIB + MIB // 2]))
        # Floors that never pass what the window's first step reached: a sampler drifting in phase.
        self.assertFalse(steps_rising([g + i * 100 * MIB for i in range(6)], first_peak=g + GIB))
        self.assertTrue(steps_rising([g + i * 100 * MIB for i in range(6)], first_peak=g + 400 * MIB))
        # Fewer than six floors say nothing yet.
        self.assertFalse(steps_rising([g + i * GIB for i in range(5)]))

    def test_floors_are_per_step_minima_of_closed_steps_seen_often_enough(self):
        f = StepFloors()
        for step, v in [(1, 5), (1, 3), (1, 4), (2, 9), (2, 8), (3, 1), (3, 1), (3, 1), (4, 7)]:
            f.add(step, v)
        self.assertEqual(f.floors(), [3, 1])  # step 2 was seen twice: no floor; step 4 is still open
        # Bounded: the last 64 step indices.
        for step in range(5, 1000):
            for _ in range(3):
                f.add(step, step)
            self.assertLessEqual(len(f.steps), _arming.STEP_FLOORS)
        self.assertEqual(f.floors()[-1], 998)
        # The counter went back (a fork's child, or batches giving way to optimizer steps): start again.
        f.add(1, 5)
        self.assertEqual(f.floors(), [])

    def test_a_leak_that_fills_the_device_in_seconds_arms_within_a_few_steps(self):
        for step in (0.1, 0.25, 0.5, 1.5):
            base = loop(step)
            leak = 80 * GIB / 3.0 * step / 4  # a quarter of the device in 3 s

            def leaking(t, base=base, step=step, leak=leak):
                return base(t) + leak * int(t / step)

            got = first_arm_by_steps(leaking, step, 60)
            self.assertIsNotNone(got, step)
            t, reason, n = got
            self.assertEqual(reason, "growth_steps", step)
            self.assertLessEqual(n, 9, step)  # six floors of closed steps, the seventh open: a few steps
            self.assertLess(t, _arming.GROWTH_MIN_SPAN_S)

    def test_a_steady_loop_does_not_arm(self):
        for step in STEPS:
            for seed in (1, 2, 3):
                self.assertIsNone(first_arm_by_steps(loop(step), step, 120, seed=seed), (step, seed))

    def test_a_one_off_step_does_not_arm(self):
        for step in STEPS:
            steady = loop(step)

            def once(t, steady=steady, step=step):
                # The optimizer's state, made at its first step and kept.
                return steady(t) + (2 * GIB if t >= step else 0)

            self.assertIsNone(first_arm_by_steps(once, step, 120), step)

    def test_a_doubling_batch_does_not_arm(self):
        for step in STEPS:
            small = loop(step, activations=GIB)
            big = loop(step, activations=2 * GIB)

            def doubling(t, small=small, big=big, step=step):
                # From step 20 the batch doubles: activations, and the cached inputs kept between steps.
                return small(t) if t < 20 * step else big(t) + 256 * MIB

            self.assertIsNone(first_arm_by_steps(doubling, step, 120), step)

    def test_the_growth_rules_run_in_every_mode_for_the_exit(self):
        for mode in ("requested", "off"):
            a = Arming(mode, 100)
            for i in range(40):
                self.assertIsNone(a.sample(0, i * 0.02, GIB + (i // 4) * 100 * MIB, 2 * GIB, 0, i // 4 + 1))
            self.assertTrue(a.growing(), mode)
        a = Arming("auto", 100)
        for i in range(40):
            a.sample(0, i * 0.02, GIB, 2 * GIB, 0, i // 4 + 1)
        self.assertFalse(a.growing())


class Counters(WithTorch):
    def setUp(self):
        WithTorch.setUp(self)
        self.patch(_steps, "counters", _steps.Counters())

    def steps(self):
        return [dict(f) for _, f in self.records("steps")]

    def test_the_optimizer_hook_counts_the_first_optimizers_steps(self):
        self.attach()
        self.assertTrue(_steps.hooks["optimizer"])
        n_hooks = len(torch.optim.optimizer._global_optimizer_post_hooks)
        self.attach()  # a fresh attach (a forked child's) registers nothing twice
        _steps.install(torch, _torch._on_boundary)
        self.assertEqual(len(torch.optim.optimizer._global_optimizer_post_hooks), n_hooks)
        g = torch.optim.Adam([torch.nn.Parameter(8)])
        d = torch.optim.SGD([torch.nn.Parameter(8)])
        for _ in range(3):  # a GAN: two optimizers a step
            d.step()
            g.step()
        self.assertEqual(_steps.counters.optimizer, 3)
        self.assertGreater(_steps.counters.t_ns, 0)
        del g, d
        gc.collect()
        third = torch.optim.SGD([])
        third.step()  # the counted one is gone: the next one seen counts
        self.assertEqual(_steps.counters.optimizer, 4)

    def test_outermost_no_grad_and_inference_scopes_count_when_nothing_else_does(self):
        self.attach()
        self.assertTrue(_steps.hooks["scopes"])

        @torch.no_grad()
        def serve(n):
            with torch.no_grad():  # a scope inside another is the same iteration
                with torch.inference_mode():
                    return n + 1

        for i in range(4):
            self.assertEqual(serve(i), i + 1)  # transparent: the function's result, grad mode restored
            self.assertTrue(torch.is_grad_enabled())
        with torch.inference_mode():
            with torch.no_grad():
                pass
        self.assertEqual(_steps.counters.scopes, 5)
        self.assertEqual(_steps.counters.index(), 5)
        # torch's own scopes (moving a model's parameters, one scope each) are not the program's iterations.
        model = torch.nn.Module()
        model.a = torch.nn.Parameter(8)
        model.b = torch.nn.Parameter(8)
        model.cuda()
        self.assertEqual(_steps.counters.scopes, 5)
        # Once an optimizer steps, its steps are the ones read (scopes still counted, not read at boundaries).
        opt = torch.optim.SGD([])
        opt.step()
        with torch.no_grad():
            pass
        self.assertEqual((_steps.counters.scopes, _steps.counters.index()), (6, 1))
        # A fresh attach (a forked child's) wraps nothing twice.
        self.attach()
        _steps.install(torch, _torch._on_boundary)
        with torch.no_grad():
            pass
        self.assertEqual(_steps.counters.scopes, 7)

    def test_the_dataloader_wrapper_counts_and_is_transparent(self):
        self.attach()
        sys.modules.pop("torch.utils.data.dataloader", None)
        sys.modules.pop("torch.utils.data", None)
        _steps.hooks["dataloader"] = False
        self.addCleanup(_steps.hooks.__setitem__, "dataloader", True)
        _steps.install(torch, _torch._on_boundary)
        from torch.utils.data import DataLoader, dataloader

        nxt = dataloader._BaseDataLoaderIter.__next__
        self.assertTrue(nxt._vramtrace)
        self.assertEqual((nxt.__name__, nxt.__doc__), ("__next__", nxt.__wrapped__.__doc__))
        _steps.hook_dataloader(dataloader)  # never twice
        self.assertIs(dataloader._BaseDataLoaderIter.__next__, nxt)
        train = DataLoader(["a", "b", "c", "d", "e"])
        self.assertEqual(list(train), ["a", "b", "c", "d", "e"])
        it = iter(train)
        next(it)
        self.assertEqual(_steps.counters.batches, 6)
        for _ in range(4):
            next(it)
        with self.assertRaises(StopIteration):
            next(it)
        self.assertEqual(_steps.counters.batches, 10)
        # A validation loader beside the training one: its batches are not steps.
        self.assertEqual(list(DataLoader(["v", "w"])), ["v", "w"])
        self.assertEqual(_steps.counters.batches, 10)
        # The dataset's own error goes through as it is.
        with self.assertRaises(KeyError):
            list(DataLoader([KeyError("x")]))
        self.assertEqual(_steps.counters.batches, 10)

    def test_a_step_boundary_sends_the_allocated_bytes_within_its_share_of_the_time(self):
        self.attach()
        self.hold(96 * MIB)
        opt = torch.optim.SGD([])
        opt.step()
        self.assertGreaterEqual(_steps.counters.next_read_ns - _steps.counters.t_ns, int(1000 / _torch.BOUNDARY_SHARE))
        _steps.counters.reads = _torch.BOUNDARY_FREE  # past the readings taken at every step
        opt.step()  # before the first reading's cost is paid back: counted, not read
        got = self.steps()
        self.assertEqual(len(got), 1, got)
        self.assertEqual((got[0]["optimizer"], got[0]["device"]), (1, 0))
        self.assertEqual(int(got[0]["allocated"]), torch._C._cuda_memoryStats(0)["allocated_bytes"]["all"]["current"])
        self.assertGreaterEqual(int(got[0]["allocated"]), 96 * MIB)
        _steps.counters.next_read_ns = 0  # as if the program ran on long enough
        self.hold(32 * MIB)
        opt.step()
        got = self.steps()
        self.assertEqual([s["optimizer"] for s in got], [1, 3])
        self.assertEqual(int(got[1]["allocated"]) - int(got[0]["allocated"]), 32 * MIB)
        # The sampler does not send again what the boundary sent.
        _sampler.send_steps()
        self.assertEqual(len(self.steps()), 2)

    def test_the_first_steps_are_read_at_every_boundary(self):
        self.attach()
        opt = torch.optim.SGD([])
        for _ in range(_torch.BOUNDARY_FREE + 10):
            opt.step()
        got = [int(s["optimizer"]) for s in self.steps() if "allocated" in s]
        # Every one of the first BOUNDARY_FREE steps, then paced by cost (none within microseconds).
        self.assertEqual(got[: _torch.BOUNDARY_FREE], list(range(1, _torch.BOUNDARY_FREE + 1)))
        self.assertLess(len(got), _torch.BOUNDARY_FREE + 10)

    def test_no_boundary_reading_before_cuda_is_initialised(self):
        # A program that steps an optimizer before (or without) CUDA: counted, never read (asking would
        # initialise CUDA).
        _torch.on_import(torch)
        opt = torch.optim.SGD([])
        _steps.install(torch, _torch._on_boundary)
        opt.step()
        self.assertEqual(_steps.counters.optimizer, 1)
        self.assertFalse(torch.cuda.is_initialized())
        self.assertEqual(self.steps(), [])

    def test_the_sampler_sends_steps_only_when_they_moved(self):
        self.attach()
        _sampler.send_steps()
        self.assertEqual(self.steps(), [])
        opt = torch.optim.SGD([])
        _steps.counters.next_read_ns = 1 << 62  # no boundary readings: the sampler alone
        _steps.counters.reads = _torch.BOUNDARY_FREE
        opt.step()
        _sampler.send_steps()
        _sampler.send_steps()
        t1 = _steps.counters.t_ns
        self.assertEqual(self.steps(), [{"optimizer": 1, "batches": 0, "scopes": 0, "t_ns": t1}])
        opt.step()
        _sampler.send_steps()
        self.assertEqual([s["optimizer"] for s in self.steps()], [1, 2])

    def test_steps_go_before_the_oom_and_the_exit_records_and_reset_in_a_fork(self):
        self.attach()
        opt = torch.optim.SGD([])
        opt.step()
        self.hold(950 * MIB)
        with self.assertRaises(torch.OutOfMemoryError):
            torch.cuda.empty(200 * MIB)
        whats = [r[0] for r in self.door.records]
        self.assertLess(whats.index("steps"), whats.index("oom"))
        opt.step()
        self.tick(0.0)
        _exit.exit_unsafe()
        whats = [r[0] for r in self.door.records]
        self.assertEqual(whats.count("steps"), 2)
        self.assertLess(len(whats) - 1 - whats[::-1].index("steps"), whats.index("exit"))
        self.patch(_state, "state", dict(_state.state))
        _torch._after_fork()
        self.assertEqual((_steps.counters.optimizer, _steps.counters.batches, _steps.counters.index()), (0, 0, None))

    def test_a_leak_over_steps_arms_the_history_through_the_sampler(self):
        os.environ["FAKETORCH_TOTAL"] = str(80 * GIB)
        self.attach()
        self.hold(GIB)
        opt = torch.optim.SGD([])
        t = 0.0
        for step in range(1, 30):  # noqa: B007 (read after the loop)
            opt.step()
            for _ in range(5):  # five samples a step
                self.tick(t)
                t += 0.02
            self.hold(64 * MIB)  # kept every step
            if self.records("history"):
                break
        (dev, fields), = self.records("history")
        self.assertEqual(dict(fields)["reason"], "growth_steps")
        self.assertLessEqual(step, 9)


if __name__ == "__main__":
    unittest.main()


class SamplerPace(WithTorch):
    def test_a_costly_round_makes_the_sampler_wait_longer(self):
        # A round whose reads take 3 ms (a CPU-bound host) waits 1 s at a 0.3% share, not the 20 ms period.
        self.attach()
        real = _state.state["thread"]
        _state.state["thread"] = None  # the real sampler stops; this test drives one round by hand
        if real is not None:
            real.join(5)
        waits = []
        me = threading.current_thread()

        def slow_sample(d, force=False):
            end = time.thread_time() + 0.003
            while time.thread_time() < end:
                pass
            return None

        def fake_sleep(s):
            waits.append(s)
            _state.state["thread"] = None  # one round only

        self.patch(_sampler, "sample_device", slow_sample)
        self.patch(_sampler.time, "sleep", fake_sleep)
        _state.state["thread"] = me
        _state.state["active"] = {0}
        _sampler._loop()
        self.assertEqual(len(waits), 1)
        period = _settings.interval_ms() / 1000.0
        # 3 ms of its own CPU would ask 1 s; the wait is capped at SAMPLER_MAX_WAIT periods.
        self.assertEqual(waits[0], period * _sampler.SAMPLER_MAX_WAIT)
        self.assertGreater(0.003 / _sampler.SAMPLER_SHARE, period * _sampler.SAMPLER_MAX_WAIT)


class SmallGrowth(unittest.TestCase):
    def test_a_few_bytes_kept_at_every_boundary_is_growth_for_the_exit_walk(self):
        a = Arming("auto", 20000)
        for i in range(_arming.SMALL_RUN + 1):
            a.boundary(0, GIB + 512 * i)  # a scalar loss kept each step: one 512-byte block
        self.assertTrue(a.growing())
        # A steady loop read at its boundaries (the same bytes each step), or one flat step in the run: not.
        flat_once = [GIB + 512 * i for i in range(20)] + [GIB + 512 * 19] + [GIB + 512 * (20 + i) for i in range(20)]
        for series in ([GIB] * 100, flat_once):
            a = Arming("auto", 20000)
            for v in series:
                a.boundary(0, v)
            self.assertFalse(a.growing(), series[:3])
