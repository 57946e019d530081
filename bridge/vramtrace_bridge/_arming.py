"""When PyTorch's allocation history is kept: the setting (`VRAMTRACE_TORCH_HISTORY`), the detectors of pressure
and of a rising floor (over time, `FloorSeries`, and over steps, `StepFloors`), and `Arming`, which decides each
move. Pure: no torch, no clock, no I/O, so synthetic series test it (bridge/tests/test_arming.py). These detectors
only say when recording the history pays (the tensors of a leak get their lines); whether the program grew is
the collector's verdict, from the facts the bridge sends."""

import collections
import os

MIB = 1 << 20

# When PyTorch's allocation history is kept (VRAMTRACE_TORCH_HISTORY unset, empty or `auto`). It costs up to +26%
# a step on a CPU-bound loop (H100, PyTorch 2.11), so it is armed only while it can pay: at a retry (the
# allocator flushed its cache), near the limit, or while the floor of allocated bytes rises (a leak, whose
# tensors' lines `report` wants); disarmed when all of that has been gone for a while.
PRESSURE_SHARE = 0.90  # allocated >= this share of the limit
RELIEF_SHARE = 0.80  # ...and disarming waits until allocated is below this share on every device
HOLD_S = 10.0  # and until no trigger has fired for this long
GROWTH_EVERY_S = 1.0  # the growth detector runs at most this often per device
# The growth detector: see FloorSeries.
FLOOR_BUCKETS = 64  # at most this many bucket minima per device, whatever the run's length
FLOOR_BUCKET_S = 1.0  # the first buckets' width; it doubles at each pairwise merge
GROWTH_MIN_SPAN_S = 60.0  # a shorter series says nothing yet: warm-up, or one long step's ramp, looks like growth
GROWTH_WINDOWS = 8
GROWTH_RUN = 4  # rises of the trailing window minima that make growth
GROWTH_STEP_BYTES = MIB  # each rise at least this...
GROWTH_STEP_SHARE = 0.01  # ...and this share of the minimum before it

# The same rule over steps (StepFloors), for programs that step: a leak that fills the device in seconds arms
# the history within a few steps, not after GROWTH_MIN_SPAN_S.
STEP_FLOORS = 64  # the floors of this many step indices at most
STEP_WINDOW = 6  # the rule looks at the last this many step floors
STEP_RISES = 4  # ...of which at least this many rise
STEP_RISE_BYTES = MIB  # each by at least this...
STEP_RISE_SHARE = 0.005  # ...and this share of the floor before it
STEP_TOTAL_BYTES = 4 * MIB  # and together by at least this
STEP_MIN_SAMPLES = 3  # a step the sampler saw fewer times than this has no floor (its low point was missed)
SMALL_RUN = 32  # boundary readings in a row that each rose, however little: a small growth the exit walk names


AUTO_ENTRIES = 20000

_OFF = ("off", "0", "no", "false", "none")


def history_setting(env=None):
    """(mode, entries) from the environment: ("auto", ring), ("requested", N) or ("off", 0)."""
    env = os.environ if env is None else env
    raw = (env.get("VRAMTRACE_TORCH_HISTORY") or "").strip().lower()
    if raw in _OFF:
        return "off", 0
    if raw not in ("", "auto"):
        try:
            n = int(raw)
        except ValueError:
            n = None  # not ours to refuse the job over: the default
        if n is not None:
            return ("requested", n) if n > 0 else ("off", 0)
    try:
        ring = int((env.get("VRAMTRACE_TORCH_HISTORY_AUTO_ENTRIES") or "").strip())
    except ValueError:
        ring = 0
    return "auto", ring if ring > 0 else AUTO_ENTRIES


