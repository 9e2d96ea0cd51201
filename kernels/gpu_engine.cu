// The GPU engine: one upload of the model, one set of buffers, one forward loop. The loop calls a
// per-block op table (BlockOps) chosen once here: the fused kernels for BACKEND_GPU, the reference
// ops for BACKEND_GPU_REFERENCE. Everything an op needs lives in GpuState (block_ops.h).
//
// Device memory, reported at creation:
//   weights      matrices (wte, wpe, qkvw, attprojw, fcw, fcprojw) in the compute dtype, LayerNorm
//                parameters and biases in fp32, and the LayerNorm-folded vectors s and b'
//   KV cache     K and V, each [L][max_batch][NH][max_seq][HS] in the compute dtype
//   activations  buffers for max_batch * max_seq rows (a full-context prefill of every sequence)
//   workspaces   cuBLAS's and cuBLASLt's (kCublasWorkspaceBytes each) and the device sampler's
//                (sampling_workspace_size: 64 KB a sequence)
// and, not in the report, the step's I/O buffers (a few ints a sequence).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "block_ops.h"
#include "cuda_check.h"
#include "graph_memsets.h"
#include "reference_kernels.h"
#include "kernel_trace.cuh"
#include "sampling.h"

// The pick of the next tokens a captured graph bakes in after the model: none (on = 0: a plain
// forward), or the sampler's settings (greedy's as temperature 0, whatever its top-k and top-p).
typedef struct {
    int on;
    float temperature, top_p;
    int top_k;
} PickKey;

// A decode step captured as a CUDA graph for one batch size, staging slot and kind (fed from the
// host, or chained to the step before) and the sampler settings it bakes in; the position, tokens
// and draws reach it through the slot.
typedef struct {
    cudaGraphExec_t exec;
    PickKey pick;
} DecodeGraph;

// A forward of one shape (B, T, pos, which logits, and for a prompt the pick after it) captured as
// a CUDA graph once the shape repeats (scoring, validation, a server's usual prompt lengths;
// gpu_forward_impl says why).
typedef struct {
    int B, T, pos, all_positions;
    PickKey pick;
    int calls;                    // forwards of this shape so far
    cudaGraphExec_t exec;         // captured at the second
    unsigned long long last_use;  // the engine's forward count at the last call; 0: empty slot
} ForwardGraph;

enum { FORWARD_GRAPHS = 8 };  // shapes kept; the least recently used makes room

typedef struct {
    GpuState s;
    const BlockOps *ops;
    void *weights, *cache, *acts;       // the three allocations
    size_t weight_bytes, cache_bytes, act_bytes;
    float *host_trace;                  // [R, C] for gpu_engine_forward_trace, allocated on first use
    GpuProfile *prof;                   // gpu_engine_profile: where forwards add their times
    cudaEvent_t *events;                // 5L + 4 step boundaries, created on first use
    int nevents;
    // Decode steps (gpu_decode, gpu_queue_step) alternate between two staging slots. On the host
    // each is [pos | tokens[max_batch] | draws[max_batch] (float bits)], in pinned memory mapped into
    // the device's address space (io_host, io_mapped); on the device [pos | tokens[max_batch]]
    // (io_dev). A step in slot p reads its position and tokens from device slot p and its draws from
    // host slot p, and leaves the next step's inputs in slot 1 - p: the embedding the position
    // (device), the pick each sequence's id (device, and host through the mapping, where the host
    // reads it). A prompt's pick does the same into slot 0. So a step chained to the one before needs
    // nothing from the host but its draws, already in host memory; a step fed from the host
    // (gpu_decode) copies its position and tokens in first. No copy node ends a step (one cost
    // decode B = 1 3.0%, B = 64 1.9% on an H200: docs/PERF.md "Session 39"), none starts a chained
    // one (~2 us a step: "Session 51"), and a step can be queued before the last one's ids reach the
    // host (engine_decode_steps).
    int *io_host, *io_mapped, *io_dev;  // each two slots: io_ints apart on the host, 1 + max_batch on the device
    size_t io_ints;
    int slot;                           // the next decode step's slot: the last pick wrote its inputs
    int chain_B, chain_pos;             // that pick's batch (0: none; the host picked last) and the next position
    int queued;                         // steps gpu_queue_step queued that gpu_wait_step has not waited for (0-2)
    cudaEvent_t step_done[2];           // recorded after each queued step, by slot
    cudaGraphExec_t last_step;          // the last decode step's graph (gpu_engine_time_decode_graph)
    // A forward's or a prompt's inputs (upload_inputs): pinned [max_batch * max_seq tokens | max_batch
    // draws], copied to s->tokens in one copy; from the caller's pageable tokens and the staging
    // area's draws it took two, ~2.4 us more a prompt on an H200 (docs/PERF.md, "Session 39").
    int *input_host;
    void *sampling_ws;                  // sample_on_device's workspace, zeroed once at creation
    size_t sampling_ws_bytes;
    DecodeGraph *graphs;                // [decode_graphs()]: decode_graph()'s, captured on first use
    ForwardGraph fwd[FORWARD_GRAPHS];   // forwards of repeated shapes (fused table; GPT2_FORWARD_GRAPH=0: none)
    int fwd_graphs_on;
    unsigned long long forwards;        // forward calls so far (the forward graphs' clock)
    GpuGraphStats graph_stats;
    void *cublas_workspace;             // kCublasWorkspaceBytes, given to cuBLAS at creation
#ifdef GPT2_TRACE
    unsigned *trace;                    // kernels/kernel_trace.cuh: [kTraceSMs counts, records by SM]
#endif
} GpuEngine;

static const size_t kCublasWorkspaceBytes = 32u << 20;  // what NVIDIA advises for Hopper

static void gpu_engine_destroy(Engine *e);

static PickKey pick_key(const Sampler *smp) {
    if (!smp) return (PickKey){0, 0.0f, 0.0f, 0};
    if (smp->temperature <= 0.0f) return (PickKey){1, 0.0f, 1.0f, 0};
    return (PickKey){1, smp->temperature, smp->top_p, smp->top_k};
}

static int same_pick(PickKey a, PickKey b) {
    return a.on == b.on && a.temperature == b.temperature && a.top_p == b.top_p && a.top_k == b.top_k;
}

#ifdef GPT2_TRACE
// ----------------------------------------------------------------------------
// The kernel timeline (TRACE=1 builds, kernels/kernel_trace.cuh): every translation unit's binder,
// and the buffer an engine allocates when GPT2_TRACE names a file (the last engine created is the
// one traced).

static void (*trace_binders[32])(TraceRecord *, unsigned *);
static int trace_nbinders;

void trace_register(void (*bind)(TraceRecord *, unsigned *)) {
    if (trace_nbinders < 32) trace_binders[trace_nbinders++] = bind;
}

