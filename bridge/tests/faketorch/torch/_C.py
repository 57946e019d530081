from . import cuda as _cuda

_observers = []


def _cuda_attach_out_of_memory_observer(fn):
    if _cuda._backend != "native":
        raise RuntimeError("cudaMallocAsync does not yet support attachOutOfMemoryObserver")
    _observers.append(fn)


def _cuda_isHistoryEnabled():
    return _cuda._history["on"]


def _cuda_memoryStats(device):
    a = _cuda._alloc.get(device)
    if a is None:
        raise RuntimeError("invalid device")
    def arr(v, peak=None):
        return {"all": {"current": v, "peak": v if peak is None else peak, "allocated": v, "freed": 0}}
    return {
        "allocated_bytes": arr(a.allocated, a.allocated_peak),
        "reserved_bytes": arr(a.reserved, a.reserved_peak),
        "active_bytes": arr(a.allocated),
        "inactive_split_bytes": arr(a.inactive_split()),
        "requested_bytes": arr(a.allocated),
        "num_alloc_retries": a.retries,
        "num_ooms": a.ooms,
        "max_split_size": -1,
    }
