/* Two threads allocate and free 4 KiB as fast as they can while the main thread asks five times for 1 TiB, which
 * fails. Each failure's out-of-memory record goes to the collector on the socket, after a drain that takes the
 * other threads' later events: the record must stay at its own time (within the clocks' error), not be held
 * behind them, or the post-mortem's snapshot would hold what they did after the failure. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "driver.h"

static CUcontext ctx;
static volatile int stop = 0;

static void *worker(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    while (!stop) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 4096) == 0) cuMemFree_v2(p);
    }
    return NULL;
}

int main(void) {
    if (driver_setup(&ctx)) {
        fprintf(stderr, "no driver\n");
        return 2;
    }
    pthread_t t[2];
    for (int k = 0; k < 2; k++) pthread_create(&t[k], NULL, worker, NULL);
    usleep(50000);
    for (int i = 0; i < 5; i++) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, (size_t)1 << 40) == 0) return 1;
        usleep(20000);
    }
    stop = 1;
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
    printf("ok\n");
    return 0;
}
