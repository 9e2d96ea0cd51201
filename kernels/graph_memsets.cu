// Small memset nodes of a captured graph as kernel nodes (graph_memsets.h says why).
#include <stdlib.h>

#include "graph_memsets.h"
#include "kernel_util.h"

// count elements of elem_size bytes (1, 2 or 4, as a memset node's) set to value's low bytes.
__global__ void fill_elements(void *dst, unsigned value, unsigned elem_size, unsigned count) {
    for (unsigned i = threadIdx.x; i < count; i += blockDim.x) {
        if (elem_size == 4) ((unsigned *)dst)[i] = value;
        else if (elem_size == 2) ((unsigned short *)dst)[i] = (unsigned short)value;
        else ((unsigned char *)dst)[i] = (unsigned char)value;
    }
}

// node's dependencies (in = 1) or dependents (in = 0), malloc'ed into *nodes; NULL when none.
static cudaError_t edges(cudaGraphNode_t node, int in, cudaGraphNode_t **nodes, size_t *n) {
    *nodes = NULL;
    *n = 0;
    cudaError_t e = in ? cudaGraphNodeGetDependencies(node, NULL, NULL, n)
                       : cudaGraphNodeGetDependentNodes(node, NULL, NULL, n);
    if (e != cudaSuccess || *n == 0) return e;
    *nodes = (cudaGraphNode_t *)xmalloc(*n * sizeof(cudaGraphNode_t));
    return in ? cudaGraphNodeGetDependencies(node, *nodes, NULL, n)
              : cudaGraphNodeGetDependentNodes(node, *nodes, NULL, n);
}

// The memset node by a kernel node, if it is small; *replaced counts it.
static cudaError_t replace(cudaGraph_t graph, cudaGraphNode_t node, int *replaced) {
    cudaMemsetParams m;
    cudaError_t e = cudaGraphMemsetNodeGetParams(node, &m);
    if (e != cudaSuccess || m.height != 1 || m.width * m.elementSize > GRAPH_MEMSET_KERNEL_MAX_BYTES) return e;
    cudaGraphNode_t *in = NULL, *out = NULL, fill = NULL;
    size_t n_in = 0, n_out = 0;
    void *dst = m.dst;
    unsigned value = m.value, elem_size = m.elementSize, count = (unsigned)m.width;
    void *args[] = {&dst, &value, &elem_size, &count};
    cudaKernelNodeParams k = {(void *)fill_elements, dim3(1), dim3(128), 0, args, NULL};
    if ((e = edges(node, 1, &in, &n_in)) == cudaSuccess && (e = edges(node, 0, &out, &n_out)) == cudaSuccess &&
        (e = cudaGraphAddKernelNode(&fill, graph, in, n_in, &k)) == cudaSuccess) {
        for (size_t i = 0; i < n_out && e == cudaSuccess; i++)
            e = cudaGraphAddDependencies(graph, &fill, &out[i], NULL, 1);
        if (e == cudaSuccess) e = cudaGraphDestroyNode(node);
        if (e == cudaSuccess) ++*replaced;
    }
    free(in);
    free(out);
    return e;
}

extern "C" cudaError_t graph_memsets_to_kernels(cudaGraph_t graph, int *replaced) {
    int count = 0;
    size_t n = 0;
    cudaError_t e = cudaGraphGetNodes(graph, NULL, &n);
    cudaGraphNode_t *nodes = e == cudaSuccess && n ? (cudaGraphNode_t *)xmalloc(n * sizeof(cudaGraphNode_t)) : NULL;
    if (nodes) e = cudaGraphGetNodes(graph, nodes, &n);
    for (size_t i = 0; nodes && i < n && e == cudaSuccess; i++) {
        cudaGraphNodeType type;
        e = cudaGraphNodeGetType(nodes[i], &type);
        if (e == cudaSuccess && type == cudaGraphNodeTypeMemset) e = replace(graph, nodes[i], &count);
    }
    free(nodes);
    if (replaced) *replaced = count;
    return e;
}
