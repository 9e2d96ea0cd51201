// Small memsets in a captured CUDA graph turned into kernel nodes.
//
// Where one of cuBLASLt's algorithms needs a few bytes of its workspace zeroed, cuBLASLt enqueues a
// cudaMemsetAsync before the GEMM. Captured, that is a memset node, and a memset node costs far more
// than its 4 bytes: in the 8 x 1024 forward on an H200 each of the 37 took ~3.9 us with the gaps
// before and after it, where an edge between two kernels costs ~0.3 (docs/PERF.md, "Session 40").
// A one-block kernel writing the same bytes, with the same edges in and out, takes its place before
// the graph is instantiated: ~1.5 us each, the forward's graph ~60 us (1.5%) shorter ("Session 42").
#pragma once

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// Memsets of at most this many bytes, one row (height 1), become kernels; others stay memsets.
enum { GRAPH_MEMSET_KERNEL_MAX_BYTES = 4096 };

// Replaces every such memset node of graph (not of its child graphs: stream capture makes none) by
// a kernel node that writes the same elements, depending on the same nodes and depended on by the
// same nodes (plain edges: a memset's edges are never programmatic). *replaced (if not NULL): how
// many. On an error the graph may be half converted and should be destroyed.
cudaError_t graph_memsets_to_kernels(cudaGraph_t graph, int *replaced);

#ifdef __cplusplus
}
#endif
