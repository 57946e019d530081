/* Allocates on the main thread, starts a thread that allocates a little later, then ends the main thread with
 * pthread_exit: the process lives on until its last thread ends, then exits 0, running its exit handlers (one
 * frees the main thread's allocation). Under vramtrace run, the shim's own thread must not be that last thread
 * (a job that ended this way once never finished), and the handler's free must be recorded. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "driver.h"
#define CUDA_SUCCESS 0

static CUcontext ctx;
static CUdeviceptr first;

static void free_first(void) {
    cuCtxSetCurrent(ctx);
    cuMemFree_v2(first);
}

static void *late(void *arg) {
    (void)arg;
    usleep(200000);
    cuCtxSetCurrent(ctx);
    CUdeviceptr p;
    if (cuMemAlloc_v2(&p, 2 << 20) != CUDA_SUCCESS) {
        fprintf(stderr, "late cuMemAlloc failed\n");
    }
    return NULL;
}

int main(void) {
    pthread_t t;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS || cuMemAlloc_v2(&first, 1 << 20) != CUDA_SUCCESS) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    atexit(free_first);
    pthread_create(&t, NULL, late, NULL);
    pthread_exit(NULL);
}
