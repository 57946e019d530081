// Memory past the cap where no shim sees it (issue 50, item 4), for scripts/gpu/cap_pulses.sh. Run without the
// preload (`env -u LD_PRELOAD`) under `vramtrace run --cap 1GiB`:
//   escape pulse N BYTES ON_MS OFF_MS   N times: cuMemAlloc BYTES, hold ON_MS, cuMemFree, OFF_MS with nothing held
//   escape hold BYTES MS                cuMemAlloc BYTES, hold MS, free
// Prints `ready` once its context is made, and on SIGTERM (the cap's stop) `stopped after <ms> ms, <k> pulses
// begun` (ms since its first allocation), then exits 143. Exit 1 on a CUDA error.
// Build: gcc -O2 -o escape escape.c -I$CUDA/include -lcuda
#include <cuda.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t begun = 0;
static struct timespec t0;
static volatile sig_atomic_t started = 0;

static long ms_since(const struct timespec *a) {
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (b.tv_sec - a->tv_sec) * 1000 + (b.tv_nsec - a->tv_nsec) / 1000000;
}

static void on_term(int sig) {
    char buf[128];
    long ms = started ? ms_since(&t0) : -1;
    int n = snprintf(buf, sizeof buf, "stopped after %ld ms, %d pulses begun (pid %d)\n", ms, (int)begun,
                     (int)getpid());
    if (write(1, buf, n) < 0) {}
    _exit(128 + sig);
}

static void nap(long ms) {
    struct timespec d = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&d, &d) != 0) {}
}

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        CUresult r_ = (x);                                                                                     \
        if (r_ != CUDA_SUCCESS) {                                                                              \
            printf("FAIL %s: %d\n", #x, (int)r_);                                                              \
            return 1;                                                                                          \
        }                                                                                                      \
    } while (0)

int main(int argc, char **argv) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, 0);
    setvbuf(stdout, 0, _IOLBF, 0);
    if (argc < 4) {
        fprintf(stderr, "usage: escape pulse N BYTES ON_MS OFF_MS | hold BYTES MS\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    printf("ready pid=%d ld_preload=%s\n", (int)getpid(), getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "(unset)");
    clock_gettime(CLOCK_MONOTONIC, &t0);
    started = 1;
    if (!strcmp(argv[1], "pulse") && argc == 6) {
        int n = atoi(argv[2]);
        size_t bytes = strtoull(argv[3], 0, 10);
        long on = atol(argv[4]), off = atol(argv[5]);
        for (int i = 0; i < n; i++) {
            begun = i + 1;
            CK(cuMemAlloc(&p, bytes));
            CK(cuMemsetD8(p, 1, bytes));
            CK(cuCtxSynchronize());
            nap(on);
            CK(cuMemFree(p));
            nap(off);
        }
        printf("finished %d pulses in %ld ms\n", n, ms_since(&t0));
    } else if (!strcmp(argv[1], "hold")) {
        size_t bytes = strtoull(argv[2], 0, 10);
        begun = 1;
        CK(cuMemAlloc(&p, bytes));
        CK(cuMemsetD8(p, 1, bytes));
        CK(cuCtxSynchronize());
        printf("holding %zu\n", bytes);
        nap(atol(argv[3]));
        CK(cuMemFree(p));
        printf("finished after %ld ms\n", ms_since(&t0));
    } else {
        return 2;
    }
    return 0;
}
