// A CUDA runtime program with a known allocation pattern, for scripts/gpu/check.sh.
// Build: nvcc -O2 -o /tmp/allocs allocs.cu            (static cudart, nvcc's default)
//        nvcc -O2 -cudart shared -o ... allocs.cu     (libcudart.so)
//        nvcc -O2 --default-stream per-thread ...     (stream 0 is the per-thread stream: the _ptsz entry points)
// Run:   allocs basic   cudaMalloc/cudaFree, then cudaMallocAsync/cudaFreeAsync on a created stream and on stream 0
//        allocs extra   as basic, plus cudaMallocPitch (counted as pitch x height) and cudaMallocManaged
// Prints `RESULT framework_peak_bytes=<n> expected_bytes=<n> allocations=<n>`: the exact peak of the bytes it held
// (its own bookkeeping, in call order). Exit 1 with one line on any CUDA error.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

static long long held = 0, peak = 0;
static int allocations = 0;

static void took(size_t bytes) {
    held += (long long)bytes;
    if (held > peak) peak = held;
    allocations++;
}
static void gave(size_t bytes) { held -= (long long)bytes; }

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "allocs: %s failed: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__); \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    const bool extra = argc > 1 && strcmp(argv[1], "extra") == 0;
    const size_t MiB = 1 << 20;
    CK(cudaSetDevice(0));
    CK(cudaFree(0));  // creates the context; frees nothing

    // Synchronous: cuMemAlloc_v2 / cuMemFree_v2.
    const size_t sync_mib[6] = {16, 32, 64, 8, 128, 2};
    void *s[6];
    for (int i = 0; i < 6; i++) {
        CK(cudaMalloc(&s[i], sync_mib[i] * MiB));
        took(sync_mib[i] * MiB);
    }
    CK(cudaFree(s[1]));  gave(sync_mib[1] * MiB);
    CK(cudaFree(s[3]));  gave(sync_mib[3] * MiB);

    void *pitched = nullptr, *managed = nullptr;
    size_t pitch = 0, pitched_bytes = 0;
    if (extra) {  // held through the peak below
        // 1000 rows of 3000 bytes: the driver picks the pitch; the shim counts pitch x height.
        CK(cudaMallocPitch(&pitched, &pitch, 3000, 1000));
        pitched_bytes = pitch * 1000;
        took(pitched_bytes);
        CK(cudaMallocManaged(&managed, 8 * MiB, cudaMemAttachGlobal));
        took(8 * MiB);
        CK(cudaMemset(managed, 1, 8 * MiB));
        CK(cudaDeviceSynchronize());
        printf("pitch=%zu pitched_bytes=%zu managed_bytes=%zu\n", pitch, pitched_bytes, (size_t)(8 * MiB));
    }

    // Stream-ordered: cuMemAllocAsync / cuMemFreeAsync (the _ptsz variants on stream 0 when built per-thread).
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t async_mib[5] = {48, 96, 24, 192, 4};
    void *a[5];
    for (int i = 0; i < 5; i++) {
        cudaStream_t which = (i % 2) ? st : (cudaStream_t)0;
        CK(cudaMallocAsync(&a[i], async_mib[i] * MiB, which));
        took(async_mib[i] * MiB);
    }
    CK(cudaFreeAsync(a[1], st));          gave(async_mib[1] * MiB);
    CK(cudaFreeAsync(a[2], (cudaStream_t)0)); gave(async_mib[2] * MiB);
    void *late;
    CK(cudaMallocAsync(&late, 80 * MiB, st));
    took(80 * MiB);
    CK(cudaStreamSynchronize(st));
    CK(cudaDeviceSynchronize());

    // Everything back, in a mixed order.
    CK(cudaFreeAsync(late, st));          gave(80 * MiB);
    CK(cudaFreeAsync(a[0], (cudaStream_t)0)); gave(async_mib[0] * MiB);
    CK(cudaFreeAsync(a[3], st));          gave(async_mib[3] * MiB);
    CK(cudaFreeAsync(a[4], (cudaStream_t)0)); gave(async_mib[4] * MiB);
    CK(cudaStreamSynchronize(st));
    CK(cudaDeviceSynchronize());
    const int rest[4] = {0, 2, 4, 5};
    for (int k = 0; k < 4; k++) {
        const int i = rest[k];
        CK(cudaFree(s[i]));
        gave(sync_mib[i] * MiB);
    }
    if (extra) {
        CK(cudaFree(pitched)); gave(pitched_bytes);
        CK(cudaFree(managed)); gave(8 * MiB);
    }
    CK(cudaStreamDestroy(st));
    printf("RESULT framework_peak_bytes=%lld expected_bytes=%lld allocations=%d held_at_end=%lld\n", peak, peak,
           allocations, held);
    return 0;
}
