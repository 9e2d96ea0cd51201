// Greedy decoding's pick across a grid (greedy_pick.h): the end every kernel that takes it shares.
#pragma once

#include <cuda/atomic>

#include "greedy_pick.h"
#include "rank_key.cuh"

// Once the block's threads have folded their rows' best rank keys into row_best[0, rows) in shared
// memory (0: none) and met at `barrier` (the threads that call this, `threads` of them, tid 0 among
// them), each row's best goes into the grid's best for row row0 + t by one 64-bit atomic max, and
// the last block to take a ticket writes the rows' ids and sets best and the ticket back to zero
// (sampling.cu's last_to_arrive pattern: the barrier orders every thread's atomics before thread
// 0's acq_rel increment, whose acquire in the last block orders them before its reads). ticket_slot:
// a shared word for the block's ticket.
template <typename Barrier>
__device__ void greedy_publish(const LogitsGreedy &g, const unsigned long long *row_best, unsigned *ticket_slot,
                               int row0, int rows, int tid, int threads, Barrier barrier) {
    for (int t = tid; t < rows; t += threads)
        if (row_best[t]) atomicMax(&g.best[row0 + t], row_best[t]);
    barrier();
    if (tid == 0)
        *ticket_slot = cuda::atomic_ref<unsigned, cuda::thread_scope_device>(*g.ticket)
                           .fetch_add(1u, cuda::memory_order_acq_rel);
    barrier();
    if (*ticket_slot != gridDim.x - 1) return;
    for (int t = tid; t < rows; t += threads) {
        const unsigned long long b = __ldcg(&g.best[row0 + t]);
        const int id = b ? rank_id(b) : 0;  // none: every logit -inf or NaN
        g.next[row0 + t] = id;
        if (g.next_copy) g.next_copy[row0 + t] = id;
        g.best[row0 + t] = 0ull;
    }
    if (tid == 0) *g.ticket = 0u;
}
