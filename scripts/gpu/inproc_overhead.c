// The shim's cost on a 1 MiB cuMemAlloc_v2 + cuMemFree_v2 pair, measured inside one process (issue 9: a 1 MiB
// loop at most 1% slower traced than bare). Pairs through the driver's exported entry points (the shim's, when
// it is preloaded) alternate one by one with pairs through the driver's own functions, found in libcuda's
// dynamic symbol table (not with dlsym: the shim answers that door too). Both paths share the process, the
// context, the GPU's clocks and the driver's allocator state, so the drift between separate runs (3 to 4% on
// an H100, which hides a cost of 0.5% in runs of separate processes) falls on both alike.
// Without the shim both paths are the same function: that run measures the method's own noise.
// Build: gcc -O2 -o inproc inproc_overhead.c -I$CUDA/include -lcuda
// Usage: inproc [BLOCKS] [PAIRS_PER_BLOCK] [BYTES]   (BLOCKS x PAIRS_PER_BLOCK pairs each way)
// INPROC_QUICK=1: the pairs alone, without the timings of cuCtxGetDevice and cuMemFree_v2(0) (for many short
// runs: scripts/gpu/inproc_many.sh).
// Prints summary lines starting "inproc:".
#define _GNU_SOURCE
#include <cuda.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*getdev_fn)(CUdevice *);

struct want {
    const char *name;
    void *addr;
};
static struct want wanted[] = {{"cuMemAlloc_v2", NULL}, {"cuMemFree_v2", NULL}, {"cuCtxGetDevice", NULL}};

// The number of symbols in a GNU hash table: past the largest bucket's chain end.
static size_t gnu_hash_count(const uint32_t *h) {
    uint32_t nbuckets = h[0], symoffset = h[1], bloom = h[2];
    const uint32_t *buckets = h + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t last = 0;
    for (uint32_t i = 0; i < nbuckets; i++)
        if (buckets[i] > last) last = buckets[i];
    if (last < symoffset) return symoffset;
    while (!(chain[last - symoffset] & 1)) last++;
    return last + 1;
}

static int find_real(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libcuda.so")) return 0;
    ElfW(Addr) base = info->dlpi_addr;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    size_t count = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
        const ElfW(Dyn) *d = (const ElfW(Dyn) *)(base + info->dlpi_phdr[i].p_vaddr);
        const uint32_t *gnu = NULL, *sysv = NULL;
        for (; d->d_tag != DT_NULL; d++) {
            // glibc relocates these in place on x86_64; elsewhere they may still be offsets.
            ElfW(Addr) p = d->d_un.d_ptr < base ? d->d_un.d_ptr + base : d->d_un.d_ptr;
            if (d->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)p;
            if (d->d_tag == DT_STRTAB) strtab = (const char *)p;
            if (d->d_tag == DT_GNU_HASH) gnu = (const uint32_t *)p;
            if (d->d_tag == DT_HASH) sysv = (const uint32_t *)p;
        }
        count = sysv ? sysv[1] : gnu ? gnu_hash_count(gnu) : 0;
    }
    if (!symtab || !strtab) return 0;
    for (size_t i = 0; i < count; i++) {
        if (symtab[i].st_value == 0 || ELF64_ST_TYPE(symtab[i].st_info) != STT_FUNC) continue;
        for (size_t w = 0; w < sizeof wanted / sizeof wanted[0]; w++)
            if (!wanted[w].addr && strcmp(strtab + symtab[i].st_name, wanted[w].name) == 0)
                wanted[w].addr = (void *)(base + symtab[i].st_value);
    }
    return 1;
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