class FloorSeries(object):
    """One device's allocated bytes since its first non-zero sample, in bounded memory: the minimum of each time
    bucket. When a 65th bucket would be needed, neighbours merge pairwise and the width doubles, so the whole run
    fits in 64 numbers and a sample costs O(1) amortised."""

    def __init__(self, bucket_s=FLOOR_BUCKET_S):
        self.t0 = None
        self.t = None  # the newest sample's time
        self.width = bucket_s
        self.mins = []  # None: no sample fell there (the sampler was starved)

    def add(self, t, value):
        if self.t0 is None:
            if value <= 0:
                return  # before the job holds anything: not part of its curve
            self.t0 = t
        self.t = t if self.t is None else max(self.t, t)
        i = max(0, int((t - self.t0) / self.width))
        while i >= FLOOR_BUCKETS:
            self._merge()
            i >>= 1
        if i < len(self.mins):
            m = self.mins[i]
            if m is None or value < m:
                self.mins[i] = value
        else:
            self.mins.extend([None] * (i - len(self.mins)))
            self.mins.append(value)

    def _merge(self):
        m = self.mins
        self.mins = [_min(m[j], m[j + 1] if j + 1 < len(m) else None) for j in range(0, len(m), 2)]
        self.width *= 2

    def span(self):
        return 0.0 if self.t0 is None else self.t - self.t0

    def window_minima(self, n=GROWTH_WINDOWS):
        """The minimum of each of n equal windows of the span (a bucket counts where it starts); empty windows
        are left out."""
        span = self.span()
        if span <= 0:
            return []
        out = [None] * n
        for i, m in enumerate(self.mins):
            if m is not None:
                k = min(n - 1, int(i * self.width * n / span))
                out[k] = _min(out[k], m)
        return [m for m in out if m is not None]

    def rising(self):
        """The floor has risen window after window lately: the trailing run of rising window minima is long."""
        if self.span() < GROWTH_MIN_SPAN_S:
            return False
        return rising_run(self.window_minima()) >= GROWTH_RUN


def rising_run(minima):
    """How many of the last minima are each above the one before by at least GROWTH_STEP_BYTES and
    GROWTH_STEP_SHARE of it."""
    run = 0
    i = len(minima) - 1
    while i > 0 and minima[i] - minima[i - 1] >= max(GROWTH_STEP_BYTES, minima[i - 1] * GROWTH_STEP_SHARE):
        run += 1
        i -= 1
    return run


class StepFloors(object):
    """One device's allocated bytes by step: the minimum the sampler saw within each step index, for the last
    STEP_FLOORS indices. The open step (the latest) has no floor yet, nor has a step seen fewer than
    STEP_MIN_SAMPLES times: with steps shorter than a few sampling periods, one sample is a random point of the
    step, not its low point (the time-based FloorSeries covers those programs)."""

    def __init__(self):
        self.steps = collections.deque(maxlen=STEP_FLOORS)  # [index, minimum, samples, maximum]

    def add(self, step, value):
        """One sample in step `step`; True when it opened a new step (the one before it closed)."""
        steps = self.steps
        if steps:
            last = steps[-1]
            if step == last[0]:
                if value < last[1]:
                    last[1] = value
                if value > last[3]:
                    last[3] = value
                last[2] += 1
                return False
            if step < last[0]:
                steps.clear()  # the counters restarted (or moved from batches to optimizer steps)
        steps.append([step, value, 1, value])
        return len(steps) > 1

    def closed(self):
        """(floor, peak) of the closed steps that have a floor, oldest first."""
        return [(s[1], s[3]) for s in list(self.steps)[:-1] if s[2] >= STEP_MIN_SAMPLES]

    def floors(self):
        return [f for f, _ in self.closed()]

    def rising(self):
        closed = self.closed()[-STEP_WINDOW:]
        return bool(closed) and steps_rising([f for f, _ in closed], closed[0][1])


def steps_rising(floors, first_peak=None):
    """The last STEP_WINDOW step floors rose: at least STEP_RISES rises of STEP_RISE_BYTES and STEP_RISE_SHARE
    each, STEP_TOTAL_BYTES in all, and (given the highest sample of the window's first step) up to that peak
    at least. A sampler in step with the program drifts slowly in phase, so its floors of a steady loop can rise
    step after step, but never above what the loop itself reaches: that takes memory that stays."""
    floors = floors[-STEP_WINDOW:]
    if len(floors) < STEP_WINDOW:
        return False
    rises = 0
    for a, b in zip(floors, floors[1:]):
        if b - a >= max(STEP_RISE_BYTES, a * STEP_RISE_SHARE):
            rises += 1
    if first_peak is not None and floors[-1] < first_peak:
        return False
    return rises >= STEP_RISES and floors[-1] - floors[0] >= STEP_TOTAL_BYTES


