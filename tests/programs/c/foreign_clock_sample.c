/* A caller of the bridge's door that stamps a framework sample with its own clock (wall time, decades ahead of
 * CLOCK_MONOTONIC), between two allocations. The sample is the caller's to misplace; it must not drag the
 * process's later events (or its end) along with it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "driver.h"

int main(void) {
    CUcontext ctx;
    if (driver_setup(&ctx)) {
        fprintf(stderr, "no driver\n");
        return 2;
    }
    CUdeviceptr a, b;
    cuMemAlloc_v2(&a, 1 << 20);
    int (*sample)(unsigned, unsigned, const uint64_t *, unsigned, uint64_t) =
        (int (*)(unsigned, unsigned, const uint64_t *, unsigned, uint64_t))dlsym(RTLD_DEFAULT,
                                                                              "vramtrace_framework_sample");
    if (!sample) {
        fprintf(stderr, "no vramtrace_framework_sample\n");
        return 3;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t v[7] = {1, 2, 0, 0, 0, 0, 0};
    sample(1, 0, v, 7, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
    cuMemAlloc_v2(&b, 1 << 20);
    cuMemFree_v2(a);
    cuMemFree_v2(b);
    printf("ok\n");
    return 0;
}
