// A driver-API program that allocates MIB mebibytes in one cuMemAlloc, prints the driver's free bytes before it,
// and ends as told: `exit` (returns from main, the shim says goodbye), `_exit`, or `kill` (SIGKILL on itself).
// For scripts/gpu/sequence.sh: `a; b` where a and b cannot both fit on the device.
// Build: gcc -O2 -o sequence sequence.c -I$CUDA/include -lcuda
#include <cuda.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    size_t free_b = 0, total_b = 0;
    if (argc < 3) {
        fprintf(stderr, "usage: sequence MIB exit|_exit|kill\n");
        return 2;
    }
    size_t bytes = (size_t)strtoull(argv[1], NULL, 10) << 20;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "sequence: CUDA set-up failed\n");
        return 1;
    }
    cuMemGetInfo(&free_b, &total_b);
    CUresult rc = cuMemAlloc(&p, bytes);
    printf("pid %d: free %zu of %zu before; cuMemAlloc(%zu) = %d\n", getpid(), free_b, total_b, bytes, rc);
    fflush(stdout);
    if (rc) return 1;
    if (strcmp(argv[2], "kill") == 0) kill(getpid(), SIGKILL);
    if (strcmp(argv[2], "_exit") == 0) _exit(0);
    return 0;
}
