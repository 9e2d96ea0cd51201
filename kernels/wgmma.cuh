// Hopper's warpgroup MMA (wgmma, sm_90a only): the PTX wrappers the prefill attention
// (fused_attention.cu) and the few-row products (gemm_rows.cu, logits_rows.cu) use. A warpgroup
// (four consecutive warps, 128 threads) multiplies a 64-row A, from registers or shared memory, by
// a B tile in shared memory that a 64-bit descriptor locates, into fp32 accumulators,
// asynchronously: the MMAs are issued, committed as a group and waited for, and only then are the
// accumulators read. Every thread of the warpgroup must issue the same wgmma.
//
// The register layouts are mma.sync's (mma.cuh), one warp per 16 rows: warp w of the warpgroup
// holds rows 16 w.. of A as an m16k16 fragment (four bf16x2 registers) and the same rows of D as
// its m16n8 accumulator tiles, one per 8 columns. So the softmax code that works on mma.sync's
// accumulators works on these unchanged, and S's accumulators are P's A fragment as they are there.
//
// Compiled for any other target the wrappers trap: callers launch the kernels that use them only
// on compute capability 9.0 from a build that has sm_90a code (GPT2_SM90A, set by the Makefile).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_ASM(...) __trap()
#else
#define WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#endif

// The descriptor of a bf16 tile of 64-element (128-byte) rows in shared memory under the 128-byte
// swizzle: 16-byte chunk c of row r stored at chunk c ^ (r % 8) of its row, the tile 1024-byte
// aligned (the hardware swizzles on address bits 4-6 against 7-9). Groups of 8 rows lie 1024 bytes
// apart (the stride byte offset). Read K-major (a row is one n, its 64 elements along k: advance
// 32 bytes, +2 here, per 16 k) or N-major (a row is one k, its 64 elements along n: advance
// 16 rows, +128 here, per 16 k); with exactly 64 elements along the row dimension the leading
// byte offset is never used either way.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void *tile) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(tile);
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

// Orders this thread's register writes (accumulators, A fragments) before the wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() { WGMMA_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { WGMMA_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are in flight: their accumulators may then be read.
template <int N> __device__ __forceinline__ void wgmma_wait() {
    WGMMA_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written through the generic proxy (st.shared, cp.async) made visible to wgmma's
// async-proxy reads: each writing thread, after its writes land and before the barrier.
__device__ __forceinline__ void fence_proxy_async_smem() { WGMMA_ASM("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Pins registers at this point of the program: the compiler may not move their reads or writes
// across it, so that the fence and the wait above bracket the accesses they are meant to.
template <int N> __device__ __forceinline__ void wgmma_hold(float (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(r[i][e])::"memory");
}
template <int N> __device__ __forceinline__ void wgmma_hold(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(r[i][e])::"memory");
}

// d (64 x 64 fp32; this thread's eight m16n8 tiles) = (accumulate ? d : 0) + a (64 x 16 bf16, this
// warp's m16k16 fragment) * B (16 x 64 bf16 in shared memory at b_desc; TRANS_B 0: K-major, 1:
// N-major).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b_desc,
                                                bool accumulate) {
    WGMMA_ASM(
        "{\n.reg .pred acc;\nsetp.ne.b32 acc, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, acc, 1, 1, %38;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"((int)accumulate), "n"(TRANS_B));
}


// ----------------------------------------------------------------------------
// Both operands in shared memory (the few-row products, gemm_rows.cu and logits_rows.cu)

// d (64 x N fp32; this thread's N / 8 m16n8 tiles, laid out as above) += A (64 x 16 bf16) * B
// (16 x N bf16), A and B K-major tiles under the 128-byte swizzle at their descriptors. Only the
// widths the few-row products and the many-row tiles (gemm_tiles.cu: 48, 72, 96, 144, 192) use are
// instantiated.
template <int N> __device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t a_desc, uint64_t b_desc);

