// Contexts torn down on the real driver (issue 10, item 6), for scripts/gpu/contexts.sh. Run under
// `vramtrace run --cap 8GiB`: each step allocates 6 GiB, tears the context down, and allocates 6 GiB again,
// which the cap must grant (the GPU holds nothing of the first). Also prints what the GPU itself says (free
// bytes from cuMemGetInfo) around each teardown, and whether a cuMemCreate handle outlives a primary reset. Last,
// the legacy cuDevicePrimaryCtxRelease that cuGetProcAddress answers for version 7000.
// Build: gcc -O2 -o contexts contexts.c -I$CUDA/include -lcuda   (CUDA 13: cuCtxCreate is cuCtxCreate_v4)
#include <cuda.h>
#include <stdio.h>

#define GiB (1ull << 30)
static int fails = 0;
static void check(const char *what, CUresult r, CUresult want) {
    printf("%s: rc=%d %s\n", what, (int)r, r == want ? "ok" : "UNEXPECTED");
    if (r != want) fails++;
}
static size_t freemem(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo(&f, &t);
    return f;
}
static void primary(CUdevice dev) {
    CUcontext c;
    cuDevicePrimaryCtxRetain(&c, dev);
    cuCtxSetCurrent(c);
}

int main(void) {
    CUdevice dev;
    CUdeviceptr p;
    cuInit(0);
    cuDeviceGet(&dev, 0);
    primary(dev);
    size_t before = freemem();
    check("reset: first 6 GiB", cuMemAlloc(&p, 6 * GiB), CUDA_SUCCESS);
    size_t held = freemem();
    check("reset: cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset(dev), CUDA_SUCCESS);
    primary(dev);
    size_t after = freemem();
    printf("RESULT reset_gpu_freed_bytes=%lld\n", (long long)after - (long long)held);
    check("reset: 6 GiB again under the 8 GiB cap", cuMemAlloc(&p, 6 * GiB), CUDA_SUCCESS);
    check("reset: 4 GiB more is past the cap", cuMemAlloc(&p, 4 * GiB), CUDA_ERROR_OUT_OF_MEMORY);
    // The primary context released for the last time (each retain above, plus the runtime's none here).
    cuMemFree(p);
    CUresult r;
    int releases = 0;
    do {
        r = cuDevicePrimaryCtxRelease(dev);
        releases++;
    } while (r == CUDA_SUCCESS && releases < 16);
    unsigned flags;
    int active = 1;
    cuDevicePrimaryCtxGetState(dev, &flags, &active);
    printf("RESULT primary_active_after_releases=%d releases=%d\n", active, releases - 1);
    CUcontext ctx;
    check("destroy: cuCtxCreate", cuCtxCreate(&ctx, NULL, 0, dev), CUDA_SUCCESS);
    check("destroy: 6 GiB in a created context", cuMemAlloc(&p, 6 * GiB), CUDA_SUCCESS);
    held = freemem();
    check("destroy: cuCtxDestroy", cuCtxDestroy(ctx), CUDA_SUCCESS);
    check("destroy: cuCtxCreate again", cuCtxCreate(&ctx, NULL, 0, dev), CUDA_SUCCESS);
    after = freemem();
    printf("RESULT destroy_gpu_freed_bytes=%lld\n", (long long)after - (long long)held);
    check("destroy: 6 GiB again under the 8 GiB cap", cuMemAlloc(&p, 6 * GiB), CUDA_SUCCESS);
    cuMemFree(p);
    // A cuMemCreate handle across a context destroy: does the GPU keep it?
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUmemGenericAllocationHandle h;
    check("vmm: cuMemCreate 2 GiB", cuMemCreate(&h, 2 * GiB, &prop, 0), CUDA_SUCCESS);
    held = freemem();
    check("vmm: cuCtxDestroy", cuCtxDestroy(ctx), CUDA_SUCCESS);
    check("vmm: cuCtxCreate", cuCtxCreate(&ctx, NULL, 0, dev), CUDA_SUCCESS);
    after = freemem();
    printf("RESULT vmm_gpu_freed_bytes_by_destroy=%lld\n", (long long)after - (long long)held);
    printf("RESULT vmm_release_after_destroy_rc=%d\n", (int)cuMemRelease(h));
    // The legacy cuDevicePrimaryCtxRelease, as cuGetProcAddress answers it for version 7000 (PyTorch 2.11 asks
    // that): its last release tears the primary context down like the _v2's.
    check("legacy: cuCtxDestroy", cuCtxDestroy(ctx), CUDA_SUCCESS);
    CUresult (*legacy_release)(CUdevice) = NULL;
    check("legacy: cuGetProcAddress(cuDevicePrimaryCtxRelease, 7000)",
          cuGetProcAddress("cuDevicePrimaryCtxRelease", (void **)&legacy_release, 7000, 0, NULL), CUDA_SUCCESS);
    primary(dev);
    check("legacy: 6 GiB in the primary context", cuMemAlloc(&p, 6 * GiB), CUDA_SUCCESS);
    held = freemem();
    releases = 0;
    do {
        r = legacy_release ? legacy_release(dev) : CUDA_ERROR_NOT_FOUND;
        releases++;
    } while (r == CUDA_SUCCESS && releases < 16);
    active = 1;
    cuDevicePrimaryCtxGetState(dev, &flags, &active);
    primary(dev);
    after = freemem();
    printf("RESULT legacy_release_gpu_freed_bytes=%lld active_after=%d\n", (long long)after - (long long)held, active);
    check("legacy: 6 GiB again under the 8 GiB cap", cuMemAlloc(&p, 6 * GiB), CUDA_SUCCESS);
    check("legacy: 4 GiB more is past the cap", cuMemAlloc(&p, 4 * GiB), CUDA_ERROR_OUT_OF_MEMORY);
    printf("RESULT fails=%d start_free=%zu\n", fails, before);
    return fails != 0;
}
