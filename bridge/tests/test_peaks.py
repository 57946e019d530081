"""PyTorch's own peaks (allocated_bytes.all.peak, reserved_bytes.all.peak: what max_memory_allocated() and
max_memory_reserved() say) against the stand-in torch (bridge/tests/faketorch): a tensor that lives only between
two samples is in the `peak` record, however the program resets the counters. Run: python3 -m unittest discover
-s bridge/tests"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "faketorch"))
sys.path.insert(0, HERE)

import torch  # noqa: E402  (the stand-in)
from test_history import MIB, WithTorch  # noqa: E402
from vramtrace_bridge import _exit, _sampler, _state, _torch  # noqa: E402


class Peaks(WithTorch):
    def peaks(self):
        return [(dev, int(f["allocated_peak"]), int(f["reserved_peak"])) for dev, f in map(
            lambda r: (r[0], dict(r[1])), self.records("peak"))]

    def spike(self, nbytes):
        """A tensor that lives between two samples only (a step's activations, freed before the sampler looks)."""
        self.drop(self.hold(nbytes))

    def test_a_spike_between_two_samples_is_pytorchs_peak(self):
        self.attach()
        self.hold(100 * MIB)
        self.tick(0.0)
        self.spike(400 * MIB)
        vals = self.tick(0.02)
        self.assertEqual(vals[0], 100 * MIB, "the sample sees the tensors live now")
        self.assertEqual(self.peaks()[-1][:2], (0, torch.cuda.max_memory_allocated(0)))
        self.assertEqual(self.peaks()[-1][1], 500 * MIB)
        self.assertEqual(self.peaks()[-1][2], torch.cuda.max_memory_reserved(0))

    def test_sent_only_when_a_peak_passes_the_most_sent(self):
        self.attach()
        self.hold(64 * MIB)
        self.tick(0.0)
        self.assertEqual([p[1] for p in self.peaks()], [64 * MIB])
        self.tick(0.02)
        self.assertEqual(len(self.peaks()), 1, "an unchanged peak sends nothing")
        t = self.hold(32 * MIB)
        self.tick(0.04)
        self.assertEqual([p[1] for p in self.peaks()], [64 * MIB, 96 * MIB])
        # The program's reset takes PyTorch's counter back below the most sent: nothing more is sent, neither at
        # the reset nor by the sampler after it.
        self.drop(t)
        torch.cuda.reset_peak_memory_stats()
        self.assertEqual(torch.cuda.max_memory_allocated(0), 64 * MIB)
        self.tick(0.06)
        self.assertEqual([p[1] for p in self.peaks()], [64 * MIB, 96 * MIB])

    def test_the_programs_reset_reads_the_peak_it_takes_back(self):
        self.attach()
        self.hold(100 * MIB)
        self.tick(0.0)
        self.spike(300 * MIB)
        # The program resets its counters before the sampler looks again (a benchmark, each epoch's report).
        torch.cuda.reset_peak_memory_stats()
        self.assertEqual(torch.cuda.max_memory_allocated(0), 100 * MIB, "PyTorch's counter went back")
        self.tick(0.02)
        self.assertEqual(max(p[1] for p in self.peaks()), 400 * MIB)
        # One wrapper under both of PyTorch's names, wrapped once however often torch is seen.
        wrapper = torch.cuda.reset_peak_memory_stats
        self.assertIs(torch.cuda.memory.reset_peak_memory_stats, wrapper)
        _sampler.wrap_reset(torch)
        self.assertIs(torch.cuda.reset_peak_memory_stats, wrapper)
        self.assertFalse(getattr(wrapper.__wrapped__, "_vramtrace", False))
        self.assertEqual(wrapper.__name__, "reset_peak_memory_stats")

    def test_a_reset_before_the_sampler_first_looked(self):
        self.attach()
        self.hold(100 * MIB)
        self.spike(300 * MIB)
        torch.cuda.reset_peak_memory_stats()
        self.tick(0.0)
        self.assertEqual(max(p[1] for p in self.peaks()), 400 * MIB)

    def test_a_boundary_reading_and_the_exit_carry_the_peaks(self):
        self.attach()
        self.hold(10 * MIB)
        self.spike(200 * MIB)
        opt = torch.optim.SGD([])
        opt.step()
        steps = [dict(f) for _, f in self.records("steps") if "allocated" in dict(f)]
        self.assertEqual(int(steps[-1]["allocated_peak"]), 210 * MIB)
        self.assertEqual(int(steps[-1]["reserved_peak"]), torch.cuda.max_memory_reserved(0))
        self.tick(0.0)
        self.spike(500 * MIB)
        _exit.exit_unsafe()
        (dev, f), = self.records("exit")
        f = dict(f)
        self.assertEqual((dev, int(f["allocated_peak"])), (0, 510 * MIB))
        self.assertEqual(int(f["reserved_peak"]), torch.cuda.max_memory_reserved(0))

    def test_no_peak_for_a_device_the_bridge_never_sampled(self):
        self.attach()
        self.tick(0.0)  # nothing reserved yet: no sample, no peak
        self.assertEqual(self.peaks(), [])

    def test_a_fork_starts_its_own_peaks(self):
        self.attach()
        self.hold(8 * MIB)
        self.tick(0.0)
        self.patch(_state, "state", dict(_state.state))
        _torch._after_fork()
        self.assertEqual(_state.state["peaks"], {})


class CachingOff(WithTorch):
    env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}

    def test_attach_says_pytorch_keeps_no_figures(self):
        self.attach()
        notes = [dict(f)["text"] for _, f in self.records("note")]
        self.assertEqual(len(notes), 1, notes)
        self.assertIn("PYTORCH_NO_CUDA_MEMORY_CACHING=1", notes[0])
        self.assertIn("max_memory_allocated()", notes[0])


class CachingOnUnlessExactlyOne(WithTorch):
    env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "true"}  # PyTorch reads only "1" (c10::utils::check_env)

    def test_no_note(self):
        self.attach()
        self.assertEqual(self.records("note"), [])


if __name__ == "__main__":
    unittest.main()