static int trace_start(GpuEngine *g, Error *err) {
    if (!getenv("GPT2_TRACE")) return 0;
    const size_t bytes = kTraceSMs * sizeof(unsigned) + (size_t)kTraceSMs * kTracePerSM * sizeof(TraceRecord);
    if (gpu_alloc((void **)&g->trace, bytes, "the kernel trace", err)) return -1;
    CUDA_TRY(cudaMemset(g->trace, 0, bytes));
    for (int i = 0; i < trace_nbinders; i++) trace_binders[i]((TraceRecord *)(g->trace + kTraceSMs), g->trace);
    return 0;
}

// Writes [count (uint32), records] to $GPT2_TRACE: every SM's region, up to the time the first region
// to fill took its last record (past it some SMs' blocks would be missing), whole blocks only.
static void trace_finish(GpuEngine *g) {
    if (!g->trace) return;
    unsigned counts[kTraceSMs];
    CUDA_WARN(cudaDeviceSynchronize());
    CUDA_WARN(cudaMemcpy(counts, g->trace, sizeof counts, cudaMemcpyDeviceToHost));
    const size_t all = (size_t)kTraceSMs * kTracePerSM;
    TraceRecord *h = (TraceRecord *)xmalloc(all * sizeof(TraceRecord));
    CUDA_WARN(cudaMemcpy(h, g->trace + kTraceSMs, all * sizeof(TraceRecord), cudaMemcpyDeviceToHost));
    unsigned long long cut = ~0ull;
    for (unsigned sm = 0; sm < kTraceSMs; sm++) {
        if (counts[sm] + kTraceEvents <= kTracePerSM) continue;
        const TraceRecord *region = h + (size_t)sm * kTracePerSM;
        unsigned long long last = 0;
        for (unsigned i = 0; i < kTracePerSM; i++) last = region[i].time_ns > last ? region[i].time_ns : last;
        cut = last < cut ? last : cut;
    }
    unsigned n = 0;  // a block's slots are kTraceEvents aligned ones, its exit among them
    for (size_t b = 0; b < all; b += kTraceEvents) {
        unsigned long long exit_ns = 0;
        for (unsigned e = 0; e < kTraceEvents; e++)
            if (h[b + e].time_ns && h[b + e].event == TRACE_EXIT) exit_ns = h[b + e].time_ns;
        for (unsigned e = 0; e < kTraceEvents && exit_ns && exit_ns <= cut; e++)
            if (h[b + e].time_ns) h[n++] = h[b + e];
    }
    const char *path = getenv("GPT2_TRACE");
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(&n, sizeof n, 1, f) != 1 || fwrite(h, sizeof(TraceRecord), n, f) != n)
        fprintf(stderr, "gpt2: cannot write the kernel trace to %s\n", path);
    else
        fprintf(stderr, "gpt2: %u kernel trace records in %s\n", n, path);
    if (f) fclose(f);
    free(h);
    for (int i = 0; i < trace_nbinders; i++) trace_binders[i](NULL, NULL);
    CUDA_WARN(cudaFree(g->trace));
}
#endif

// ----------------------------------------------------------------------------
// Availability

extern "C" int gpu_available(Error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (e == cudaErrorNoDevice) return fail(err, "no CUDA device"), 0;
        if (e == cudaErrorInsufficientDriver)
            return fail(err, "no NVIDIA driver new enough: %s", cudaGetErrorString(e)), 0;
        return fail(err, "%s", cudaGetErrorString(e)), 0;
    }
    if (n == 0) return fail(err, "no CUDA device"), 0;
    cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) return fail(err, "%s", cudaGetErrorString(e)), 0;
    if (p.major < 8)
        return fail(err, "%s has compute capability %d.%d; this build needs 8.0 or newer", p.name, p.major, p.minor),
               0;
    return 1;
}

// ----------------------------------------------------------------------------
// Upload

// Copies n elements of a host tensor of type src_t into device memory of type dst_t, converting
// through `staging` (stage_bytes) when the types differ.
static int upload(void *dst, DType dst_t, const void *src, DType src_t, size_t n, void *staging, size_t stage_bytes,
                  cudaStream_t stream, Error *err) {
    if (dst_t == src_t) {
        CUDA_TRY(cudaMemcpyAsync(dst, src, n * dtype_size(src_t), cudaMemcpyHostToDevice, stream));
        return 0;
    }
    size_t chunk = stage_bytes / dtype_size(src_t);
    for (size_t i = 0; i < n; i += chunk) {
        size_t m = n - i < chunk ? n - i : chunk;
        CUDA_TRY(cudaMemcpyAsync(staging, (const char *)src + i * dtype_size(src_t), m * dtype_size(src_t),
                                 cudaMemcpyHostToDevice, stream));
        CUDA_TRY(convert_dtype((char *)dst + i * dtype_size(dst_t), dst_t, staging, src_t, m, stream));
    }
    return 0;
}

static int is_matrix(int p) {
    return p == PARAM_WTE || p == PARAM_WPE || p == PARAM_QKVW || p == PARAM_ATTPROJW || p == PARAM_FCW ||
           p == PARAM_FCPROJW;
}

