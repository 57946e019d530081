"""When to keep PyTorch's allocation history: pure decisions over the sampler's figures (no torch, no clock).

History with Python stacks costs up to +26% a step on a CPU-bound loop (H100, PyTorch 2.11), so by default it is
armed only while it can pay: when the allocator is at its limit (it flushed its cache and retried), when
allocated bytes come near the limit, or when the floor of allocated bytes keeps rising (a leak, whose tensors'
lines `report` wants). It is disarmed when all of that has been gone for a while.

Settings (environment): VRAMTRACE_TORCH_HISTORY unset, empty or `auto`: automatic, a ring of
VRAMTRACE_TORCH_HISTORY_AUTO_ENTRIES entries (default 20000); N > 0: on from the start with N entries
(`requested`); `off` or 0: never."""

import os

MIB = 1 << 20

# Triggers.
PRESSURE = 0.90  # allocated >= this share of the limit
RELIEF = 0.80  # ...and disarming waits until allocated is below this share on every device
HOLD_S = 10.0  # and until no trigger has fired for this long
GROWTH_EVERY_S = 1.0  # the growth detector runs at most this often per device

# The growth detector.
BUCKETS = 64  # at most this many bucket minima per device, whatever the run's length
BUCKET_S = 1.0  # the first buckets' width; it doubles at each pairwise merge
MIN_SPAN_S = 60.0  # a shorter series says nothing yet: warm-up, or one long step's ramp, looks like growth
WINDOWS = 8
RUN = 4  # rises of the trailing window minima that make growth
STEP_BYTES = MIB  # each rise at least this...
STEP_SHARE = 0.01  # ...and this share of the minimum before it

DEFAULT_AUTO_ENTRIES = 20000
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
    return "auto", ring if ring > 0 else DEFAULT_AUTO_ENTRIES


class FloorSeries(object):
    """One device's allocated bytes since its first non-zero sample, in bounded memory: the minimum of each time
    bucket. When a 65th bucket would be needed, neighbours merge pairwise and the width doubles, so the whole run
    fits in 64 numbers and a sample costs O(1) amortised."""

    def __init__(self, bucket_s=BUCKET_S):
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
        while i >= BUCKETS:
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

    def window_minima(self, n=WINDOWS):
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
        if self.span() < MIN_SPAN_S:
            return False
        return rising_run(self.window_minima()) >= RUN


def rising_run(minima):
    """How many of the last minima are each above the one before by at least STEP_BYTES and STEP_SHARE of it."""
    run = 0
    i = len(minima) - 1
    while i > 0 and minima[i] - minima[i - 1] >= max(STEP_BYTES, minima[i - 1] * STEP_SHARE):
        run += 1
        i -= 1
    return run


def _min(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a if a <= b else b


class _Device(object):
    __slots__ = ("limit", "limit_read", "allocated", "reserved", "retries", "floor", "next_growth", "growing")

    def __init__(self):
        self.limit = None  # bytes, None while unknown
        self.limit_read = False
        self.allocated = 0
        self.reserved = 0
        self.retries = 0  # PyTorch's count starts at 0: retries before the first look count too
        self.floor = FloorSeries()
        self.next_growth = None
        self.growing = False


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

    def arm_requested(self):
        self.armed = "requested"

    def needs_limit(self, device):
        d = self.devices.get(device)
        return self.mode == "auto" and (d is None or not d.limit_read)

    def set_limit(self, device, limit):
        d = self._device(device)
        d.limit = limit if limit and limit > 0 else None
        d.limit_read = True

    def sample(self, device, t, allocated, reserved, retries):
        if self.mode != "auto":
            return None
        d = self._device(device)
        reason = self._trigger(d, t, allocated, reserved, retries)
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

    def _trigger(self, d, t, allocated, reserved, retries):
        d.allocated = allocated
        d.reserved = reserved
        d.floor.add(t, allocated)
        retried = retries > d.retries
        d.retries = retries  # reset_accumulated_memory_stats() takes it back to 0: follow it
        if d.next_growth is None or t >= d.next_growth:
            d.next_growth = t + GROWTH_EVERY_S
            d.growing = d.floor.rising()
        if retried:
            return "retry"
        if d.limit and allocated >= PRESSURE * d.limit:
            return "pressure"
        if d.growing:
            return "growth"
        return None

    def _relieved(self):
        for d in self.devices.values():
            if d.limit and d.allocated >= RELIEF * d.limit:
                return False
        return True
