/* The few driver types and exported names (cuda.h maps cuMemAlloc onto cuMemAlloc_v2) the test programs call,
 * without the CUDA toolkit's headers: they link against the simulated driver, or the real one. */
#ifndef VRAMTRACE_TEST_DRIVER_H
#define VRAMTRACE_TEST_DRIVER_H
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);

/* cuInit, device 0's primary context made current; 0 on success. */
static inline int driver_setup(CUcontext *ctx) {
    CUdevice dev;
    return cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(ctx, dev) || cuCtxSetCurrent(*ctx);
}
#endif
