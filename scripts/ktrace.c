// A kernel timeline of any CUDA program, library kernels and graph nodes included, through CUPTI's
// activity API: what nsys would show, on machines without it (the lent GPUs have none).
//
//   make ktrace
//   CUDA_INJECTION64_PATH=$PWD/build/libktrace.so KTRACE_OUT=kt.csv ./gpt2 bench ...
//   python3 scripts/ktrace.py kt.csv
//
// The CUDA driver loads this library at cuInit and calls InitializeInjection. Every kernel, memset
// and memcpy the GPU runs is written at exit as one CSV line (scripts/ktrace.py reads them):
//   start_ns, end_ns, correlation id (one per API call: a graph launch's nodes share it), graph id,
//   graph node id, grid blocks (bytes for a memcpy), block threads, name (MEMSET, MEMCPY<kind>).
// Kernels are recorded as they run concurrently (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), which keeps
// programmatic dependent launch working; a graph launched from the host takes ~80 us longer to
// start under it, but its kernels' times match an untraced run's (docs/PERF.md, "Session 40").
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = 8u << 20;
    *buffer = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;  // as many as fit
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            fprintf(out, "%llu,%llu,%u,%u,%llu,%d,%d,%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->correlationId, k->graphId, (unsigned long long)k->graphNodeId,
                    k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ, k->name);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
            fprintf(out, "%llu,%llu,%u,%u,%llu,%llu,0,MEMSET\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->correlationId, m->graphId, (unsigned long long)m->graphNodeId,
                    (unsigned long long)m->bytes);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            fprintf(out, "%llu,%llu,%u,%u,%llu,%llu,0,MEMCPY%d\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->correlationId, m->graphId, (unsigned long long)m->graphNodeId,
                    (unsigned long long)m->bytes, m->copyKind);
        }
    }
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(1);
    fclose(out);
}

int InitializeInjection(void) {
    const char *path = getenv("KTRACE_OUT") ? getenv("KTRACE_OUT") : "ktrace.csv";
    if (!(out = fopen(path, "w"))) {
        fprintf(stderr, "ktrace: cannot write %s\n", path);
        return 0;
    }
    const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                        CUPTI_ACTIVITY_KIND_MEMCPY};
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
        fprintf(stderr, "ktrace: cuptiActivityRegisterCallbacks failed\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (cuptiActivityEnable(kinds[i]) != CUPTI_SUCCESS) {
            fprintf(stderr, "ktrace: cuptiActivityEnable(%d) failed\n", (int)kinds[i]);
            return 0;
        }
    atexit(flush_at_exit);
    return 1;
}
