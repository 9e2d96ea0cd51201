// The only door from C into CUDA: the GPU engine behind src/engine.h's Engine. Everything else in
// kernels/ is C++ (CUDA) and private to it. The engine uploads one GPT2Model, allocates the KV
// cache and activations once, and runs the forward loop with the per-block op table (BlockOps,
// kernels/block_ops.h) chosen at creation: the fused kernels for BACKEND_GPU, the unfused
// reference ops for BACKEND_GPU_REFERENCE.
#pragma once

#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif

// 1 when a CUDA device answers; else 0 with the reason in err ("no CUDA device", the driver's
// message, ...). Cheap enough to call before choosing a backend.
int gpu_available(Error *err);

// Builds a GPU engine: opt->backend BACKEND_GPU (fused) or BACKEND_GPU_REFERENCE, opt->dtype the
// compute type (an fp32 checkpoint can run as bf16: converted at upload), opt->max_batch and
// opt->max_seq size the KV cache and the activations. Prints the memory it takes on stderr.
// NULL with a one-line err on failure (out of memory names the sizes); nothing is left allocated.
Engine *gpu_engine_create(const GPT2Model *model, const EngineOptions *opt, Error *err);

// Called by gpu_engine_forward_trace with the residual stream copied to the host: layer -1 after
// the embedding, then layer l after block l. residual: fp32 [B*T, C], row b*T + t; after the last
// block of a forward that wants only the last positions' logits (T > 1), only those rows (T = 1).
typedef void (*GpuTraceFn)(void *user, int layer, const float *residual, int B, int T, int C);

// Engine.forward with a look inside: trace (if not NULL) sees the residual stream after the
// embedding and after every block (for ./gpt2 compare). Slower: it synchronizes at each block.
int gpu_engine_forward_trace(Engine *e, const int *tokens, int B, int T, int pos, float *logits,
                             int all_positions, GpuTraceFn trace, void *user, Error *err);

// Per-op timing for ./gpt2 bench: device time between the loop's steps, measured with CUDA events.
// The kinds, in the loop's order: input (tokens to the device + embedding), the five block ops
// summed over layers, logits, output (logits to the host).
enum { GPU_PROF_INPUT, GPU_PROF_ATTN_IN, GPU_PROF_ATTENTION, GPU_PROF_ATTN_OUT, GPU_PROF_MLP_IN, GPU_PROF_MLP_OUT,
       GPU_PROF_LOGITS, GPU_PROF_OUTPUT, GPU_PROF_KINDS };

typedef struct {
    int forwards;               // forward calls measured
    double ms[GPU_PROF_KINDS];  // summed over them
} GpuProfile;

// Starts (prof != NULL) or stops (NULL) profiling: each later forward adds its times to *prof.
// Profiling synchronizes at the end of each forward (it does anyway) and costs an event per step.
int gpu_engine_profile(Engine *e, GpuProfile *prof, Error *err);

// The device time of one decode step alone, for ./gpt2 bench: the CUDA graph of the engine's last
// decode step, at batch B, replayed `reps` times back to back between CUDA events, so the host's
// work between steps is left out. Each replay repeats that step (same position and tokens: the
// cache slot is rewritten with the same values). 1 with *ms per step; 0 when there is no such graph
// (another engine, or the reference path, which runs no graph, or a step still queued); -1 on error.
int gpu_engine_time_decode_graph(Engine *e, int B, int reps, double *ms, Error *err);

// What the engine did with CUDA graphs, for tests: forwards of a repeated shape captured, and
// forwards run as a graph's replay (kernels/gpu_engine.cu, "Forward graphs"). 1, or 0 for another
// engine.
typedef struct {
    long long forward_captures, forward_replays;
} GpuGraphStats;
int gpu_engine_graph_stats(Engine *e, GpuGraphStats *stats);

// The LayerNorm-folded vectors the fused kernels read (s and b', block_ops.h), copied to the host
// for tests: which 0: ln1 -> qkv of `layer` ([3C] each), 1: ln2 -> fc ([4C]), 2: lnf -> logits ([Vp]).
int gpu_engine_copy_folded(Engine *e, int which, int layer, float *s, float *b, Error *err);

#ifdef __cplusplus
}
#endif
