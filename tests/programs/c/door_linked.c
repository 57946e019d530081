/* Door 3: a C program linked with -lcuda, calling the driver through the PLT by the versioned names
 * cuda.h's #defines produce (cuMemAlloc -> cuMemAlloc_v2, per-thread default stream -> *_ptsz, ...).
 * Runs the PATTERN of tests/programs/PATTERN.md; exit 0 after "PASS door_linked", 1 after "FAIL <why>".
 *
 *   cc -O1 -o door_linked door_linked.c -L<dir with libcuda.so> -lcuda -lpthread
 *   door_linked [--repeat N] [--threads T]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUmemoryPool;

typedef struct {
    unsigned int type;
    int id;
} CUmemLocation;

typedef struct {
    unsigned int type;
    unsigned int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct {
    CUmemLocation location;
    unsigned int flags;
} CUmemAccessDesc;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define MIB ((size_t)1 << 20)

/* The driver's exported names, as cuda.h maps the API names onto them. */
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuStreamCreate(CUstream *phStream, unsigned int flags);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);

static int repeat = 1, threads = 1;

static void fail(const char *what, CUresult got, CUresult want) {
    printf("FAIL door_linked: %s returned %d, expected %d\n", what, got, want);
    fflush(stdout);
    exit(1);
}

#define EXPECT(call, want)                  \
    do {                                    \
        CUresult rc_ = (call);              \
        if (rc_ != (want)) fail(#call, rc_, (want)); \
    } while (0)
#define OK(call) EXPECT(call, CUDA_SUCCESS)
#define CHECK(cond)                                                   \
    do {                                                              \
        if (!(cond)) {                                                \
            printf("FAIL door_linked: check failed: %s\n", #cond);    \
            fflush(stdout);                                           \
            exit(1);                                                  \
        }                                                             \
    } while (0)

static void bind_device0(void) {
    CUdevice dev;
    CUcontext ctx;
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
}

/* Steps 1-4; returns the (freed) address of A. */
static CUdeviceptr steps_1_to_4(void) {
    CUdeviceptr a = 0, b = 0, c = 0, d = 0, e = 0, f = 0, g = 0, r = 0;
    size_t pitch = 0, free_b = 0, total_b = 0;
    CUstream s = NULL;
    CUmemoryPool pool = NULL;
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop;
    CUmemAccessDesc access;

    /* 1 */
    OK(cuMemAlloc_v2(&a, 1 * MIB));
    OK(cuMemAllocPitch_v2(&b, &pitch, 1000, 100, 4));
    CHECK(pitch == 1024);
    OK(cuMemAllocManaged(&c, 2 * MIB, 1 /* CU_MEM_ATTACH_GLOBAL */));
    CHECK(a && b && c);
    /* 2 */
    OK(cuStreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */));
    OK(cuDeviceGetDefaultMemPool(&pool, 0));
    OK(cuMemAllocAsync(&d, 3 * MIB, s));
    OK(cuMemAllocAsync_ptsz(&e, 4 * MIB, s));
    OK(cuMemAllocFromPoolAsync(&f, 5 * MIB, pool, s));
    OK(cuMemAllocFromPoolAsync_ptsz(&g, 6 * MIB, pool, s));
    CHECK(d && e && f && g);
    /* 3 */
    memset(&prop, 0, sizeof prop);
    prop.type = 1;          /* CU_MEM_ALLOCATION_TYPE_PINNED */
    prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
    prop.location.id = 1;
    OK(cuMemCreate(&h, 2 * MIB, &prop, 0));
    OK(cuMemAddressReserve(&r, 4 * MIB, 0, 0, 0));
    CHECK(r != 0 && r % (2 * MIB) == 0);
    OK(cuMemMap(r, 2 * MIB, 0, h, 0));
    access.location.type = 1;
    access.location.id = 1;
    access.flags = 3; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
    OK(cuMemSetAccess(r, 2 * MIB, &access, 1));
    OK(cuMemGetInfo_v2(&free_b, &total_b));
    CHECK(total_b > 0 && free_b <= total_b);
    /* 4 */
    OK(cuMemFree_v2(a));
    OK(cuMemFree_v2(b));
    OK(cuMemFree_v2(c));
    OK(cuMemFreeAsync(d, s));
    OK(cuMemFreeAsync(f, s));
    OK(cuMemFreeAsync_ptsz(e, s));
    OK(cuMemFreeAsync_ptsz(g, s));
    OK(cuStreamSynchronize(s));
    OK(cuMemUnmap(r, 2 * MIB));
    OK(cuMemAddressFree(r, 4 * MIB));
    OK(cuMemRelease(h));
    OK(cuStreamDestroy_v2(s));
    return a;
}

static void *worker(void *out) {
    int i;
    bind_device0();
    for (i = 0; i < repeat; i++) *(CUdeviceptr *)out = steps_1_to_4();
    return NULL;
}

int main(int argc, char **argv) {
    int i;
    CUdeviceptr a = 0, x = 0, l = 0;
    size_t total = 0;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
            repeat = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else {
            printf("FAIL door_linked: unknown argument %s (expected --repeat N, --threads T)\n", argv[i]);
            return 1;
        }
    }
    if (repeat < 1 || threads < 1) {
        printf("FAIL door_linked: --repeat and --threads take positive numbers\n");
        return 1;
    }

    OK(cuInit(0));
    bind_device0();
    if (threads == 1) {
        worker(&a);
    } else {
        pthread_t *ts = calloc((size_t)threads, sizeof *ts);
        CUdeviceptr *as = calloc((size_t)threads, sizeof *as);
        for (i = 0; i < threads; i++) CHECK(pthread_create(&ts[i], NULL, worker, &as[i]) == 0);
        for (i = 0; i < threads; i++) pthread_join(ts[i], NULL);
        a = as[0];
        free(ts);
        free(as);
    }
    /* 5 */
    OK(cuDeviceTotalMem_v2(&total, 0));
    EXPECT(cuMemAlloc_v2(&x, total + 1 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(cuMemFree_v2(0xdead0000ULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE);
    /* 6 */
    OK(cuMemAlloc_v2(&l, 7 * MIB));
    CHECK(l != 0);
    printf("PASS door_linked repeat=%d threads=%d\n", repeat, threads);
    return 0;
}
