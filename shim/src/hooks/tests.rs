use super::bypass_cost;

/// The line said for an unwrapped function names what it really costs: an allocation escapes the cap, a
/// free or a teardown stays counted, a query shows the GPU's own figures.
#[test]
fn an_unwrapped_function_is_said_with_its_own_cost() {
    for (name, says) in [
        ("cuMemAlloc", "allocated through it is not capped"),
        ("cuMemAllocAsync", "allocated through it is not capped"),
        ("cuMemCreate", "allocated through it is not capped"),
        ("cuMemFree", "freed through it stays counted"),
        ("cuMemFreeAsync", "freed through it stays counted"),
        ("cuMemRelease", "freed through it stays counted"),
        ("cuMemGetInfo", "the GPU's own figures"),
        ("cuDeviceTotalMem", "the GPU's own figures"),
        ("cuCtxCreate", "created through it is unknown to the cap"),
        ("cuCtxDestroy", "torn down through it is not seen"),
        (
            "cuDevicePrimaryCtxRelease",
            "torn down through it is not seen",
        ),
        (
            "cuDevicePrimaryCtxReset",
            "torn down through it is not seen",
        ),
        ("cuMemMap", "address-space changes"),
        ("cuMemAddressReserve", "address-space changes"),
    ] {
        assert!(
            bypass_cost(name.as_bytes()).contains(says),
            "{name}: {}",
            bypass_cost(name.as_bytes())
        );
    }
}