// Allocates and fills the weights allocation; lays the pointers into s.
static int upload_weights(GpuEngine *g, const GPT2Model *m, Error *err) {
    GpuState *s = &g->s;
    DType dt = s->dtype;
    size_t off[NUM_PARAMS], total = 0;
    // wte gets zero rows up to logits_ld: the many-row logits product computes whole padded rows.
    const size_t wte_count = (size_t)s->wte_rows * s->C;
    for (int p = 0; p < NUM_PARAMS; p++) {
        off[p] = total;
        total += align256((p == PARAM_WTE ? wte_count : m->param_counts[p]) *
                          (is_matrix(p) ? dtype_size(dt) : sizeof(float)));
    }
    size_t L = (size_t)s->L, C = (size_t)s->C;
    size_t folded_off = total;
    size_t folded_floats = L * (2 * 3 * C + 2 * 4 * C) + 2 * (size_t)s->Vp;
    total += align256(folded_floats * sizeof(float));
    size_t biases_c_off = total;  // qkvb and fcb in the compute dtype (bf16 only)
    if (dt != DTYPE_F32) total += align256(L * 7 * C * dtype_size(dt));
    if (gpu_alloc(&g->weights, total, "the weights", err)) return -1;
    g->weight_bytes = total;

    char *base = (char *)g->weights;
    size_t stage_bytes = 0;
    void *staging = NULL;
    int convert = 0;
    for (int p = 0; p < NUM_PARAMS; p++) convert |= (is_matrix(p) ? dt : DTYPE_F32) != m->dtype;
    if (convert) {
        stage_bytes = (size_t)64 << 20;
        if (gpu_alloc(&staging, stage_bytes, "the upload staging buffer", err)) return -1;
    }
    int rc = 0;
    for (int p = 0; p < NUM_PARAMS && rc == 0; p++)
        rc = upload(base + off[p], is_matrix(p) ? dt : DTYPE_F32, m->params[p], m->dtype, m->param_counts[p], staging,
                    stage_bytes, s->stream, err);
    if (rc == 0 && staging) {
        // The staging buffer is reused chunk after chunk in stream order; wait before freeing it.
        cudaError_t e = cudaStreamSynchronize(s->stream);
        if (e != cudaSuccess) rc = cuda_fail(err, e, "cudaStreamSynchronize (upload)", __FILE__, __LINE__);
    }
    if (staging) CUDA_WARN(cudaFree(staging));
    if (rc) return rc;
    const size_t wte_given = m->param_counts[PARAM_WTE];
    CUDA_TRY(cudaMemsetAsync(base + off[PARAM_WTE] + wte_given * dtype_size(dt), 0,
                             (wte_count - wte_given) * dtype_size(dt), s->stream));

    size_t ds = dtype_size(dt);
    s->wte = base + off[PARAM_WTE];
    s->wpe = base + off[PARAM_WPE];
    s->lnfw = (const float *)(base + off[PARAM_LNFW]);
    s->lnfb = (const float *)(base + off[PARAM_LNFB]);
    float *folded = (float *)(base + folded_off);
    char *biases_c = base + biases_c_off;
    for (size_t l = 0; l < L; l++) {
        GpuLayer *ly = &s->layers[l];
        ly->ln1w = (const float *)(base + off[PARAM_LN1W]) + l * C;
        ly->ln1b = (const float *)(base + off[PARAM_LN1B]) + l * C;
        ly->qkvw = base + off[PARAM_QKVW] + l * 3 * C * C * ds;
        ly->qkvb = (const float *)(base + off[PARAM_QKVB]) + l * 3 * C;
        ly->attprojw = base + off[PARAM_ATTPROJW] + l * C * C * ds;
        ly->attprojb = (const float *)(base + off[PARAM_ATTPROJB]) + l * C;
        ly->ln2w = (const float *)(base + off[PARAM_LN2W]) + l * C;
        ly->ln2b = (const float *)(base + off[PARAM_LN2B]) + l * C;
        ly->fcw = base + off[PARAM_FCW] + l * 4 * C * C * ds;
        ly->fcb = (const float *)(base + off[PARAM_FCB]) + l * 4 * C;
        ly->fcprojw = base + off[PARAM_FCPROJW] + l * 4 * C * C * ds;
        ly->fcprojb = (const float *)(base + off[PARAM_FCPROJB]) + l * C;
        float *f = folded + l * 14 * C;
        ly->qkv_s = f;
        ly->qkv_b = f + 3 * C;
        ly->fc_s = f + 6 * C;
        ly->fc_b = f + 10 * C;
        CUDA_TRY(ln_fold(f, f + 3 * C, ly->qkvw, ly->ln1w, ly->ln1b, ly->qkvb, 3 * s->C, s->C, dt, s->stream));
        CUDA_TRY(ln_fold(f + 6 * C, f + 10 * C, ly->fcw, ly->ln2w, ly->ln2b, ly->fcb, 4 * s->C, s->C, dt, s->stream));
        ly->qkvb_c = ly->qkvb;
        ly->fcb_c = ly->fcb;
        if (dt != DTYPE_F32) {
            char *b = biases_c + l * 7 * C * ds;
            CUDA_TRY(convert_dtype(b, dt, ly->qkvb, DTYPE_F32, 3 * C, s->stream));
            CUDA_TRY(convert_dtype(b + 3 * C * ds, dt, ly->fcb, DTYPE_F32, 4 * C, s->stream));
            ly->qkvb_c = b;
            ly->fcb_c = b + 3 * C * ds;
        }
    }
    float *lf = folded + L * 14 * C;
    s->lnf_s = lf;
    s->lnf_b = lf + s->Vp;
    CUDA_TRY(ln_fold(lf, lf + s->Vp, s->wte, s->lnfw, s->lnfb, NULL, s->Vp, s->C, dt, s->stream));
    return 0;
}

// ----------------------------------------------------------------------------
// KV cache and activations

static int alloc_cache(GpuEngine *g, Error *err) {
    GpuState *s = &g->s;
    size_t per = (size_t)s->max_batch * s->NH * s->max_seq * s->HS * dtype_size(s->dtype);  // one layer's K
    g->cache_bytes = 2 * (size_t)s->L * per;
    if (gpu_alloc(&g->cache, g->cache_bytes, "the KV cache", err)) return -1;
    for (int l = 0; l < s->L; l++) {
        s->layers[l].k_cache = (char *)g->cache + (size_t)l * per;
        s->layers[l].v_cache = (char *)g->cache + ((size_t)s->L + l) * per;
    }
    return 0;
}

// Lays the activation buffers out in one allocation (base NULL: only counts the bytes).
static size_t layout_acts(GpuEngine *g, char *base) {
    GpuState *s = &g->s;
    size_t R = (size_t)s->max_batch * s->max_seq, C = (size_t)s->C, ds = dtype_size(s->dtype);
    size_t att = (size_t)s->max_batch * s->NH * s->max_seq * s->max_seq;
    size_t off = 0;
#define TAKE(ptr, type, bytes) (ptr = (type)(base ? base + off : NULL), off += align256(bytes))
    TAKE(s->tokens, int *, (R + s->max_batch) * sizeof(int));  // a prompt's draws after its M tokens
    TAKE(s->x, float *, R * C * sizeof(float));
    TAKE(s->q, void *, R * C * ds);
    TAKE(s->atty, void *, R * C * ds);
    TAKE(s->h, void *, R * 4 * C * ds);
    TAKE(s->logits, float *, R * s->logits_ld * sizeof(float));
    s->ln = s->att_p = NULL;
    s->scratch = s->att = NULL;
    if (g->ops->unfused_buffers) {
        TAKE(s->ln, void *, R * C * ds);
        TAKE(s->scratch, float *, R * 4 * C * sizeof(float));
    }
    if (g->ops->score_buffers) {
        TAKE(s->att, float *, att * sizeof(float));
        if (s->dtype == DTYPE_F32) s->att_p = s->att;
        else TAKE(s->att_p, void *, att * ds);
    }
    s->workspace_bytes = g->ops->workspace_bytes ? g->ops->workspace_bytes(s) : 0;
    s->workspace = NULL;
    if (s->workspace_bytes) TAKE(s->workspace, void *, s->workspace_bytes);
#undef TAKE
    return off;
}

