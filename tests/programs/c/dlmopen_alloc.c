/* A program of the job that reaches the driver through a second copy of it, in a link-map namespace of its
 * own (dlmopen LM_ID_NEWLM): the preloaded shim lives in the first namespace only and never sees the call.
 * Allocates BYTES (argv[1]) on device 0, prints "held", sleeps MS (argv[2]), exits 0. The cap's GPU check
 * (collector/src/cap_check.rs) must catch it.
 *
 *   cc -O1 -o dlmopen_alloc dlmopen_alloc.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*init_t)(unsigned int);
typedef int (*get_t)(int *, int);
typedef int (*retain_t)(void **, int);
typedef int (*set_t)(void *);
typedef int (*alloc_t)(unsigned long long *, size_t);

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    size_t bytes = strtoull(argv[1], 0, 10);
    void *h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("FAIL dlmopen %s\n", dlerror()); return 1; }
    init_t init = (init_t)dlsym(h, "cuInit");
    get_t get = (get_t)dlsym(h, "cuDeviceGet");
    retain_t retain = (retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
    set_t set = (set_t)dlsym(h, "cuCtxSetCurrent");
    alloc_t alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
    if (!init || !get || !retain || !set || !alloc) { printf("FAIL symbols\n"); return 1; }
    int dev = 0; void *ctx = 0; unsigned long long p = 0;
    if (init(0) || get(&dev, 0) || retain(&ctx, dev) || set(ctx) || alloc(&p, bytes)) {
        printf("FAIL driver\n");
        return 1;
    }
    printf("held\n");
    fflush(stdout);
    usleep(1000 * strtoul(argv[2], 0, 10));
    return 0;
}
