"""When the bridge keeps PyTorch's allocation history (vramtrace_bridge/_arming.py, the pure part of _history.py:
Arming, FloorSeries), driven by synthetic sample series: no torch, no clock. Run: python3 -m unittest discover -s
bridge/tests"""

import os
import random
import sys
import unittest

BRIDGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BRIDGE)

from vramtrace_bridge import _arming  # noqa: E402  (imports no torch)
from vramtrace_bridge._arming import MIB, Arming, FloorSeries, history_setting, rising_run  # noqa: E402

GIB = 1 << 30
SAMPLE_S = 0.02  # the sampler's period (VRAMTRACE_TORCH_SAMPLE_MS=20)
SHORT_STEP = 0.001  # a step much shorter than the sample interval
LONG_STEPS = (1.5, 5.0, 20.0)  # steps much longer than it


def samples(shape, seconds, seed=1):
    """(t, allocated) as the sampler sees them: every 20 ms, a little late each time (the sampler is a Python
    thread), so a short step is seen at a different phase each time."""
    rng = random.Random(seed)
    t = 0.0
    while t < seconds:
        yield t, int(shape(t))
        t += SAMPLE_S + rng.uniform(0, 0.003)


def loop(step_s, base=2 * GIB, activations=1 * GIB):
    """A steady training loop: activations pile up through forward (70% of the step), backward frees them."""

    def shape(t):
        phase = (t % step_s) / step_s
        return base + (activations * min(1.0, phase / 0.7) if phase < 0.9 else 0)

    return shape


def first_arm(shape, seconds, limit=80 * GIB, seed=1):
    """Runs a series through the policy; (t, reason) of the first arming, or None."""
    a = Arming("auto", 20000)
    a.set_limit(0, limit)
    for t, v in samples(shape, seconds, seed):
        d = a.sample(0, t, v, v, 0)
        if d is not None and d[0] == "armed":
            return t, d[1]
    return None


class Setting(unittest.TestCase):
    def test_the_environment_contract(self):
        self.assertEqual(history_setting({}), ("auto", 20000))
        self.assertEqual(history_setting({"VRAMTRACE_TORCH_HISTORY": ""}), ("auto", 20000))
        self.assertEqual(history_setting({"VRAMTRACE_TORCH_HISTORY": " Auto "}), ("auto", 20000))
        self.assertEqual(history_setting({"VRAMTRACE_TORCH_HISTORY_AUTO_ENTRIES": "500"}), ("auto", 500))
        self.assertEqual(history_setting({"VRAMTRACE_TORCH_HISTORY_AUTO_ENTRIES": "x"}), ("auto", 20000))
        self.assertEqual(history_setting({"VRAMTRACE_TORCH_HISTORY": "1000"}), ("requested", 1000))
        self.assertEqual(history_setting({"VRAMTRACE_TORCH_HISTORY": "0"}), ("off", 0))
        self.assertEqual(history_setting({"VRAMTRACE_TORCH_HISTORY": "off"}), ("off", 0))
        self.assertEqual(history_setting({"VRAMTRACE_TORCH_HISTORY": "-5"}), ("off", 0))
        self.assertEqual(history_setting({"VRAMTRACE_TORCH_HISTORY": "sometimes"}), ("auto", 20000))


