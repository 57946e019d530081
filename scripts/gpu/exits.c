// A driver-API program that allocates 5 x 64 MiB and ends on the next instruction: `_exit(3)` or SIGKILL (or,
// with `hold`, `_exit(3)` three seconds later). For
// scripts/gpu/lost.sh (issue 9: nothing lost). Build: gcc -O2 -o exits exits.c -I$CUDA/include -lcuda
#include <cuda.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p[5];
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "exits: CUDA set-up failed\n");
        return 1;
    }
    for (int i = 0; i < 5; i++) {
        if (cuMemAlloc(&p[i], 64u << 20)) {
            fprintf(stderr, "exits: cuMemAlloc failed\n");
            return 1;
        }
    }
    if (argc > 1 && strcmp(argv[1], "kill") == 0) kill(getpid(), SIGKILL);
    // Held for a while first: many at once outnumber the collector's descriptors (lost.sh, case 4).
    if (argc > 1 && strcmp(argv[1], "hold") == 0) sleep(3);
    _exit(3);
}
