// An engine runs the model: the CPU path (fp32, OpenMP) or the GPU path (fused kernels, or the
// unfused reference ops with --reference). Every engine keeps a KV cache, so the same call
// serves a full forward (validate), a prefill (the prompt) and one decode step (one token).
#pragma once

#include "model.h"
#include "sampler.h"

typedef enum {
    BACKEND_AUTO,           // the GPU when one is usable, else the CPU (with a note)
    BACKEND_CPU,
    BACKEND_GPU,            // fused kernels
    BACKEND_GPU_REFERENCE,  // unfused ops: LayerNorm kernel, cuBLAS, GELU, softmax, residual
} Backend;

typedef struct {
    Backend backend;
    DType dtype;      // compute type on the GPU; the CPU path always computes in fp32
    int max_batch;    // sequences run side by side
    int max_seq;      // positions the KV cache holds (<= max_seq_len)
} EngineOptions;

typedef struct Engine Engine;

struct Engine {
    const char *name;  // "cpu", "gpu", "gpu-reference": for reports
    GPT2Config config;
    DType dtype;
    int max_batch, max_seq;
    void *impl;
    // Runs B sequences of T new tokens each, at positions [pos, pos + T), appending their keys and
    // values to the cache (positions before pos must be there already). tokens: [B, T].
    // logits (host, fp32): [B, T, V] if all_positions, else [B, V] for each sequence's last token.
    // A GPU engine also takes NULL: the logits are computed and left on the device (timing a
    // forward without the host copy, as PyTorch's figures are taken); the CPU engine needs them.
    int (*forward)(Engine *e, const int *tokens, int B, int T, int pos, float *logits, int all_positions,
                   Error *err);
    // A step that samples where the logits are (NULL: forward + the host sampler). Feeds tokens
    // [B, T] at positions [pos, pos + T) (a prompt, or T = 1: a decode step) and writes each
    // sequence's next token to next[b], chosen from its last position's logits as
    // sampler_pick(sampler, logits, u[b]) would. Returns 1 when it did the step, 0 when it cannot
    // sample with these settings (the caller falls back), -1 on error.
    int (*decode)(Engine *e, const int *tokens, int B, int T, int pos, const Sampler *sampler, const float *u,
                  int *next, Error *err);
    // Optional (NULL: not offered), decode steps queued ahead of their picks. queue_step feeds each of
    // B sequences the token that the engine's last pick made for it, where that pick left it (the
    // last decode's, at this B, whose tokens belong at pos), with draws u; it returns 1 when the step
    // is queued, 0 when it cannot be (the caller runs decode instead), -1 on error. At most two
    // steps are queued at once; wait_step waits for the oldest alone and writes its picks to next.
    // Nothing else may run on the engine while a step is queued.
    int (*queue_step)(Engine *e, int B, int pos, const Sampler *sampler, const float *u, Error *err);
    int (*wait_step)(Engine *e, int *next, Error *err);
    void (*free)(Engine *e);
};

// Builds the engine the options ask for. With BACKEND_AUTO and no usable GPU it builds the CPU
// engine and prints a one-line note on stderr.
Engine *engine_create(const GPT2Model *model, const EngineOptions *opt, Error *err);
void engine_free(Engine *e);

// The next token of B sequences: tokens [B, T] at positions [pos, pos + T) in (the prompt, or one
// token per decode step), next[b] out, one draw of the sampler per sequence. Uses the engine's own
// decode where it can (on the GPU: only ids cross to the host), else forward into logits ([B, V]
// host scratch) and the host sampler.
int engine_decode(Engine *e, const int *tokens, int B, int T, int pos, Sampler *sampler, float *logits, int *next,
                  Error *err);

// What engine_decode_steps hands each step's picks to: next[B]; nonzero stops the steps.
typedef int (*StepFn)(void *user, const int *next);

// Up to n decode steps of B sequences at positions pos, pos + 1, ..., the first fed first[B] (the
// picks of the engine_decode before it), each later one the step before's picks; on_step gets each
// step's picks in order. Where the engine queues steps (queue_step), the step after the one whose
// picks are being read is already queued, so the host's work and the launch hide behind the
// device's (docs/PERF.md, "Session 51"); a step queued past a stop is run and its picks dropped.
// Otherwise engine_decode step by step. The sampler's draws are the same either way.
int engine_decode_steps(Engine *e, const int *first, int B, int pos, int n, Sampler *sampler, float *logits,
                        int *next, StepFn on_step, void *user, Error *err);

// The CPU engine (cpu_engine.c).
Engine *cpu_engine_create(const GPT2Model *model, int max_batch, int max_seq, Error *err);