#define WGMMA_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WGMMA_D8(j) WGMMA_D4(j), WGMMA_D4(j + 1)
template <> __device__ __forceinline__ void wgmma_ss<16>(float (&d)[2][4], uint64_t a_desc, uint64_t b_desc) {
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
              "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
              "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
              : WGMMA_D8(0)
              : "l"(a_desc), "l"(b_desc), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_ss<32>(float (&d)[4][4], uint64_t a_desc, uint64_t b_desc) {
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
              "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
              "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
              : WGMMA_D8(0), WGMMA_D8(2)
              : "l"(a_desc), "l"(b_desc), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_ss<64>(float (&d)[8][4], uint64_t a_desc, uint64_t b_desc) {
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
              "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
              "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
              : WGMMA_D8(0), WGMMA_D8(2), WGMMA_D8(4), WGMMA_D8(6)
              : "l"(a_desc), "l"(b_desc), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_ss<48>(float (&d)[6][4], uint64_t a_desc, uint64_t b_desc) {
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
              "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
              "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, %24, %25, p, 1, 1, 0, 0;\n}\n"
              : WGMMA_D8(0), WGMMA_D8(2), WGMMA_D8(4)
              : "l"(a_desc), "l"(b_desc), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_ss<72>(float (&d)[9][4], uint64_t a_desc, uint64_t b_desc) {
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
              "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 "
              "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35}, %36, %37, p, 1, 1, 0, 0;\n}\n"
              : WGMMA_D8(0), WGMMA_D8(2), WGMMA_D8(4), WGMMA_D8(6), WGMMA_D4(8)
              : "l"(a_desc), "l"(b_desc), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_ss<96>(float (&d)[12][4], uint64_t a_desc, uint64_t b_desc) {
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
              "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
              "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, %48, %49, p, 1, 1, 0, 0;\n}\n"
              : WGMMA_D8(0), WGMMA_D8(2), WGMMA_D8(4), WGMMA_D8(6), WGMMA_D8(8), WGMMA_D8(10)
              : "l"(a_desc), "l"(b_desc), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_ss<144>(float (&d)[18][4], uint64_t a_desc, uint64_t b_desc) {
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %74, 0;\n"
              "wgmma.mma_async.sync.aligned.m64n144k16.f32.bf16.bf16 "
              "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71}, %72, %73, p, 1, 1, 0, 0;\n}\n"
              : WGMMA_D8(0), WGMMA_D8(2), WGMMA_D8(4), WGMMA_D8(6), WGMMA_D8(8), WGMMA_D8(10), WGMMA_D8(12), WGMMA_D8(14), WGMMA_D8(16)
              : "l"(a_desc), "l"(b_desc), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_ss<192>(float (&d)[24][4], uint64_t a_desc, uint64_t b_desc) {
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
              "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
              "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}, %96, %97, p, 1, 1, 0, 0;\n}\n"
              : WGMMA_D8(0), WGMMA_D8(2), WGMMA_D8(4), WGMMA_D8(6), WGMMA_D8(8), WGMMA_D8(10), WGMMA_D8(12), WGMMA_D8(14), WGMMA_D8(16), WGMMA_D8(18), WGMMA_D8(20), WGMMA_D8(22)
              : "l"(a_desc), "l"(b_desc), "r"(1));
}
#undef WGMMA_D8
#undef WGMMA_D4

// One 64-wide k slice of such a product (the few-row products' unit: one TMA box of each operand),
// a 64 rows and b N rows (descriptors ad and bd), each 64 k: d += a b^T, its four k16 MMAs. They join
// the caller's group: WgmmaTile below fences before them and commits after.
template <int N> __device__ __forceinline__ void wgmma_slice_ss(float (&d)[N / 8][4], uint64_t ad, uint64_t bd) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_ss<N>(d, ad + 2 * kk, bd + 2 * kk);  // +32 bytes a k16
}

// The same slice with its k16 MMAs alternately into d0 (k 0-15, 32-47) and d1 (k 16-31, 48-63): two
// independent chains of accumulation, so the group completes sooner than one chain of four where a
// slice's latency, not the tensor cores' rate, is on the path (the logits' ring, logits_rows.cu;
// gemm_rows.cu's 32- and 64-row tiles).
// d1 is added into d0 when the tile is done (WgmmaTile::sum below).
template <int N>
__device__ __forceinline__ void wgmma_slice_ss2(float (&d0)[N / 8][4], float (&d1)[N / 8][4], uint64_t ad,
                                                uint64_t bd) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_ss<N>(kk % 2 ? d1 : d0, ad + 2 * kk, bd + 2 * kk);
}

// A few-row product's tile of accumulators (64 x N fp32) over its slices, in CHAINS chains: one
// (wgmma_slice_ss) or two (wgmma_slice_ss2, the odd k16 steps into a second set). zero() before the
// first slice, slice() for each (a committed group each: slices that land one by one, logits_rows.cu's
// ring), hold() after each wait, then sum(): d holds the tile. Slices that have all landed go in one group
// instead (gemm_rows.cu): hold(), wgmma_fence(), slice_in_group() for each, wgmma_commit().
template <int N, int CHAINS> struct WgmmaTile {
    static_assert(CHAINS == 1 || CHAINS == 2, "one chain of MMAs or two");
    float d[N / 8][4];
    float odd[CHAINS == 2 ? N / 8 : 1][4];  // the second chain's (unused with one)

    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int j = 0; j < N / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) d[j][e] = 0.0f;
        if constexpr (CHAINS == 2)
#pragma unroll
            for (int j = 0; j < N / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) odd[j][e] = 0.0f;
    }
    __device__ __forceinline__ void slice(const void *a, const void *b) {
        const uint64_t ad = wgmma_desc_sw128(a), bd = wgmma_desc_sw128(b);  // before the fence, off the MMAs' path
        hold();
        wgmma_fence();
        mmas(ad, bd);
        wgmma_commit();
    }
    __device__ __forceinline__ void slice_in_group(const void *a, const void *b) {
        mmas(wgmma_desc_sw128(a), wgmma_desc_sw128(b));
    }
    __device__ __forceinline__ void mmas(uint64_t ad, uint64_t bd) {
        if constexpr (CHAINS == 2) wgmma_slice_ss2<N>(d, odd, ad, bd);
        else wgmma_slice_ss<N>(d, ad, bd);
    }
    __device__ __forceinline__ void hold() {
        wgmma_hold(d);
        if constexpr (CHAINS == 2) wgmma_hold(odd);
    }
    __device__ __forceinline__ void sum() {
        if constexpr (CHAINS == 2)
#pragma unroll
            for (int j = 0; j < N / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) d[j][e] += odd[j][e];
    }
};

#undef WGMMA_ASM