static int alloc_acts(GpuEngine *g, Error *err) {
    g->act_bytes = layout_acts(g, NULL);
    if (gpu_alloc(&g->acts, g->act_bytes, "the activations", err)) return -1;
    layout_acts(g, (char *)g->acts);
    if (g->s.workspace) CUDA_TRY(cudaMemsetAsync(g->s.workspace, 0, g->s.workspace_bytes, g->s.stream));
    return 0;
}

// ----------------------------------------------------------------------------
// Forward

// Checks one step's shape and tokens against what the engine was built for.
static int check_step(const GpuState *s, const int *tokens, int B, int T, int pos, Error *err) {
    if (B < 1 || B > s->max_batch)
        return fail(err, "batch %d is outside 1..%d (the engine's max batch)", B, s->max_batch);
    if (T < 1 || pos < 0 || pos + T > s->max_seq)
        return fail(err, "positions %d..%d are outside the context of %d", pos, pos + T - 1, s->max_seq);
    for (int i = 0; i < B * T; i++)
        if (tokens[i] < 0 || tokens[i] >= s->V)
            return fail(err, "token %d at index %d is outside the vocabulary 0..%d", tokens[i], i, s->V - 1);
    return 0;
}

// Nothing else runs while decode steps are queued (src/engine.h).
static int refuse_if_queued(const GpuEngine *g, Error *err) {
    return g->queued ? fail(err, "%d queued decode steps were not waited for", g->queued) : 0;
}

// Profiling: an event at each step boundary (start | input | 5 per layer | logits | output).
#define MARK()                                                               \
    do {                                                                     \
        if (profile) CUDA_TRY(cudaEventRecord(g->events[(*ev)++], stream)); \
    } while (0)

// Enqueues the model for one step whose tokens are on the device: the embedding, every block
// through the op table, and the logits into s->logits. trace (forward_trace) needs the host.
//
// A step that wants only each sequence's last logits (a prompt's) runs the last layer's attention
// over all its rows, which puts every position's keys and values into the cache, and the rest of
// that layer and the logits as a one-token step on each sequence's last row (`last`, moved to the
// front by last_rows_to_front): nothing reads the other rows again. This is what llama.cpp does with
// the outputs it does not need; at 1024 tokens it skips ~3/4 of a layer's matrix products
// (docs/PERF.md, "Session 29").
static int enqueue_model(GpuEngine *g, const GpuStep *st, const int *tokens_dev, int all_positions, int profile,
                         int *ev, GpuTraceFn trace, void *user, Error *err) {
    GpuState *s = &g->s;
    const BlockOps *ops = g->ops;
    cudaStream_t stream = s->stream;
    const int last_only = !all_positions && st->T > 1;
    const GpuStep last = {st->B, 1, st->pos + st->T - 1, st->B, NULL, st->greedy_next, st->greedy_written,
                          st->next_staging, 1};
    const GpuStep *rest = st;  // the step after the attention: `last` in a last_only step's last layer
    const GpuLayer *first = &s->layers[0];
    void *ln1 = ops->embedding_writes_ln1 && ops->embedding_writes_ln1(s, st) ? s->ln : NULL;
    CUDA_TRY(embedding_forward(s->x, ln1, first->ln1w, first->ln1b, tokens_dev, s->wte, s->wpe, st->M, st->T, st->pos,
                               st->pos_device, st->next_staging, s->C, s->dtype, stream));
    MARK();
    for (int l = -1; l < s->L; l++) {
        if (l >= 0) {
            if (ops->attn_in(s, st, l, err)) return -1;
            MARK();
            if (ops->attention(s, st, l, err)) return -1;
            MARK();
            if (last_only && l == s->L - 1) {
                CUDA_TRY(last_rows_to_front(s->x, s->atty, st->B, st->T, s->C, s->dtype, stream));
                rest = &last;
            }
            if (ops->attn_out(s, rest, l, err)) return -1;
            MARK();
            if (ops->mlp_in(s, rest, l, err)) return -1;
            MARK();
            if (ops->mlp_out(s, rest, l, err)) return -1;
            MARK();
        }
        if (trace) {
            if (!g->host_trace)
                g->host_trace = (float *)xmalloc((size_t)s->max_batch * s->max_seq * s->C * sizeof(float));
            CUDA_TRY(cudaMemcpyAsync(g->host_trace, s->x, (size_t)rest->M * s->C * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream));
            CUDA_TRY(cudaStreamSynchronize(stream));
            trace(user, l, g->host_trace, rest->B, rest->T, s->C);
        }
    }
    if (ops->logits(s, rest, all_positions, err)) return -1;
    MARK();
    return 0;
}

// ----------------------------------------------------------------------------
// The pick of the next tokens (decode steps and prompts)

// Slot p's staging: in host memory, the same through the device's mapping of it, in device memory.
static int *slot_host(GpuEngine *g, int p) { return g->io_host + (size_t)p * g->io_ints; }
static int *slot_mapped(GpuEngine *g, int p) { return g->io_mapped + (size_t)p * g->io_ints; }
static int *slot_dev(GpuEngine *g, int p) { return g->io_dev + (size_t)p * (1 + g->s.max_batch); }

// The decode graphs: one per batch size 0..max_batch, staging slot and kind (fed from the host, or
// chained to the step before).
static size_t decode_graphs(const GpuState *s) { return 4 * ((size_t)s->max_batch + 1); }
static DecodeGraph *decode_graph(GpuEngine *g, int B, int p, int chained) {
    return &g->graphs[(2 * (size_t)B + p) * 2 + chained];
}

// The sampler on the B rows of s->logits (unless the logits op wrote the greedy ids: `sampled`):
// the ids into slot q's tokens, host (mapped) and device, the step's `next` staging.
static int enqueue_pick(GpuEngine *g, int B, const Sampler *smp, int sampled, const float *draws, int q, Error *err) {
    GpuState *s = &g->s;
    if (!sampled)
        CUDA_TRY(sample_on_device(s->logits, s->V, s->logits_ld, B, smp->temperature, smp->top_k, smp->top_p, draws,
                                  slot_mapped(g, q) + 1, slot_dev(g, q) + 1, g->sampling_ws, g->sampling_ws_bytes,
                                  s->stream));
    return 0;
}

// ----------------------------------------------------------------------------
// Forward graphs. A prefill is ~90 launches (7 or 8 a layer); enqueued one by one they cost the
// host ~5 us each, more than the GPU needs for a short prompt, and the GPU waits a few us at each
// kernel boundary. Measured on an H200 (docs/PERF.md, "Session 5"): a 128-token prefill took the
// host 480 us to enqueue for 575 us in all, a 1024-token one 450 us for 940 us of which ~650 us
// were kernels. So a shape that comes back (B, T, pos, which logits and a prompt's sampler:
// everything the enqueued work bakes in; the tokens, draws, ids and logits travel outside the
// graph) is captured at its second forward and replayed from then on. The first forward of a
// shape stays eager: it builds the cuBLASLt plans the capture then reuses (and times the
// candidates of the large ones, which cannot happen inside a capture), and a prompt seen once
// would only pay for a capture. Only the fused table, whose ops are all capturable (as decode's
// graphs). Every forward synchronises before it returns, so no graph is still running when a
// slot's is destroyed.

