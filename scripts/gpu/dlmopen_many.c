/* Issue 50, item 3, on a real driver: more of the driver's calls through a copy of it in a link-map namespace of
 * its own (dlmopen LM_ID_NEWLM) than tests/programs/c/dlmopen_alloc.c makes: the big allocation, a memset and a
 * synchronize on it, cuMemGetInfo, 4 allocations of 64 MiB freed again, the sleep, then every free and the
 * context's release. With a third argument `base`, the program then also opens the driver the usual way (the
 * first namespace, where a preloaded shim wraps it) and allocates 256 MiB through it, so that a trace holds that
 * allocation and none of the copy's. Every call's status is checked; the program prints one line per phase and
 * exits 0 only if every call succeeded.
 *
 *   cc -O1 -o dlmopen_many dlmopen_many.c -ldl
 *   ./dlmopen_many BYTES MS [base]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef unsigned long long dptr;
typedef int (*init_t)(unsigned int);
typedef int (*get_t)(int *, int);
typedef int (*retain_t)(void **, int);
typedef int (*release_t)(int);
typedef int (*set_t)(void *);
typedef int (*alloc_t)(dptr *, size_t);
typedef int (*free_t)(dptr);
typedef int (*memset_t)(dptr, unsigned char, size_t);
typedef int (*sync_t)(void);
typedef int (*info_t)(size_t *, size_t *);

struct drv {
    init_t init; get_t get; retain_t retain; release_t release; set_t set; alloc_t alloc; free_t free;
    memset_t memset; sync_t sync; info_t info;
};

static int load(void *h, struct drv *d) {
    d->init = (init_t)dlsym(h, "cuInit");
    d->get = (get_t)dlsym(h, "cuDeviceGet");
    d->retain = (retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
    d->release = (release_t)dlsym(h, "cuDevicePrimaryCtxRelease_v2");
    d->set = (set_t)dlsym(h, "cuCtxSetCurrent");
    d->alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
    d->free = (free_t)dlsym(h, "cuMemFree_v2");
    d->memset = (memset_t)dlsym(h, "cuMemsetD8_v2");
    d->sync = (sync_t)dlsym(h, "cuCtxSynchronize");
    d->info = (info_t)dlsym(h, "cuMemGetInfo_v2");
    return d->init && d->get && d->retain && d->release && d->set && d->alloc && d->free && d->memset && d->sync &&
           d->info;
}

#define CHECK(what, call)                                                                                        \
    do {                                                                                                         \
        int r_ = (call);                                                                                         \
        if (r_) {                                                                                                \
            printf("FAIL %s: CUresult %d\n", what, r_);                                                          \
            return 1;                                                                                            \
        }                                                                                                        \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    size_t bytes = strtoull(argv[1], 0, 10);
    int base = argc > 3 && !strcmp(argv[3], "base");
    setvbuf(stdout, 0, _IONBF, 0);
    void *h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("FAIL dlmopen %s\n", dlerror()); return 1; }
    Lmid_t lm = -1;
    dlinfo(h, RTLD_DI_LMID, &lm);
    struct drv d;
    if (!load(h, &d)) { printf("FAIL symbols\n"); return 1; }
    int dev = 0; void *ctx = 0; dptr p = 0, q = 0; size_t fr = 0, tot = 0;
    CHECK("cuInit", d.init(0));
    CHECK("cuDeviceGet", d.get(&dev, 0));
    CHECK("cuDevicePrimaryCtxRetain", d.retain(&ctx, dev));
    CHECK("cuCtxSetCurrent", d.set(ctx));
    CHECK("cuMemAlloc big", d.alloc(&p, bytes));
    printf("copy (namespace %ld): allocated %zu bytes\n", (long)lm, bytes);
    CHECK("cuMemsetD8", d.memset(p, 7, bytes));
    CHECK("cuCtxSynchronize", d.sync());
    CHECK("cuMemGetInfo", d.info(&fr, &tot));
    printf("copy: memset and synchronize done; free %zu of %zu\n", fr, tot);
    for (int i = 0; i < 4; i++) {
        CHECK("cuMemAlloc 64 MiB", d.alloc(&q, 64 << 20));
        CHECK("cuMemFree 64 MiB", d.free(q));
    }
    printf("copy: 4 x 64 MiB allocated and freed\n");
    printf("held\n");
    usleep(1000 * strtoul(argv[2], 0, 10));
    if (base) {
        void *b = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!b) { printf("FAIL dlopen %s\n", dlerror()); return 1; }
        struct drv e;
        if (!load(b, &e)) { printf("FAIL base symbols\n"); return 1; }
        int bd = 0; void *bc = 0; dptr r = 0;
        CHECK("base cuInit", e.init(0));
        CHECK("base cuDeviceGet", e.get(&bd, 0));
        CHECK("base cuDevicePrimaryCtxRetain", e.retain(&bc, bd));
        CHECK("base cuCtxSetCurrent", e.set(bc));
        CHECK("base cuMemAlloc 256 MiB", e.alloc(&r, 256 << 20));
        CHECK("base cuMemsetD8", e.memset(r, 1, 256 << 20));
        CHECK("base cuCtxSynchronize", e.sync());
        printf("base: 256 MiB allocated through the first namespace's driver\n");
        CHECK("base cuMemFree", e.free(r));
        CHECK("base cuDevicePrimaryCtxRelease", e.release(bd));
        printf("base: freed and released\n");
    }
    CHECK("cuMemFree big", d.free(p));
    CHECK("cuDevicePrimaryCtxRelease", d.release(dev));
    printf("copy: freed and released; exit 0\n");
    return 0;
}