def _min(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a if a <= b else b


class _Device(object):
    __slots__ = ("limit", "limit_read", "allocated", "reserved", "retries", "floor", "next_growth", "growing",
                 "steps", "growing_steps", "boundary", "boundary_rising", "last_boundary", "small_run")

    def __init__(self):
        self.limit = None  # bytes, None while unknown
        self.limit_read = False
        self.allocated = 0
        self.reserved = 0
        self.retries = 0  # PyTorch's count starts at 0: retries before the first look count too
        self.floor = FloorSeries()
        self.next_growth = None
        self.growing = False
        self.steps = StepFloors()
        self.growing_steps = False
        self.boundary = collections.deque(maxlen=STEP_WINDOW)  # readings at steps' boundaries (_boundary)
        self.boundary_rising = False
        self.last_boundary = None
        self.small_run = 0  # boundary readings in a row, each above the one before


class Arming(object):
    """The state of the history and the rule that moves it. `sample` takes one device's figures and says what to
    do: ("armed", reason, device), ("disarmed", "pressure_gone", device) or None. The caller acts, and calls
    `failed` if PyTorch refused: automatic arming then stops for good."""

    def __init__(self, mode, entries):
        self.mode = mode  # auto | requested | off
        self.entries = entries
        self.armed = None  # the reason it is armed for, or None
        self.device = None  # the device whose figures armed it
        self.last_trigger = None
        self.devices = {}
        self.grew = False  # a growth rule fired on some device, once (the exit then walks the holders)

    def arm_requested(self):
        self.armed = "requested"

    def needs_limit(self, device):
        d = self.devices.get(device)
        return self.mode == "auto" and (d is None or not d.limit_read)

    def set_limit(self, device, limit):
        d = self._device(device)
        d.limit = limit if limit and limit > 0 else None
        d.limit_read = True

    def sample(self, device, t, allocated, reserved, retries, step=None):
        """`step`: the program's step index (optimizer steps, else batches), None if it has none."""
        d = self._device(device)
        reason = self._trigger(d, t, allocated, reserved, retries, step)
        if self.mode != "auto":
            return None  # the growth rules still run: the exit asks them whether to walk the holders
        if reason is not None:
            self.last_trigger = t
            if self.armed is None:
                self.armed = reason
                self.device = device
                return ("armed", reason, device)
            return None
        if self.armed is not None and t - self.last_trigger >= HOLD_S and self._relieved():
            device = self.device
            self.armed = None
            self.device = None
            return ("disarmed", "pressure_gone", device)
        return None

    def failed(self):
        """PyTorch refused to arm or disarm: stop deciding (the history stays as it is)."""
        self.mode = "off"

    def _device(self, device):
        d = self.devices.get(device)
        if d is None:
            d = self.devices[device] = _Device()
        return d

    def growing(self):
        """Memory grew: a growth rule fired once, or says so now on some device."""
        return self.grew or any(d.growing or d.growing_steps or d.boundary_rising for d in self.devices.values())

    def boundary(self, device, allocated):
        """Allocated bytes read at a step's boundary (the program's thread): the same moment of each step, so
        their rises are what steps kept, with no sampler phase to mistake for growth."""
        d = self._device(device)
        d.boundary.append(allocated)
        d.boundary_rising = steps_rising(list(d.boundary))
        # Something small kept every step (a loss tensor kept without .item(): 512 bytes a step): too small for
        # the rule above, but the exit's walk should name it. Every one of SMALL_RUN readings in a row rose.
        if d.last_boundary is not None:
            d.small_run = d.small_run + 1 if allocated > d.last_boundary else 0
        d.last_boundary = allocated
        if d.small_run >= SMALL_RUN:
            self.grew = True

    def _trigger(self, d, t, allocated, reserved, retries, step=None):
        d.allocated = allocated
        d.reserved = reserved
        d.floor.add(t, allocated)
        if step is not None and d.steps.add(step, allocated):
            d.growing_steps = d.steps.rising()
        d.growing_steps = d.growing_steps or d.boundary_rising
        retried = retries > d.retries
        d.retries = retries  # reset_accumulated_memory_stats() takes it back to 0: follow it
        if d.next_growth is None or t >= d.next_growth:
            d.next_growth = t + GROWTH_EVERY_S
            d.growing = d.floor.rising()
        if retried:
            return "retry"
        if d.limit and allocated >= PRESSURE_SHARE * d.limit:
            return "pressure"
        if d.growing_steps:
            self.grew = True
            return "growth_steps"
        if d.growing:
            self.grew = True
            return "growth"
        return None

    def _relieved(self):
        for d in self.devices.values():
            if d.limit and d.allocated >= RELIEF_SHARE * d.limit:
                return False
        return True