// The slot of this shape, its call counted: the one holding it, else an empty or the least
// recently used one (its graph dropped).
static ForwardGraph *forward_graph(GpuEngine *g, const GpuStep *st, int all_positions, PickKey pick) {
    ForwardGraph *slot = NULL, *oldest = &g->fwd[0];
    for (int i = 0; i < FORWARD_GRAPHS && !slot; i++) {
        ForwardGraph *f = &g->fwd[i];
        if (f->last_use && f->B == st->B && f->T == st->T && f->pos == st->pos && f->all_positions == all_positions &&
            same_pick(f->pick, pick))
            slot = f;
        else if (f->last_use < oldest->last_use)
            oldest = f;
    }
    if (!slot) {
        slot = oldest;
        if (slot->exec) CUDA_WARN(cudaGraphExecDestroy(slot->exec));
        *slot = (ForwardGraph){st->B, st->T, st->pos, all_positions, pick, 0, NULL, 0};
    }
    slot->calls++;
    slot->last_use = ++g->forwards;
    return slot;
}

// Ends the capture on `stream` whose enqueue returned rc and, if both succeeded, instantiates the
// graph into *exec, cuBLASLt's memset nodes turned into kernel nodes first (graph_memsets.h). The
// capture is always ended, so the stream is usable after a failed enqueue.
static int end_capture(cudaStream_t stream, int rc, cudaGraphExec_t *exec, Error *err) {
    cudaGraph_t graph = NULL;
    cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (rc == 0 && end != cudaSuccess) rc = cuda_fail(err, end, "cudaStreamEndCapture", __FILE__, __LINE__);
    if (rc == 0) {
        cudaError_t fills = graph_memsets_to_kernels(graph, NULL);
        if (fills != cudaSuccess) rc = cuda_fail(err, fills, "graph_memsets_to_kernels", __FILE__, __LINE__);
    }
    const char *dot = getenv("GPT2_GRAPH_DOT");  // PREFIX: each captured graph to PREFIX.N.dot
    if (rc == 0 && dot) {
        static int captured;
        char path[4096];
        snprintf(path, sizeof path, "%s.%d.dot", dot, captured++);
        CUDA_WARN(cudaGraphDebugDotPrint(graph, path, cudaGraphDebugDotFlagsVerbose));
    }
    if (rc == 0) {
        cudaError_t inst = cudaGraphInstantiate(exec, graph, 0);
        if (inst != cudaSuccess) rc = cuda_fail(err, inst, "cudaGraphInstantiate", __FILE__, __LINE__);
    }
    if (graph) cudaGraphDestroy(graph);
    return rc;
}

// The model's work for one forward, then, given a sampler (a prompt, whose step has greedy_written),
// its pick of each sequence's next token with the draws that upload_inputs put after the tokens.
static int enqueue_forward(GpuEngine *g, const GpuStep *st, int all_positions, const Sampler *smp, int profile,
                           int *ev, GpuTraceFn trace, void *user, Error *err) {
    if (enqueue_model(g, st, g->s.tokens, all_positions, profile, ev, trace, user, err)) return -1;
    return smp ? enqueue_pick(g, st->B, smp, *st->greedy_written, (const float *)(g->s.tokens + st->M), 0, err) : 0;
}

// A forward's M tokens (and a prompt's B draws after them, u non-NULL) into s->tokens, one copy.
static int upload_inputs(GpuEngine *g, const int *tokens, int M, const float *u, int B, Error *err) {
    memcpy(g->input_host, tokens, (size_t)M * sizeof(int));
    if (u) memcpy(g->input_host + M, u, (size_t)B * sizeof(float));
    CUDA_TRY(cudaMemcpyAsync(g->s.tokens, g->input_host, (size_t)(M + (u ? B : 0)) * sizeof(int),
                             cudaMemcpyHostToDevice, g->s.stream));
    return 0;
}

static int capture_forward(GpuEngine *g, ForwardGraph *f, const GpuStep *st, const Sampler *smp, Error *err) {
    cudaStream_t stream = g->s.stream;
    int unused = 0;
    CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = enqueue_forward(g, st, f->all_positions, smp, 0, &unused, NULL, NULL, err);
    rc = end_capture(stream, rc, &f->exec, err);
    if (rc == 0) g->graph_stats.forward_captures++;
    return rc;
}

// A forward (enqueue_forward): a graph's replay where the shape and the pick repeat, else enqueued.
// The pick is inside the graph: an eager sampler kernel after the replayed graph cost a prompt
// ~25 us more than the kernel itself (docs/PERF.md, "Session 30").
static int run_forward(GpuEngine *g, const GpuStep *st, int all_positions, const Sampler *smp, int profile, int *ev,
                       GpuTraceFn trace, void *user, Error *err) {
    if (g->fwd_graphs_on && g->ops->device_position && !profile && !trace) {
        ForwardGraph *f = forward_graph(g, st, all_positions, pick_key(smp));
        if (!f->exec && f->calls >= 2 && capture_forward(g, f, st, smp, err)) return -1;
        if (f->exec) {
            CUDA_TRY(cudaGraphLaunch(f->exec, g->s.stream));
            g->graph_stats.forward_replays++;
            return 0;
        }
    }
    return enqueue_forward(g, st, all_positions, smp, profile, ev, trace, user, err);
}

static int gpu_forward_impl(Engine *e, const int *tokens, int B, int T, int pos, float *logits, int all_positions,
                            GpuTraceFn trace, void *user, Error *err) {
    GpuEngine *g = (GpuEngine *)e->impl;
    GpuState *s = &g->s;
    if (refuse_if_queued(g, err) || check_step(s, tokens, B, T, pos, err)) return -1;
    g->chain_B = 0;  // the next tokens come from the host (engine_decode's sampler)
    GpuStep st = {B, T, pos, B * T, NULL, NULL, NULL, NULL, 0};
    cudaStream_t stream = s->stream;
    int profile = g->prof != NULL, n = 0, *ev = &n;

    MARK();
    if (upload_inputs(g, tokens, st.M, NULL, B, err) ||
        run_forward(g, &st, all_positions, NULL, profile, ev, trace, user, err))
        return -1;
    size_t rows = all_positions ? (size_t)st.M : (size_t)B;
    if (logits)  // NULL: left on the device (src/engine.h); the host's rows are V apart
        CUDA_TRY(cudaMemcpy2DAsync(logits, s->V * sizeof(float), s->logits, s->logits_ld * sizeof(float),
                                   s->V * sizeof(float), rows, cudaMemcpyDeviceToHost, stream));
    MARK();
    CUDA_TRY(cudaStreamSynchronize(stream));
    if (profile) {
        for (int i = 1; i < n; i++) {
            float ms;
            CUDA_TRY(cudaEventElapsedTime(&ms, g->events[i - 1], g->events[i]));
            int kind = i == 1 ? GPU_PROF_INPUT : i == n - 1 ? GPU_PROF_OUTPUT : i == n - 2 ? GPU_PROF_LOGITS
                                                                                : GPU_PROF_ATTN_IN + (i - 2) % 5;
            g->prof->ms[kind] += ms;
        }
        g->prof->forwards++;
    }
    return 0;
}
#undef MARK