class Detector(unittest.TestCase):
    def test_the_rule_on_window_minima(self):
        g = 10 * GIB
        # Four rises of at least 1 MiB and 1% each, at the end: growth.
        self.assertEqual(rising_run([g, g, g, g * 1.02, g * 1.04, g * 1.06, g * 1.08]), 4)
        # A plateau at the end breaks the run, whatever came before.
        self.assertEqual(rising_run([g, g * 1.02, g * 1.04, g * 1.06, g * 1.08, g * 1.08]), 0)
        # Rises under 1% of the minimum before them do not count...
        self.assertEqual(rising_run([g, g + 50 * MIB, g + 100 * MIB, g + 150 * MIB, g + 200 * MIB]), 0)
        # ...nor rises under 1 MiB, however small the job.
        self.assertEqual(rising_run([0, MIB // 2, MIB, 3 * MIB // 2, 2 * MIB]), 0)
        self.assertEqual(rising_run([0, MIB, 2 * MIB, 3 * MIB, 4 * MIB]), 4)
        self.assertEqual(rising_run([5]), 0)
        self.assertEqual(rising_run([]), 0)

    def test_memory_is_bounded_whatever_the_run_length(self):
        f = FloorSeries()
        for i in range(200000):  # 28 hours at one sample every 0.5 s
            f.add(i * 0.5, MIB * (1 + i))
            self.assertLessEqual(len(f.mins), _arming.FLOOR_BUCKETS)
        # The buckets still cover the whole run: the first holds the first sample, the windows the rise.
        self.assertEqual(f.mins[0], MIB)
        self.assertEqual(rising_run(f.window_minima()), 7)

    def test_samples_before_the_first_allocation_are_not_the_curve(self):
        f = FloorSeries()
        for t in range(100):
            f.add(t, 0)
        self.assertIsNone(f.t0)
        f.add(100.0, 5)
        self.assertEqual((f.t0, f.mins), (100.0, [5]))

    def test_a_series_shorter_than_the_minimum_span_never_grows(self):
        f = FloorSeries()
        t = 0.0
        while t < _arming.GROWTH_MIN_SPAN_S - 1:
            f.add(t, int(GIB + t * 100 * MIB))
            self.assertFalse(f.rising())
            t += SAMPLE_S

    def test_a_leak_arms_for_growth_with_short_and_long_steps(self):
        for step in (SHORT_STEP,) + LONG_STEPS:
            leak_per_s = 8 * MIB
            base = loop(step)

            def leaking(t, base=base, step=step, leak_per_s=leak_per_s):
                return base(t) + leak_per_s * step * int(t / step)

            got = first_arm(leaking, 300)
            self.assertIsNotNone(got, step)
            t, reason = got
            self.assertEqual(reason, "growth")
            self.assertGreaterEqual(t, _arming.GROWTH_MIN_SPAN_S)
            # A window must hold a step's leak: 20 s steps are seen once windows are longer (span > 160 s).
            self.assertLess(t, 70 if step < 10 else 180, step)

    def test_warm_up_then_a_plateau_does_not_arm(self):
        for step in (SHORT_STEP,) + LONG_STEPS:
            steady = loop(step, base=0)

            def warm(t, steady=steady):
                # Twenty loads of 200 MiB over 5 s (weights, the optimizer, the first steps), then the loop.
                if t < 5:
                    return 200 * MIB * (1 + int(t * 4))
                return 4 * GIB + steady(t)

            self.assertIsNone(first_arm(warm, 300), step)

    def test_a_steady_loop_does_not_arm(self):
        for step in (SHORT_STEP,) + LONG_STEPS:
            for seed in (1, 2, 3):
                self.assertIsNone(first_arm(loop(step), 300, seed=seed), (step, seed))

    def test_a_one_off_allocation_does_not_arm(self):
        for step in (SHORT_STEP,) + LONG_STEPS:
            for at in (3.0, 31.0, 61.0, 100.0, 250.0):
                steady = loop(step)

                def once(t, steady=steady, at=at):
                    # The optimizer's state, created at its first step and kept.
                    return steady(t) + (2 * GIB if t >= at else 0)

                self.assertIsNone(first_arm(once, 300), (step, at))


class Policy(unittest.TestCase):
    def policy(self, limit=10 * GIB):
        a = Arming("auto", 20000)
        self.assertTrue(a.needs_limit(0))
        a.set_limit(0, limit)
        self.assertFalse(a.needs_limit(0))
        return a

    def test_pressure_arms_at_90_percent_and_disarms_below_80_after_10_s(self):
        a = self.policy()
        self.assertIsNone(a.sample(0, 0.0, 8 * GIB, 9 * GIB, 0))
        self.assertEqual(a.sample(0, 1.0, 9 * GIB, 9 * GIB, 0), ("armed", "pressure", 0))
        self.assertEqual(a.armed, "pressure")
        # Between 80% and 90%: no new trigger, but no relief either.
        t = 1.0
        while t < 30:
            t += 0.5
            self.assertIsNone(a.sample(0, t, int(8.5 * GIB), 9 * GIB, 0), t)
        self.assertEqual(a.sample(0, t + 0.5, 7 * GIB, 9 * GIB, 0), ("disarmed", "pressure_gone", 0))
        self.assertIsNone(a.armed)

    def test_hysteresis_counts_from_the_last_trigger(self):
        a = self.policy()
        self.assertEqual(a.sample(0, 0.0, int(9.5 * GIB), 10 * GIB, 0), ("armed", "pressure", 0))
        self.assertIsNone(a.sample(0, 5.0, int(9.5 * GIB), 10 * GIB, 0))  # still a trigger: the hold restarts
        for t in (5.1, 8.0, 14.9):
            self.assertIsNone(a.sample(0, t, GIB, 10 * GIB, 0), t)
        self.assertEqual(a.sample(0, 15.0, GIB, 10 * GIB, 0), ("disarmed", "pressure_gone", 0))
        # Armed again at the next trigger.
        self.assertEqual(a.sample(0, 16.0, 9 * GIB, 10 * GIB, 0), ("armed", "pressure", 0))

    def test_a_retry_arms_and_a_new_one_holds_it(self):
        a = self.policy()
        self.assertIsNone(a.sample(0, 0.0, GIB, 2 * GIB, 0))
        self.assertEqual(a.sample(0, 1.0, GIB, 2 * GIB, 1), ("armed", "retry", 0))
        self.assertIsNone(a.sample(0, 8.0, GIB, 2 * GIB, 2))
        self.assertIsNone(a.sample(0, 17.9, GIB, 2 * GIB, 2))
        self.assertEqual(a.sample(0, 18.0, GIB, 2 * GIB, 2), ("disarmed", "pressure_gone", 0))
        # Retries before the first look count; a reset of PyTorch's counters is not a retry.
        b = self.policy()
        self.assertEqual(b.sample(0, 0.0, GIB, GIB, 3), ("armed", "retry", 0))
        c = self.policy()
        c.sample(0, 0.0, GIB, GIB, 0)
        c.devices[0].retries = 5
        self.assertIsNone(c.sample(0, 1.0, GIB, GIB, 0))
        self.assertEqual(c.sample(0, 2.0, GIB, GIB, 1), ("armed", "retry", 0))

    def test_a_retry_wins_over_pressure(self):
        a = self.policy()
        self.assertEqual(a.sample(0, 0.0, 10 * GIB, 10 * GIB, 1), ("armed", "retry", 0))

    def test_without_a_limit_there_is_no_pressure(self):
        a = Arming("auto", 20000)
        a.set_limit(0, None)
        self.assertFalse(a.needs_limit(0))
        self.assertIsNone(a.sample(0, 0.0, 100 * GIB, 100 * GIB, 0))

    def test_another_device_near_its_limit_holds_the_history(self):
        a = self.policy()
        a.set_limit(1, 10 * GIB)
        self.assertEqual(a.sample(0, 0.0, 9 * GIB, 9 * GIB, 0), ("armed", "pressure", 0))
        self.assertIsNone(a.sample(1, 0.0, int(8.5 * GIB), 9 * GIB, 0))
        self.assertIsNone(a.sample(0, 20.0, GIB, 9 * GIB, 0))
        # Device 1 below 80% now: its own sample disarms, naming the device that armed it.
        self.assertEqual(a.sample(1, 21.0, int(7.9 * GIB), 9 * GIB, 0), ("disarmed", "pressure_gone", 0))

    def test_growth_holds_the_history_while_the_floor_rises_then_lets_go(self):
        step = 0.5
        base = loop(step)

        def leak_then_stop(t):
            return base(t) + 8 * MIB * min(t, 100.0)

        a = Arming("auto", 20000)
        a.set_limit(0, 80 * GIB)
        events = []
        for t, v in samples(leak_then_stop, 400):
            d = a.sample(0, t, v, v, 0)
            if d is not None:
                events.append((round(t), d))
        self.assertEqual([d for _, d in events], [("armed", "growth", 0), ("disarmed", "pressure_gone", 0)])
        armed_at, disarmed_at = events[0][0], events[1][0]
        self.assertLess(armed_at, 70)
        # Growth is seen until the windows no longer rise (a third of the run after the leak stops), then 10 s.
        self.assertGreater(disarmed_at, 110)
        self.assertLess(disarmed_at, 160)

    def test_requested_and_off_never_move(self):
        for mode in ("requested", "off"):
            a = Arming(mode, 100)
            if mode == "requested":
                a.arm_requested()
            self.assertFalse(a.needs_limit(0))
            for t in range(100):
                self.assertIsNone(a.sample(0, float(t), (t % 2) * 100 * GIB, 100 * GIB, t))
            self.assertEqual(a.armed, "requested" if mode == "requested" else None)

    def test_after_a_failure_it_stops_deciding(self):
        a = self.policy()
        self.assertEqual(a.sample(0, 0.0, 10 * GIB, 10 * GIB, 0), ("armed", "pressure", 0))
        a.failed()
        self.assertIsNone(a.sample(0, 100.0, 0, 0, 0))


if __name__ == "__main__":
    unittest.main()
