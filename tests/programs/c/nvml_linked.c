/* NVML's memory figures as a program linked with -lnvidia-ml sees them (the PLT binds nvmlDeviceGetMemoryInfo and
 * nvmlDeviceGetMemoryInfo_v2 by name), after the driver is initialised on a device and some memory allocated.
 *
 *   cc -O1 -o nvml_linked nvml_linked.c -L<dir with libnvidia-ml.so and libcuda.so> -lnvidia-ml -lcuda
 *   nvml_linked DEVICE BYTES
 *
 * Prints one line per NVML device, as tests/programs/src/bin/nvml_probe.rs does:
 *   linked <nvml index> <uuid> v1 <rc> <total> <free> <used> v2 <rc> <total> <reserved> <free> <used>
 * then "PASS"; exit 1 after "FAIL <why>" when a step other than the figures fails.
 */
#include <stdio.h>
#include <stdlib.h>

#include "driver.h"

typedef unsigned int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);

static void fail(const char *what, int rc) {
    printf("FAIL %s returned %d\n", what, rc);
    exit(1);
}

int main(int argc, char **argv) {
    int ordinal = argc > 1 ? atoi(argv[1]) : 0;
    size_t bytes = argc > 2 ? strtoull(argv[2], NULL, 10) : 0;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    int rc;
    unsigned int n, i;

    if ((rc = cuInit(0)) != 0) fail("cuInit", rc);
    if ((rc = cuDeviceGet(&dev, ordinal)) != 0) fail("cuDeviceGet", rc);
    if ((rc = cuDevicePrimaryCtxRetain(&ctx, dev)) != 0) fail("cuDevicePrimaryCtxRetain", rc);
    if ((rc = cuCtxSetCurrent(ctx)) != 0) fail("cuCtxSetCurrent", rc);
    if (bytes > 0 && (rc = cuMemAlloc_v2(&p, bytes)) != 0) fail("cuMemAlloc_v2", rc);
    if ((rc = (int)nvmlInit_v2()) != 0) fail("nvmlInit_v2", rc);
    if ((rc = (int)nvmlDeviceGetCount_v2(&n)) != 0) fail("nvmlDeviceGetCount_v2", rc);
    for (i = 0; i < n; i++) {
        nvmlDevice_t d;
        char uuid[96];
        nvmlMemory_t m = {0};
        nvmlMemory_v2_t m2 = {0};
        nvmlReturn_t r1, r2;
        if ((rc = (int)nvmlDeviceGetHandleByIndex_v2(i, &d)) != 0) fail("nvmlDeviceGetHandleByIndex_v2", rc);
        if ((rc = (int)nvmlDeviceGetUUID(d, uuid, sizeof uuid)) != 0) fail("nvmlDeviceGetUUID", rc);
        r1 = nvmlDeviceGetMemoryInfo(d, &m);
        m2.version = nvmlMemory_v2;
        r2 = nvmlDeviceGetMemoryInfo_v2(d, &m2);
        printf("linked %u %s v1 %u %llu %llu %llu v2 %u %llu %llu %llu %llu\n", i, uuid, r1, m.total, m.free, m.used, r2,
               m2.total, m2.reserved, m2.free, m2.used);
    }
    printf("PASS\n");
    return 0;
}