// ----------------------------------------------------------------------------
// Decode: one token per sequence, sampled on the device, replayed as a CUDA graph; and the
// prompt's first new token, sampled on the device after its forward

// The step in slot p as enqueued work: fed, a copy of the host slot's position and tokens in (a
// chained step finds them in the device slot already); the model at T = 1; the sampler, its draws
// read from the host slot. Its ids, and the embedding's next position, go to slot 1 - p. Greedy
// decoding offers the logits op the ids (GpuStep.greedy_next).
static int enqueue_decode(GpuEngine *g, int B, int pos, int p, int chained, const Sampler *smp, int in_graph,
                          Error *err) {
    GpuState *s = &g->s;
    int unused = 0, sampled = 0, *in = slot_dev(g, p);
    if (!chained)
        CUDA_TRY(cudaMemcpyAsync(in, slot_host(g, p), (1 + (size_t)B) * sizeof(int), cudaMemcpyHostToDevice,
                                 s->stream));
    int *picks = smp->temperature <= 0.0f ? slot_mapped(g, 1 - p) + 1 : NULL;
    GpuStep st = {B, 1, pos, B, in_graph ? in : NULL, picks, &sampled, slot_dev(g, 1 - p), 0};
    if (enqueue_model(g, &st, in + 1, 0, 0, &unused, NULL, NULL, err)) return -1;
    return enqueue_pick(g, B, smp, sampled, (const float *)(slot_mapped(g, p) + 1 + s->max_batch), 1 - p, err);
}

// Captures that step for batch B (replacing an older capture).
static int capture_decode(GpuEngine *g, DecodeGraph *dg, int B, int pos, int p, int chained, const Sampler *smp,
                          Error *err) {
    cudaStream_t stream = g->s.stream;
    if (g->last_step == dg->exec) g->last_step = NULL;
    if (dg->exec) CUDA_TRY(cudaGraphExecDestroy(dg->exec));
    dg->exec = NULL;
    CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = enqueue_decode(g, B, pos, p, chained, smp, 1, err);
    rc = end_capture(stream, rc, &dg->exec, err);
    *dg = (DecodeGraph){rc == 0 ? dg->exec : NULL, pick_key(smp)};
    return rc;
}

// A prompt (T > 1): the forward and the pick on each sequence's last row as gpu_forward_impl runs a
// forward (one graph once the shape and the sampler repeat), with no synchronisation between them;
// greedy decoding offers the logits op the ids, as a decode step does. The tokens and the draws go
// in together (upload_inputs); the ids and the next position go to slot 0, the next step's.
static int enqueue_prompt(GpuEngine *g, const int *tokens, int B, int T, int pos, const Sampler *smp, const float *u,
                          Error *err) {
    int unused = 0, sampled = 0;
    GpuStep st = {B, T, pos, B * T, NULL, smp->temperature <= 0.0f ? slot_mapped(g, 0) + 1 : NULL, &sampled,
                  slot_dev(g, 0), 0};
    if (upload_inputs(g, tokens, st.M, u, B, err)) return -1;
    if (run_forward(g, &st, 0, smp, 0, &unused, NULL, NULL, err)) return -1;
    g->slot = 0;
    return 0;
}

// Enqueues a decode step whose host staging (slot g->slot) is written: the graph for its batch,
// slot and kind, captured on first use, or the ops one by one where the table cannot be replayed.
// The next step takes the other slot.
static int launch_step(GpuEngine *g, int B, int pos, int chained, const Sampler *smp, Error *err) {
    int p = g->slot;
    if (g->ops->device_position) {
        DecodeGraph *dg = decode_graph(g, B, p, chained);
        if (!dg->exec || !same_pick(dg->pick, pick_key(smp)))
            if (capture_decode(g, dg, B, pos, p, chained, smp, err)) return -1;
        CUDA_TRY(cudaGraphLaunch(dg->exec, g->s.stream));
        g->last_step = dg->exec;
    } else if (enqueue_decode(g, B, pos, p, chained, smp, 0, err)) {
        return -1;
    }
    g->slot = 1 - p;
    return 0;
}

static int gpu_decode(Engine *e, const int *tokens, int B, int T, int pos, const Sampler *smp, const float *u,
                      int *next, Error *err) {
    GpuEngine *g = (GpuEngine *)e->impl;
    GpuState *s = &g->s;
    if (refuse_if_queued(g, err)) return -1;
    g->chain_B = 0;  // until this step's pick is made
    if (!device_sampling_supported(smp->temperature, smp->top_k, s->V)) return 0;
    if (check_step(s, tokens, B, T, pos, err)) return -1;
    if (T > 1) {
        if (enqueue_prompt(g, tokens, B, T, pos, smp, u, err)) return -1;
    } else {
        int *io = slot_host(g, g->slot);
        io[0] = pos;
        memcpy(io + 1, tokens, (size_t)B * sizeof(int));
        memcpy(io + 1 + s->max_batch, u, (size_t)B * sizeof(float));
        if (launch_step(g, B, pos, 0, smp, err)) return -1;
    }
    CUDA_TRY(cudaStreamSynchronize(s->stream));
    memcpy(next, slot_host(g, g->slot) + 1, (size_t)B * sizeof(int));
    g->chain_B = B, g->chain_pos = pos + T;
    return 1;
}

// The step after the last pick, chained to it: its position and tokens are in the device slot
// already, so only its draws go in, into host memory.
static int gpu_queue_step(Engine *e, int B, int pos, const Sampler *smp, const float *u, Error *err) {
    GpuEngine *g = (GpuEngine *)e->impl;
    GpuState *s = &g->s;
    if (B != g->chain_B || pos != g->chain_pos || !device_sampling_supported(smp->temperature, smp->top_k, s->V))
        return 0;
    if (g->queued == 2) return fail(err, "two decode steps are queued already; wait for one first");
    if (pos >= s->max_seq) return fail(err, "position %d is outside the context of %d", pos, s->max_seq);
    int p = g->slot;
    memcpy(slot_host(g, p) + 1 + s->max_batch, u, (size_t)B * sizeof(float));
    if (launch_step(g, B, pos, 1, smp, err)) return -1;
    CUDA_TRY(cudaEventRecord(g->step_done[p], s->stream));
    g->queued++;
    g->chain_pos = pos + 1;
    return 1;
}