// ns for one pair through (a, f).
static double pair(alloc_fn a, free_fn f, size_t bytes) {
    CUdeviceptr p;
    double t0 = now_ns();
    if (a(&p, bytes) != CUDA_SUCCESS || f(p) != CUDA_SUCCESS) {
        fprintf(stderr, "inproc: an allocation failed\n");
        exit(1);
    }
    return now_ns() - t0;
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double pct(double *v, int n, double q) {
    return v[(int)(q * (n - 1))];
}

int main(int argc, char **argv) {
    int blocks = argc > 1 ? atoi(argv[1]) : 40;
    int pairs = argc > 2 ? atoi(argv[2]) : 2000;
    size_t bytes = argc > 3 ? strtoull(argv[3], NULL, 0) : 1u << 20;
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "inproc: CUDA set-up failed\n");
        return 1;
    }
    dl_iterate_phdr(find_real, NULL);
    if (!wanted[0].addr || !wanted[1].addr) {
        fprintf(stderr, "inproc: the driver's own cuMemAlloc_v2/cuMemFree_v2 were not found\n");
        return 1;
    }
    // The exported names, as the program's own calls reach them (the shim's under LD_PRELOAD).
    alloc_fn ea = cuMemAlloc_v2;
    free_fn ef = cuMemFree_v2;
    alloc_fn ra = (alloc_fn)wanted[0].addr;
    free_fn rf = (free_fn)wanted[1].addr;
    int same = (void *)ea == (void *)ra && (void *)ef == (void *)rf;
    // Warm-up through both.
    for (int i = 0; i < 1000; i++) {
        pair(ra, rf, bytes);
        pair(ea, ef, bytes);
    }
    // Pairs through the two paths alternate one by one (the order flipping each time), each timed alone: the
    // driver's slow drift and its periodic slow pairs fall on both alike, and medians ignore the outliers.
    int n = blocks * pairs;
    double *e = malloc(sizeof(double) * n), *r = malloc(sizeof(double) * n);
    for (int i = 0; i < n; i++) {
        if (i % 2) {
            e[i] = pair(ea, ef, bytes);
            r[i] = pair(ra, rf, bytes);
        } else {
            r[i] = pair(ra, rf, bytes);
            e[i] = pair(ea, ef, bytes);
        }
    }
    // What the shim asks the driver after an allocation in a process that sees several GPUs (the current
    // device), timed alone: how much of the cost above that answer is (with one GPU the shim does not ask).
    int quick = getenv("INPROC_QUICK") && strcmp(getenv("INPROC_QUICK"), "1") == 0;
    getdev_fn rg = (getdev_fn)wanted[2].addr;
    if (rg && !quick) {
        CUdevice dv;
        double t0 = now_ns();
        for (int i = 0; i < 100000; i++) rg(&dv);
        double t1 = now_ns();
        struct timespec ts;
        for (int i = 0; i < 100000; i++) clock_gettime(CLOCK_MONOTONIC, &ts);
        double t2 = now_ns();
        printf("inproc: the driver's own cuCtxGetDevice %.1f ns a call; clock_gettime %.1f ns\n", (t1 - t0) / 1e5,
               (t2 - t1) / 1e5);
    }
    // The shim's own cost with warm caches and with cold ones: cuMemFree_v2(0) returns at once in the driver, so
    // the wrapper's work is all there is; before each cold call 32 MiB are read (what a real allocation's trip
    // through the kernel does to the caches). 300 of each, alternating.
    if (!quick) {
        size_t big = 32u << 20;
        volatile char *junk = malloc(big);
        for (size_t i = 0; i < big; i += 64) junk[i] = (char)i;
        double w[2] = {0, 0}, c[2] = {0, 0};
        free_fn fs[2] = {ef, rf};
        for (int k = 0; k < 2; k++) {
            double t0 = now_ns();
            for (int i = 0; i < 100000; i++) fs[k](0);
            w[k] = (now_ns() - t0) / 1e5;
        }
        for (int i = 0; i < 300; i++) {
            for (int k = 0; k < 2; k++) {
                unsigned long sum = 0;
                for (size_t j = 0; j < big; j += 64) sum += junk[j];
                (void)sum;
                double t0 = now_ns();
                fs[k](0);
                c[k] += now_ns() - t0;
            }
        }
        printf("inproc: cuMemFree_v2(0) warm: exported %.1f ns, driver's own %.1f; cold: exported %.1f, driver's own "
               "%.1f\n",
               w[0], w[1], c[0] / 300, c[1] / 300);
    }
    double se = 0, sr = 0;
    for (int i = 0; i < n; i++) {
        se += e[i];
        sr += r[i];
    }
    qsort(e, n, sizeof(double), cmp);
    qsort(r, n, sizeof(double), cmp);
    // Means trimmed of the slowest 5% of each path (the driver's occasional stalls of several ms).
    double te = 0, tr = 0;
    int keep = n - n / 20;
    for (int i = 0; i < keep; i++) {
        te += e[i];
        tr += r[i];
    }
    printf("inproc: exported==driver's own: %s; %d pairs of %zu bytes each way, alternating\n",
           same ? "yes (no shim)" : "no (shim)", n, bytes);
    printf("inproc: ns/pair exported: p25 %.0f median %.0f p75 %.0f mean %.0f; driver's own: p25 %.0f median %.0f "
           "p75 %.0f mean %.0f\n",
           pct(e, n, .25), pct(e, n, .5), pct(e, n, .75), se / n, pct(r, n, .25), pct(r, n, .5), pct(r, n, .75),
           sr / n);
    printf("inproc: exported vs driver's own: median %+.3f%%, p25 %+.3f%%, p75 %+.3f%%, mean %+.3f%%, "
           "mean of the fastest 95%% %+.3f%% (%+.1f ns)\n",
           (pct(e, n, .5) / pct(r, n, .5) - 1) * 100, (pct(e, n, .25) / pct(r, n, .25) - 1) * 100,
           (pct(e, n, .75) / pct(r, n, .75) - 1) * 100, (se / sr - 1) * 100, (te / tr - 1) * 100,
           (te - tr) / keep);
    return 0;
}