static int gpu_wait_step(Engine *e, int *next, Error *err) {
    GpuEngine *g = (GpuEngine *)e->impl;
    if (!g->queued) return fail(err, "no decode step is queued");
    int p = (g->slot + g->queued) & 1;  // the oldest queued step's slot
    CUDA_TRY(cudaEventSynchronize(g->step_done[p]));
    memcpy(next, slot_host(g, 1 - p) + 1, (size_t)g->chain_B * sizeof(int));
    g->queued--;
    return 0;
}

extern "C" int gpu_engine_time_decode_graph(Engine *e, int B, int reps, double *ms, Error *err) {
    if (e->free != gpu_engine_destroy) return 0;
    GpuEngine *g = (GpuEngine *)e->impl;
    if (B < 1 || B > g->s.max_batch || reps < 1 || g->queued) return 0;
    cudaGraphExec_t exec = g->last_step;
    if (!exec || g->chain_B != B) return 0;
    cudaStream_t stream = g->s.stream;
    cudaEvent_t ev[2] = {NULL, NULL};
    int rc = -1;
    float elapsed = 0;
    cudaError_t c = cudaEventCreate(&ev[0]);
    if (c == cudaSuccess) c = cudaEventCreate(&ev[1]);
    if (c == cudaSuccess) c = cudaGraphLaunch(exec, stream);  // warm-up
    if (c == cudaSuccess) c = cudaEventRecord(ev[0], stream);
    for (int r = 0; r < reps && c == cudaSuccess; r++) c = cudaGraphLaunch(exec, stream);
    if (c == cudaSuccess) c = cudaEventRecord(ev[1], stream);
    if (c == cudaSuccess) c = cudaEventSynchronize(ev[1]);
    if (c == cudaSuccess) c = cudaEventElapsedTime(&elapsed, ev[0], ev[1]);
    if (c == cudaSuccess) {
        *ms = elapsed / reps;
        rc = 1;
    } else {
        cuda_fail(err, c, "timing the decode graph", __FILE__, __LINE__);
    }
    for (int i = 0; i < 2; i++)
        if (ev[i]) CUDA_WARN(cudaEventDestroy(ev[i]));
    return rc;
}

extern "C" int gpu_engine_graph_stats(Engine *e, GpuGraphStats *stats) {
    if (e->free != gpu_engine_destroy) return 0;
    *stats = ((GpuEngine *)e->impl)->graph_stats;
    return 1;
}

extern "C" int gpu_engine_profile(Engine *e, GpuProfile *prof, Error *err) {
    if (e->free != gpu_engine_destroy) return fail(err, "profiling needs a GPU engine, not %s", e->name);
    GpuEngine *g = (GpuEngine *)e->impl;
    if (prof) {
        int n = 5 * g->s.L + 4;  // start | input | 5 per layer | logits | output
        if (!g->events) g->events = (cudaEvent_t *)xcalloc((size_t)n, sizeof(cudaEvent_t));
        for (; g->nevents < n; g->nevents++) CUDA_TRY(cudaEventCreate(&g->events[g->nevents]));
    }
    g->prof = prof;
    return 0;
}

static int gpu_forward(Engine *e, const int *tokens, int B, int T, int pos, float *logits, int all_positions,
                       Error *err) {
    return gpu_forward_impl(e, tokens, B, T, pos, logits, all_positions, NULL, NULL, err);
}

extern "C" int gpu_engine_forward_trace(Engine *e, const int *tokens, int B, int T, int pos, float *logits,
                                        int all_positions, GpuTraceFn trace, void *user, Error *err) {
    if (e->forward != gpu_forward) return fail(err, "forward_trace needs a GPU engine, not %s", e->name);
    return gpu_forward_impl(e, tokens, B, T, pos, logits, all_positions, trace, user, err);
}

extern "C" int gpu_engine_copy_folded(Engine *e, int which, int layer, float *s_out, float *b_out, Error *err) {
    if (e->forward != gpu_forward) return fail(err, "copy_folded needs a GPU engine, not %s", e->name);
    GpuState *s = &((GpuEngine *)e->impl)->s;
    if (which < 0 || which > 2 || layer < 0 || layer >= s->L) return fail(err, "copy_folded: bad which/layer");
    const GpuLayer *ly = &s->layers[layer];
    const float *src_s = which == 0 ? ly->qkv_s : which == 1 ? ly->fc_s : s->lnf_s;
    const float *src_b = which == 0 ? ly->qkv_b : which == 1 ? ly->fc_b : s->lnf_b;
    size_t n = which == 0 ? 3 * (size_t)s->C : which == 1 ? 4 * (size_t)s->C : (size_t)s->Vp;
    CUDA_TRY(cudaMemcpyAsync(s_out, src_s, n * sizeof(float), cudaMemcpyDeviceToHost, s->stream));
    CUDA_TRY(cudaMemcpyAsync(b_out, src_b, n * sizeof(float), cudaMemcpyDeviceToHost, s->stream));
    CUDA_TRY(cudaStreamSynchronize(s->stream));
    return 0;
}

// ----------------------------------------------------------------------------
// Creation and teardown

static void gpu_engine_destroy(Engine *e) {
    if (!e) return;
    GpuEngine *g = (GpuEngine *)e->impl;
    if (g) {
        if (g->s.stream) CUDA_WARN(cudaStreamSynchronize(g->s.stream));
#ifdef GPT2_TRACE
        trace_finish(g);
#endif
        for (int i = 0; i < g->nevents; i++) CUDA_WARN(cudaEventDestroy(g->events[i]));
        free(g->events);
        for (size_t i = 0; g->graphs && i < decode_graphs(&g->s); i++)
            if (g->graphs[i].exec) CUDA_WARN(cudaGraphExecDestroy(g->graphs[i].exec));
        for (int p = 0; p < 2; p++)
            if (g->step_done[p]) CUDA_WARN(cudaEventDestroy(g->step_done[p]));
        free(g->graphs);
        for (int i = 0; i < FORWARD_GRAPHS; i++)
            if (g->fwd[i].exec) CUDA_WARN(cudaGraphExecDestroy(g->fwd[i].exec));
        if (g->io_host) CUDA_WARN(cudaFreeHost(g->io_host));
        if (g->io_dev) CUDA_WARN(cudaFree(g->io_dev));
        if (g->input_host) CUDA_WARN(cudaFreeHost(g->input_host));
        if (g->sampling_ws) CUDA_WARN(cudaFree(g->sampling_ws));
        if (g->s.cublas && cublasDestroy(g->s.cublas) != CUBLAS_STATUS_SUCCESS)
            fprintf(stderr, "gpt2: %s:%d: cublasDestroy failed\n", __FILE__, __LINE__);
        matmul_lt_free(g->s.lt);
        if (g->s.stream) CUDA_WARN(cudaStreamDestroy(g->s.stream));
        if (g->cublas_workspace) CUDA_WARN(cudaFree(g->cublas_workspace));
        if (g->acts) CUDA_WARN(cudaFree(g->acts));
        if (g->cache) CUDA_WARN(cudaFree(g->cache));
        if (g->weights) CUDA_WARN(cudaFree(g->weights));
        free(g->s.layers);
        free(g->host_trace);
        free(g);
    }
    free(e);
}

static int gpu_engine_init(Engine *e, GpuEngine *g, const GPT2Model *m, const EngineOptions *opt, Error *err) {
    GpuState *s = &g->s;
    const GPT2Config *c = &m->config;
    g->ops = opt->backend == BACKEND_GPU_REFERENCE ? &reference_ops : &fused_ops;
    s->L = c->num_layers;
    s->C = c->channels;
    s->NH = c->num_heads;
    s->HS = c->channels / c->num_heads;
    s->V = c->vocab_size;
    s->Vp = c->padded_vocab_size;
    s->logits_ld = (s->V + 63) / 64 * 64;
    s->wte_rows = s->Vp > s->logits_ld ? s->Vp : s->logits_ld;
    s->maxT = c->max_seq_len;
    s->dtype = opt->dtype;
    s->max_batch = opt->max_batch > 0 ? opt->max_batch : 1;
    s->max_seq = opt->max_seq > 0 ? opt->max_seq : c->max_seq_len;
    if (s->max_seq > c->max_seq_len)
        return fail(err, "context %d is longer than the model's %d positions", s->max_seq, c->max_seq_len);
    if ((size_t)s->max_batch * s->max_seq > (size_t)1 << 30)
        return fail(err, "batch %d x context %d is too many rows", s->max_batch, s->max_seq);
    s->layers = (GpuLayer *)xcalloc((size_t)s->L, sizeof(GpuLayer));

    CUDA_TRY(cudaSetDevice(0));
    CUDA_TRY(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
#ifdef GPT2_TRACE
    if (trace_start(g, err)) return -1;
#endif
    CUBLAS_TRY(cublasCreate(&s->cublas));
    CUBLAS_TRY(cublasSetStream(s->cublas, s->stream));
    // CUBLAS_COMPUTE_32F with the default math mode: fp32 stays fp32 (no TF32 shortcut).
    CUBLAS_TRY(cublasSetMathMode(s->cublas, CUBLAS_DEFAULT_MATH));
    // cuBLAS's own workspace, set up front: a call captured into a decode graph must not allocate.
    if (gpu_alloc(&g->cublas_workspace, kCublasWorkspaceBytes, "the cuBLAS workspace", err)) return -1;
    CUBLAS_TRY(cublasSetWorkspace(s->cublas, g->cublas_workspace, kCublasWorkspaceBytes));
    // cuBLASLt, with a workspace of its own, for the fused table's many-row linear ops.
    if (!(s->lt = matmul_lt_create(kCublasWorkspaceBytes, err))) return -1;

    if (upload_weights(g, m, err) || alloc_cache(g, err) || alloc_acts(g, err)) return -1;
    g->io_ints = 1 + 2 * (size_t)s->max_batch;
    CUDA_TRY(cudaHostAlloc((void **)&g->io_host, 2 * g->io_ints * sizeof(int), cudaHostAllocMapped));
    CUDA_TRY(cudaHostGetDevicePointer((void **)&g->io_mapped, g->io_host, 0));
    if (gpu_alloc((void **)&g->io_dev, 2 * (1 + (size_t)s->max_batch) * sizeof(int), "the decode staging area", err))
        return -1;
    for (int p = 0; p < 2; p++) CUDA_TRY(cudaEventCreateWithFlags(&g->step_done[p], cudaEventDisableTiming));
    CUDA_TRY(cudaHostAlloc((void **)&g->input_host, ((size_t)s->max_batch * s->max_seq + s->max_batch) * sizeof(int),
                           cudaHostAllocDefault));
    g->sampling_ws_bytes = sampling_workspace_size(s->max_batch, s->V);
    if (gpu_alloc(&g->sampling_ws, g->sampling_ws_bytes, "the device sampler's workspace", err)) return -1;
    if (g->sampling_ws) CUDA_TRY(cudaMemsetAsync(g->sampling_ws, 0, g->sampling_ws_bytes, s->stream));
    g->graphs = (DecodeGraph *)xcalloc(decode_graphs(s), sizeof(DecodeGraph));
    const char *fwd_graphs = getenv("GPT2_FORWARD_GRAPH");
    g->fwd_graphs_on = !(fwd_graphs && !strcmp(fwd_graphs, "0"));
    CUDA_TRY(cudaStreamSynchronize(s->stream));

    cudaDeviceProp p;
    CUDA_TRY(cudaGetDeviceProperties(&p, 0));
    const size_t workspace_bytes = 2 * kCublasWorkspaceBytes + g->sampling_ws_bytes;
    fprintf(stderr,
            "gpu: %s, %s %s: weights %.1f MiB, KV cache %.1f MiB (batch %d x %d positions), activations %.1f MiB, "
            "workspaces %.1f MiB\n",
            p.name, g->ops->name, dtype_name(s->dtype), g->weight_bytes / 1048576.0, g->cache_bytes / 1048576.0,
            s->max_batch, s->max_seq, g->act_bytes / 1048576.0, workspace_bytes / 1048576.0);

    e->name = g->ops->name;
    e->config = *c;
    e->dtype = s->dtype;
    e->max_batch = s->max_batch;
    e->max_seq = s->max_seq;
    e->forward = gpu_forward;
    e->decode = gpu_decode;
    e->queue_step = gpu_queue_step;
    e->wait_step = gpu_wait_step;
    e->free = gpu_engine_destroy;
    return 0;
}

extern "C" Engine *gpu_engine_create(const GPT2Model *model, const EngineOptions *opt, Error *err) {
    if (!gpu_available(err)) return NULL;
    Engine *e = (Engine *)xcalloc(1, sizeof(Engine));
    GpuEngine *g = (GpuEngine *)xcalloc(1, sizeof(GpuEngine));
    e->impl = g;
    if (gpu_engine_init(e, g, model, opt, err)) {
        gpu_engine_destroy(e);
        return NULL;
    }
    return e;
}
