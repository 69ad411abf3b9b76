// Fused W4A16 MoE for decode shapes (Kimi K2.x / DeepSeek-V3 routed experts): the kernels that
// data/dispatch/*.json names, launched by workbench/moe/fused.py.
//
// Two weight layouts (workbench/moe/packing.py):
//  - compressed-tensors pack-quantized (workbench/int4.py), read by the four-launch path: int32 words
//    [rows, K/8], eight 4-bit values q+8 per word along K (value j in bits 4j..4j+3), bf16 scales
//    [rows, K/32] (symmetric, group 32), experts stacked and gate_proj / up_proj rows concatenated:
//    gate_up [E, 2I, H/8], down [E, H, I/8];
//  - the fragment layout, read by the small-M kernels (second half of this file).
//
// Four-launch path (any M, no host synchronisation):
//   moe_align      one CTA: counts (token, k) pairs per expert, sorts pair ids
//                  by expert and cuts each expert's list into work items of at
//                  most C = 8*NT pairs: (expert, first slot, count).
//   moe_gate_up_*  per (work item, row tile): gate/up GEMM on tensor cores
//                  (mma.m16n8k16 bf16 -> f32), SiLU(gate)*up fused, h stored
//                  as bf16 [P, I] in sorted-slot order.
//   moe_down_*     per (work item, row tile): down GEMM; y * routing weight
//                  stored f32 [P, H] by pair index p = token*topk + k.
//   moe_combine    out[t] = bf16(sum_k Y[t*topk + k]) in a fixed order.
//
// GEMM mapping: a warp owns RT tiles of 16 weight rows and 1/4 of K (the four
// warps of a CTA split K and reduce through shared memory). mma rows = weight
// rows, mma columns = up to 8 routed tokens per token tile (NT tiles).
// Lane (g = lane/4, t = lane%4) loads one whole quantisation group (16 bytes =
// 32 int4) of rows g and g+8 per 128-wide K step (group 4*step + t), so each
// mma's K slots map to physical K positions chosen per thread; B (activations)
// uses the same mapping, so the dot product is unchanged. Int4 -> bf16 with
// the magic-number trick: (w >> 4i) & 0x000F000F | 0x43004300 gives the pair
// (128 + u_i, 128 + u_{i+4}); subtract 136 (exact) and multiply by the group
// scale (one bf16 rounding). Activation pairs (x_i, x_{i+4}) are built with
// byte permutes. Weights are streamed with L1::no_allocate 16-byte loads,
// D steps ahead in registers, or through an S-stage cp.async ring of whole lines.
//
// Every other form tried (one-launch small-M kernels: version 3, split-K, CTA-split, warp-split and
// their ring / fence / prefetch variants; other four-launch variants; streaming probes and
// diagnostic builds) is in git history at 2c78290 (papers/moe_int4.md, versions table).
#include <cuda_bf16.h>

#define MOE_WARPS 4

__device__ __forceinline__ uint4 ld_stream16(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

__device__ __forceinline__ unsigned int ld_u16(const unsigned short* p) {
    unsigned short v;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return (unsigned int)v;
}

__device__ __forceinline__ unsigned int bf2_sub(unsigned int a, unsigned int b) {
    __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a);
    __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162*>(&b);
    __nv_bfloat162 r = __hsub2(x, y);
    return *reinterpret_cast<unsigned int*>(&r);
}

__device__ __forceinline__ unsigned int bf2_mul(unsigned int a, unsigned int b) {
    __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a);
    __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162*>(&b);
    __nv_bfloat162 r = __hmul2(x, y);
    return *reinterpret_cast<unsigned int*>(&r);
}

// Dequantise the pair (u_i, u_{i+4}) of word w with scale pair s2.
__device__ __forceinline__ unsigned int deq_pair(unsigned int w, int i, unsigned int s2) {
    unsigned int v = ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u;  // 128 + u
    v = bf2_sub(v, 0x43084308u);                                       // - 136 -> q
    return bf2_mul(v, s2);
}

__device__ __forceinline__ void mma_bf16(float* c, unsigned int a0, unsigned int a1, unsigned int a2,
                                         unsigned int a3, unsigned int b0, unsigned int b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gsrc) {
    const unsigned int d = (unsigned int)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(gsrc) : "memory");
}

__device__ __forceinline__ void cp_async4(void* smem_dst, const void* gsrc) {
    const unsigned int d = (unsigned int)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(gsrc) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// One 128-wide K step of a warp: RT row tiles x NT token tiles of mma.m16n8k16.
// wa/wb: the 16-byte group of rows g / g+8; sa2/sb2: their scales as bf16x2 (s, s);
// xq: the 32 activations of token column g of each token tile.
template <int NT, int RT>
__device__ __forceinline__ void compute_step(float (&acc)[RT][NT][4], const uint4 (&wa4)[RT], const uint4 (&wb4)[RT],
                                             const unsigned int (&sa2)[RT], const unsigned int (&sb2)[RT],
                                             const uint4 (&xq)[NT][4]) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {   // word w of the group: K elements 8w..8w+7
        unsigned int bx[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const uint4 u = xq[n][w];
            // (x0,x4) (x1,x5) (x2,x6) (x3,x7)
            bx[n][0] = __byte_perm(u.x, u.z, 0x5410);
            bx[n][1] = __byte_perm(u.x, u.z, 0x7632);
            bx[n][2] = __byte_perm(u.y, u.w, 0x5410);
            bx[n][3] = __byte_perm(u.y, u.w, 0x7632);
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            const uint4 A4 = wa4[r];
            const uint4 B4 = wb4[r];
            const unsigned int wa = w == 0 ? A4.x : w == 1 ? A4.y : w == 2 ? A4.z : A4.w;
            const unsigned int wb = w == 0 ? B4.x : w == 1 ? B4.y : w == 2 ? B4.z : B4.w;
            const unsigned int a00 = deq_pair(wa, 0, sa2[r]);
            const unsigned int a01 = deq_pair(wa, 1, sa2[r]);
            const unsigned int a02 = deq_pair(wa, 2, sa2[r]);
            const unsigned int a03 = deq_pair(wa, 3, sa2[r]);
            const unsigned int b00 = deq_pair(wb, 0, sb2[r]);
            const unsigned int b01 = deq_pair(wb, 1, sb2[r]);
            const unsigned int b02 = deq_pair(wb, 2, sb2[r]);
            const unsigned int b03 = deq_pair(wb, 3, sb2[r]);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                mma_bf16(acc[r][n], a00, b00, a01, b01, bx[n][0], bx[n][1]);
                mma_bf16(acc[r][n], a02, b02, a03, b03, bx[n][2], bx[n][3]);
            }
        }
    }
}

template <int NT>
__device__ __forceinline__ void load_x(uint4 (&xq)[NT][4], const uint4* const (&xrow)[NT], int G) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if (xrow[n] != nullptr) xq[n][q] = __ldg(xrow[n] + 4 * G + q);
            else xq[n][q] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

struct StepBuf {
    uint4 wa, wb;          // group of row g and of row g+8
    unsigned int sa, sb;   // their scales (bf16 bits)
};

// One CTA = MOE_WARPS warps; grid.x = row-tile blocks of RT tiles, grid.y = work items.
// GATE_UP: weights [E, 2*I, H/8], K = H, output h [P, I] bf16 by slot.
// DOWN:    weights [E, H, I/8],   K = I, output Y [P, H] f32 by pair.
// S == 0: weights prefetched D steps ahead in registers.
// S > 0 (with LINE):  weights and scales stream through a per-warp ring of S shared-memory
//         stages with cp.async (S - 1 steps in flight, no register cost);
//         activations are prefetched one step ahead in registers.
// LINE (with S > 0): a stage is two K steps; each cp.async instruction of a warp fetches 4 rows x
//         128 contiguous bytes (whole L2 lines) and scatters them to the lanes that consume them,
//         halving the L2 requests per byte against the fragment-order loads (needs an even
//         number of steps per warp: K a multiple of 1024).
template <int NT, int RT, int D, int S, bool LINE, bool GATE_UP>
__device__ __forceinline__ void moe_gemm(
    const uint4* __restrict__ W, const unsigned short* __restrict__ Sc,
    const __nv_bfloat16* __restrict__ X,      // GATE_UP: hidden [M, H]; DOWN: h [P, I]
    const int* __restrict__ sorted_pair, const int* __restrict__ items, const int* __restrict__ num_items,
    const float* __restrict__ topk_w, int topk, int H, int I,
    __nv_bfloat16* __restrict__ h_out, float* __restrict__ y_out) {
    // S > 0: RT x (2 x 32 lanes x 16 B weights + 2 x 32 lanes x 4 B scales) per step;
    // LINE: RT x (2 steps x 2 x 32 lanes x 16 B weights + 16 rows x 8 bf16 scales) per two steps.
    constexpr int STAGE_BYTES = LINE ? RT * 2304 : RT * 1280;
    constexpr int RED_FLOATS = RT * NT * 4 * 32;
    __shared__ __align__(16) unsigned char smem[S > 0 ? MOE_WARPS * S * STAGE_BYTES : (MOE_WARPS - 1) * RED_FLOATS * 4];

    const int item = blockIdx.y;
    if (item >= num_items[0]) return;
    const int expert = items[3 * item];
    const int slot0 = items[3 * item + 1];
    const int count = items[3 * item + 2];

    const int K = GATE_UP ? H : I;
    const int rows_total = GATE_UP ? 2 * I : H;
    const int kgroups = K / 32;           // uint4 per row, scales per row
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;

    const long long wexp = (long long)expert * rows_total * kgroups;
    const uint4* Wb = W + wexp;
    const unsigned short* Sb = Sc + wexp;

    // rows of this thread for each row tile
    int rowA[RT], rowB[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const int tile = blockIdx.x * RT + r;
        if (GATE_UP) {
            rowA[r] = tile * 8 + g;          // gate feature f
            rowB[r] = I + tile * 8 + g;      // up feature f
        } else {
            rowA[r] = tile * 16 + g;
            rowB[r] = tile * 16 + 8 + g;
        }
    }

    // activation rows (uint4 pointers) for token column g of each token tile
    const uint4* xrow[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const int j = n * 8 + g;
        if (j < count) {
            const int slot = slot0 + j;
            if (GATE_UP) {
                const int tok = sorted_pair[slot] / topk;
                xrow[n] = reinterpret_cast<const uint4*>(X + (long long)tok * H);
            } else {
                xrow[n] = reinterpret_cast<const uint4*>(X + (long long)slot * I);
            }
        } else {
            xrow[n] = nullptr;
        }
    }

    float acc[RT][NT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[r][n][c] = 0.f;

    const int steps = K / (128 * MOE_WARPS);   // 128-wide K steps per warp
    const int step0 = warp * steps;

    if constexpr (S == 0) {
    StepBuf buf[D][RT];
    auto fill = [&](int d, int G) {   // register slot d <- the weights and scales of K group G
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            buf[d][r].wa = ld_stream16(Wb + (long long)rowA[r] * kgroups + G);
            buf[d][r].wb = ld_stream16(Wb + (long long)rowB[r] * kgroups + G);
            buf[d][r].sa = ld_u16(Sb + (long long)rowA[r] * kgroups + G);
            buf[d][r].sb = ld_u16(Sb + (long long)rowB[r] * kgroups + G);
        }
    };
#pragma unroll
    for (int d = 0; d < D; ++d) {
        if (d < steps) fill(d, 4 * (step0 + d) + t);
    }

#pragma unroll 1
    for (int j0 = 0; j0 < steps; j0 += D) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int j = j0 + d;
            if (j < steps) {
                const int G = 4 * (step0 + j) + t;
                // activations of this step: 32 bf16 (4 x uint4) per token tile
                uint4 xq[NT][4];
                load_x<NT>(xq, xrow, G);
                unsigned int sa2[RT], sb2[RT];
                uint4 wa4[RT], wb4[RT];
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    sa2[r] = buf[d][r].sa | (buf[d][r].sa << 16);
                    sb2[r] = buf[d][r].sb | (buf[d][r].sb << 16);
                    wa4[r] = buf[d][r].wa;
                    wb4[r] = buf[d][r].wb;
                }
                compute_step<NT, RT>(acc, wa4, wb4, sa2, sb2, xq);
                // refill this buffer slot with step j + D
                if (j + D < steps) fill(d, G + 4 * D);
            }
        }
    }
    } else if constexpr (LINE) {
    unsigned char* ring = smem + warp * (S * STAGE_BYTES);
    const int nst = steps / 2;                  // stages of two steps
    const int gbase = 4 * step0;                // first group of this warp's K range
    auto issue = [&](int jj, int slot) {
        unsigned char* st = ring + slot * STAGE_BYTES;
        const int c = lane & 7;                 // 16-byte chunk of the 128-byte line
#pragma unroll
        for (int rr = 0; rr < RT; ++rr) {
            const int tile = blockIdx.x * RT + rr;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = 4 * i + (lane >> 3);   // row 0..15 of the tile
                const int grow = GATE_UP ? (r < 8 ? tile * 8 + r : I + tile * 8 + (r - 8)) : tile * 16 + r;
                const int sidx = c >> 2, tt = c & 3, gg = r & 7, rowsel = r >> 3;
                cp_async16(st + rr * 2048 + ((sidx * 2 + rowsel) * 32 + gg * 4 + tt) * 16,
                           Wb + (long long)grow * kgroups + gbase + 8 * jj + c);
            }
            if (lane < 16) {
                const int r = lane;
                const int grow = GATE_UP ? (r < 8 ? tile * 8 + r : I + tile * 8 + (r - 8)) : tile * 16 + r;
                cp_async16(st + RT * 2048 + rr * 256 + r * 16, Sb + (long long)grow * kgroups + gbase + 8 * jj);
            }
        }
    };
#pragma unroll
    for (int q = 0; q < S - 1; ++q) {
        if (q < nst) issue(q, q);
        cp_async_commit();
    }
    uint4 xq[NT][4];
    load_x<NT>(xq, xrow, 4 * step0 + t);
#pragma unroll 1
    for (int jj = 0; jj < nst; ++jj) {
        if (jj + S - 1 < nst) issue(jj + S - 1, (jj + S - 1) % S);
        cp_async_commit();
        cp_async_wait<S - 1>();
        __syncwarp();   // lanes read 16-byte pieces that other lanes copied
        const unsigned char* st = ring + (jj % S) * STAGE_BYTES;
#pragma unroll
        for (int sidx = 0; sidx < 2; ++sidx) {
            const int j = 2 * jj + sidx;
            uint4 xn[NT][4];
            if (j + 1 < steps) load_x<NT>(xn, xrow, 4 * (step0 + j + 1) + t);
            uint4 wa4[RT], wb4[RT];
            unsigned int sa2[RT], sb2[RT];
#pragma unroll
            for (int rr = 0; rr < RT; ++rr) {
                wa4[rr] = *reinterpret_cast<const uint4*>(st + rr * 2048 + ((sidx * 2 + 0) * 32 + lane) * 16);
                wb4[rr] = *reinterpret_cast<const uint4*>(st + rr * 2048 + ((sidx * 2 + 1) * 32 + lane) * 16);
                const unsigned short* sc = reinterpret_cast<const unsigned short*>(st + RT * 2048 + rr * 256);
                const unsigned int va = sc[g * 8 + 4 * sidx + t];
                const unsigned int vb = sc[(g + 8) * 8 + 4 * sidx + t];
                sa2[rr] = va | (va << 16);
                sb2[rr] = vb | (vb << 16);
            }
            compute_step<NT, RT>(acc, wa4, wb4, sa2, sb2, xq);
            if (j + 1 < steps) {
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int q = 0; q < 4; ++q) xq[n][q] = xn[n][q];
            }
        }
        __syncwarp();   // every lane is done with this stage before the next issue overwrites it
    }
    cp_async_wait<0>();
    } else {
        static_assert(S == 0 || LINE, "S > 0 rings are built by whole lines (LINE); the fragment-order ring is in git at 2c78290");
    }

    // reduce the four K quarters (fixed order: warp 0 + 1 + 2 + 3)
    // (S > 0: each warp's partial sums go into its own, now idle, ring; S == 0: a dedicated buffer)
    auto red_of = [&](int w) -> float* {
        return S > 0 ? reinterpret_cast<float*>(smem + w * (S * STAGE_BYTES))
                     : reinterpret_cast<float*>(smem) + (w - 1) * RED_FLOATS;
    };
    if (warp > 0) {
        float* red = red_of(warp);
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int c = 0; c < 4; ++c) red[((r * NT + n) * 4 + c) * 32 + lane] = acc[r][n][c];
    }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int w2 = 1; w2 < MOE_WARPS; ++w2) {
        const float* red = red_of(w2);
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[r][n][c] += red[((r * NT + n) * 4 + c) * 32 + lane];
    }

    // epilogue: c0 (row g, col 2t), c1 (row g, col 2t+1), c2 (row g+8, col 2t), c3 (row g+8, col 2t+1)
#pragma unroll
    for (int r = 0; r < RT; ++r) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
                const int jcol = n * 8 + 2 * t + cc;
                if (jcol >= count) continue;
                const int slot = slot0 + jcol;
                if (GATE_UP) {
                    const float gt = acc[r][n][cc];
                    const float up = acc[r][n][2 + cc];
                    const float hval = gt / (1.f + __expf(-gt)) * up;
                    h_out[(long long)slot * I + rowA[r]] = __float2bfloat16(hval);
                } else {
                    const int pair = sorted_pair[slot];
                    const float wgt = topk_w[pair];
                    y_out[(long long)pair * H + rowA[r]] = wgt * acc[r][n][cc];
                    y_out[(long long)pair * H + rowB[r]] = wgt * acc[r][n][2 + cc];
                }
            }
        }
    }
}

#define MOE_INSTANCE(NT, RT, D, S, LINE, TAG)                                                          \
    extern "C" __global__ void __launch_bounds__(128) moe_gate_up_nt##NT##_rt##RT##_##TAG(              \
        const uint4* W, const unsigned short* Sc, const __nv_bfloat16* X, const int* sorted_pair,      \
        const int* items, const int* num_items, int topk, int H, int I, __nv_bfloat16* h_out) {       \
        moe_gemm<NT, RT, D, S, LINE, true>(W, Sc, X, sorted_pair, items, num_items, nullptr, topk, H, \
                                           I, h_out, nullptr);                                         \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(128) moe_down_nt##NT##_rt##RT##_##TAG(                 \
        const uint4* W, const unsigned short* Sc, const __nv_bfloat16* h, const int* sorted_pair,      \
        const int* items, const int* num_items, const float* topk_w, int topk, int H, int I,           \
        float* y_out) {                                                                                \
        moe_gemm<NT, RT, D, S, LINE, false>(W, Sc, h, sorted_pair, items, num_items, topk_w, topk, H, \
                                            I, nullptr, y_out);                                        \
    }

// Variants (token tiles NT, row tiles per warp RT, then d<D>: D register-prefetched steps,
// l<S>: S-stage ring of whole-line fetches) that data/dispatch/*.json names (moe_large), and nt1_rt2_d2, which
// workbench/moe/fused.py runs instead of a whole-line variant when H or I is not a multiple of 1024.
// (The other variants, d4 / s4 / l4 / l5 and NT = 2 whole-line, were never dispatched; in git history at 2c78290.)
MOE_INSTANCE(1, 2, 2, 0, false, d2)
MOE_INSTANCE(2, 2, 2, 0, false, d2)
MOE_INSTANCE(4, 2, 2, 0, false, d2)
MOE_INSTANCE(1, 2, 0, 2, true, l2)

// One CTA of 1024 threads; E <= 1024. ids [P] int32 (P = M * topk).
// Out: sorted_pair [P] (pair ids grouped by expert), items [max_items][3]
// (expert, first slot, count <= C), num_items [1].
// Pairs whose expert id is outside [0, E) are dropped (moe_combine writes NaN
// for their token).
extern "C" __global__ void __launch_bounds__(1024) moe_align(
    const int* __restrict__ ids, int P, int E, int C, int* __restrict__ sorted_pair,
    int* __restrict__ items, int* __restrict__ num_items, int max_items) {
    __shared__ int cnt[1024];
    __shared__ int cursor[1024];
    __shared__ int wsum_c[32], wsum_ch[32];
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    cnt[tid] = 0;
    cursor[tid] = 0;
    __syncthreads();
    for (int p = tid; p < P; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    const int c = tid < E ? cnt[tid] : 0;
    const int ch = (c + C - 1) / C;
    int ic = c, ich = ch;   // inclusive warp scans
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, ic, o);
        const int b = __shfl_up_sync(0xffffffffu, ich, o);
        if (lane >= o) { ic += a; ich += b; }
    }
    if (lane == 31) { wsum_c[warp] = ic; wsum_ch[warp] = ich; }
    __syncthreads();
    if (warp == 0) {
        int vc = wsum_c[lane], vch = wsum_ch[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, vc, o);
            const int b = __shfl_up_sync(0xffffffffu, vch, o);
            if (lane >= o) { vc += a; vch += b; }
        }
        wsum_c[lane] = vc;    // inclusive over warps
        wsum_ch[lane] = vch;
    }
    __syncthreads();
    const int base_c = warp > 0 ? wsum_c[warp - 1] : 0;
    const int base_ch = warp > 0 ? wsum_ch[warp - 1] : 0;
    const int off = base_c + ic - c;      // exclusive prefix of counts
    const int choff = base_ch + ich - ch; // exclusive prefix of chunks
    if (tid < E) {
        for (int q = 0; q < ch; ++q) {
            const int idx = choff + q;
            if (idx < max_items) {
                items[3 * idx] = tid;
                items[3 * idx + 1] = off + q * C;
                items[3 * idx + 2] = min(C, c - q * C);
            }
        }
    }
    if (tid == blockDim.x - 1) {
        const int total = wsum_ch[31];
        num_items[0] = total < max_items ? total : max_items;
    }
    cnt[tid] = off;   // reuse as exclusive offsets (all reads of cnt finished above)
    __syncthreads();
    for (int p = tid; p < P; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < E) {
            const int pos = cnt[e] + atomicAdd(&cursor[e], 1);
            sorted_pair[pos] = p;
        }
    }
}

// out [M, H] bf16 = sum_k Y[(m*topk + k), :] (k ascending). grid (ceil(H/4/256), M), block 256.
extern "C" __global__ void __launch_bounds__(256) moe_combine(
    const float* __restrict__ Y, const int* __restrict__ ids, int topk, int E, int H,
    __nv_bfloat16* __restrict__ out) {
    const int m = blockIdx.y;
    const int c4 = blockIdx.x * blockDim.x + threadIdx.x;
    if (4 * c4 >= H) return;
    bool ok = true;
    for (int k = 0; k < topk; ++k) {
        const int e = ids[m * topk + k];
        ok = ok && e >= 0 && e < E;
    }
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    if (ok) {
        for (int k = 0; k < topk; ++k) {
            const float4 v = *reinterpret_cast<const float4*>(Y + (long long)(m * topk + k) * H + 4 * c4);
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        }
    } else {
        s = make_float4(__int_as_float(0x7fc00000), __int_as_float(0x7fc00000),
                        __int_as_float(0x7fc00000), __int_as_float(0x7fc00000));
    }
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out + (long long)m * H + 4 * c4);
    o[0] = __floats2bfloat162_rn(s.x, s.y);
    o[1] = __floats2bfloat162_rn(s.z, s.w);
}

// ===================================================================================================
// Small-M path (P = M * topk <= 128 pairs): two launches, gate/up then down (the "phased" form).
//
// Weights in the fragment layout (workbench/moe/packing.py: fragment_pack / fragment_stages, stage-major):
// int32 [E, K/256, R/16, 4, 144]; for each 64-wide K step and tile of 16 rows a 576-byte block: 128 words
// of nibbles (lane-major: word 4*lane + kc is the whole A fragment of mma chunk kc for that lane) then 16
// words of bf16 scale pairs (word 2*g + gr: row g (low), row g+8 (high) of quantisation group gr). The
// four blocks of one tile and 256-wide K stage are one contiguous 2304-byte stretch: a warp copies one
// stretch (4096 weights) per loop iteration (one cp.async wait, one warp barrier), and the stretches of
// neighbouring tiles (tasks taken at the same time by other warps) are adjacent, so the warps of an
// expert sweep its weights together, as a copy does.
// Chunk kc = 2*gr + h of lane (g, t) covers physical K = 64*s + 32*gr + 8*t + 4*h + {0,1,2,3}:
// mma k slots (2t, 2t+1, 2t+8, 2t+9) -> those four, for A and B alike, so the 16 slots of a chunk
// stay inside quantisation group gr and the group scale is applied once per group to fp32
// partial sums. Nibble j of the word: A register j&3 (row g / g+8 alternating, k pair kb/kb+2),
// low half from nibble j, high half from nibble j+4: register r = (w >> 4r) & 0x000F000F | 0x43004300
// = bf16 pair (128 + u): one shift and one LOP3 per two weights, then one exact bf16x2 subtraction of
// 136 (u = q + 8).
//
// Items: every CTA sorts the pairs by (expert, pair id) in shared memory (small_prologue) and cuts them
// into items of <= 8 slots of one expert (one mma token tile; columns past an item's count read its first
// row and are not stored).

#define FR_WORDS 144
#define FR_U4 36          // uint4 per (tile, 64-wide step)
#define FR_SUB 4          // 64-wide steps per ring stage: 16 rows x 256 K = 4096 weights per warp iteration
#define FR_STAGE_U4 144   // uint4 per stage (FR_SUB * FR_U4): 2304 bytes
#define FR_S 3            // shared-memory stages per warp (FR_S - 1 stages = 4.6 KB in flight)
#define FR_CHUNK 8        // slots per item (one token tile: 16 would need a second one, which spills at 80 registers)
#define FR_MAX_PAIRS 128


__device__ __forceinline__ uint4 ld_cg16(const void* p) {
    uint4 r;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}


// Token m's output value as the sum over its k experts (ascending) in one fp32 chain from 0: add(sum, pair) adds pair
// m * topk + k's contribution(s) to the chain; NaN for a token with an invalid id (s_e[pair] < 0).
template <typename Add>
__device__ __forceinline__ float token_sum_over_k(const int* s_e, int m, int topk, Add add) {
    bool ok = true;
    for (int k = 0; k < topk; ++k) ok = ok && s_e[m * topk + k] >= 0;
    float sum = __int_as_float(0x7fc00000);
    if (ok) {
        sum = 0.f;
        for (int k = 0; k < topk; ++k) add(sum, m * topk + k);
    }
    return sum;
}



__device__ __forceinline__ int ld_relaxed_gpu(const int* p) {
    int r;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(r) : "l"(p) : "memory");
    return r;
}


// Release / acquire at GPU scope (lighter than __threadfence, which is sequentially consistent).
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// 16 activations (bf16) of this lane's column: global, through L1 (gate_up: X is read-only) or L2 (down: h is
// written by other warps of this launch, so not through the incoherent L1).
template <bool COHERENT>
__device__ __forceinline__ uint4 ld_x16(const __nv_bfloat16* p) {
    return COHERENT ? ld_cg16(p) : __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ void cp_async16_s(unsigned int d, const void* gsrc) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(gsrc) : "memory");
}

// One 2304-byte ring stage (one tile's 256 K: four 512-byte blocks of weights, then lanes 0-15 copy the 256 bytes of
// scales) from this lane's first uint4 `src` to this lane's shared address `d` in the slot: five cp.async.
__device__ __forceinline__ void cp_async_stage(unsigned int d, const uint4* src, bool scale_lane) {
    cp_async16_s(d, src);
    cp_async16_s(d + 512, src + 32);
    cp_async16_s(d + 1024, src + 64);
    cp_async16_s(d + 1536, src + 96);
    if (scale_lane) cp_async16_s(d + 2048, src + 128);
}

// Byte offset of the ring slot after `slot` in a per-warp ring of RS stages of FR_STAGE_U4 uint4 each.
template <int RS>
__device__ __forceinline__ unsigned int ring_next(unsigned int slot) {
    return slot == (RS - 1) * FR_STAGE_U4 * 16 ? 0u : slot + FR_STAGE_U4 * 16;
}


// (w & 0x000F000F) | 0x43004300 in ONE instruction (written in C, ptxas emits an AND and an OR).
__device__ __forceinline__ unsigned int nib_pair(unsigned int w) {
    unsigned int r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "n"(0x000F000F), "n"(0x43004300));
    return r;
}

// One 64-wide K step of one 16-row tile: 4 mma chunks, 2 quantisation groups. A register r of chunk kc is
// nib_pair(word >> 4r) = the bf16 pair (128 + u) (one shift, one LOP3), minus 136 by one exact bf16x2
// subtraction; the group scale multiplies the fp32 partial sum of its two chunks.
template <int NT>
__device__ __forceinline__ void frag_step(float (&acc)[NT][4], const uint4 w, const uint2 sc,
                                          const uint4 (&xq)[NT][2]) {
    const unsigned int wq[4] = {w.x, w.y, w.z, w.w};
    const unsigned int sw[2] = {sc.x, sc.y};
#pragma unroll
    for (int gr = 0; gr < 2; ++gr) {
        float tmp[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) tmp[n][c] = 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned int word = wq[2 * gr + h];
            unsigned int a0 = nib_pair(word);
            unsigned int a1 = nib_pair(word >> 4);
            unsigned int a2 = nib_pair(word >> 8);
            unsigned int a3 = nib_pair(word >> 12);
            {   // exact: (128 + u) - 136 = q in [-8, 7]
                a0 = bf2_sub(a0, 0x43084308u);
                a1 = bf2_sub(a1, 0x43084308u);
                a2 = bf2_sub(a2, 0x43084308u);
                a3 = bf2_sub(a3, 0x43084308u);
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const unsigned int b0 = h == 0 ? xq[n][gr].x : xq[n][gr].z;
                const unsigned int b1 = h == 0 ? xq[n][gr].y : xq[n][gr].w;
                mma_bf16(tmp[n], a0, a1, a2, a3, b0, b1);
            }
        }
        const float s_lo = __uint_as_float(sw[gr] << 16);           // row g
        const float s_hi = __uint_as_float(sw[gr] & 0xFFFF0000u);   // row g + 8
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            acc[n][0] = fmaf(s_lo, tmp[n][0], acc[n][0]);
            acc[n][1] = fmaf(s_lo, tmp[n][1], acc[n][1]);
            acc[n][2] = fmaf(s_hi, tmp[n][2], acc[n][2]);
            acc[n][3] = fmaf(s_hi, tmp[n][3], acc[n][3]);
        }
    }
}

// Stream `nsup` stages (256 K each) of tile `wt` through this warp's ring of FR_S shared-memory stages
// (cp.async, FR_S - 1 = 2 stages in flight: 4.6 KB per warp); one wait and one warp barrier per stage of
// 4096 weights. A stage is 2304 contiguous bytes (four 576-byte blocks of 64 K), copied as 144 uint4: four
// per lane at fixed offsets plus one for lanes 0-15. Activations XD steps of 64 K ahead in registers,
// read at constant offsets from one pointer per column (every column points at a valid row: columns
// past the item's count repeat its first row, and their results are not stored).
// wait != nullptr: after the first weight copies are issued, spin until *wait >= target.
// XEND (XD = FR_SUB): the whole next stage's activations are loaded after the stage's last step, into the same
// registers, instead of each step's refill right after its use (which ptxas at 96 registers sinks to the stage's
// end anyway, then rotates the buffers with moves that wait for the loads).
// GDC: after the first weight copies are issued, griddepcontrol.wait (the phased form's down launch under programmatic
// dependent launch: the weights do not depend on the previous launch, the activations do).
template <int NT, bool COHERENT, int RS = FR_S, int XDP = 0, bool XEND = false, bool GDC = false>
__device__ __forceinline__ void frag_gemm(float (&acc)[NT][4], const uint4* __restrict__ wt, int nsup,
                                          long long sstride, const __nv_bfloat16* const (&xr)[NT], const int* wait,
                                          int target, unsigned char* ring) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[n][c] = 0.f;
    const uint4* src = wt + lane;
    const unsigned int dst0 = (unsigned int)__cvta_generic_to_shared(ring) + lane * 16;
    const bool scale_lane = lane < 16;
    int left = nsup;                 // stages not yet issued
    unsigned int wslot = 0;          // byte offset of the ring slot written next
    auto issue = [&]() {
        if (left > 0) {
            const unsigned int d = dst0 + wslot;
            cp_async_stage(d, src, scale_lane);
            src += sstride;
            --left;
        }
        cp_async_commit();
        wslot = ring_next<RS>(wslot);
    };
#pragma unroll
    for (int q = 0; q < RS - 1; ++q) issue();
    if (GDC) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (wait != nullptr) {
        if (lane == 0) {   // relaxed polling (an acquire load per poll would invalidate L1 each time), one fence
            while (ld_relaxed_gpu(wait) < target) __nanosleep(128);
            fence_acq_rel_gpu();
        }
        __syncwarp();
    }
    const __nv_bfloat16* xp[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) xp[n] = xr[n] + 8 * t;
    // activation prefetch distance in 64-K steps (registers: NT = 2 has 1); XDP > 0 overrides
    constexpr int XD = XDP > 0 ? XDP : (NT == 1 ? 2 : 1);
    static_assert(FR_SUB % XD == 0, "the activation buffers cycle per 64-K step: XD must divide FR_SUB");
    static_assert(!XEND || XD == FR_SUB, "XEND loads a whole stage: XD must equal FR_SUB");
    uint4 xb[XD][NT][2];
#pragma unroll
    for (int d = 0; d < XD; ++d)
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            xb[d][n][0] = ld_x16<COHERENT>(xp[n] + 64 * d);
            xb[d][n][1] = ld_x16<COHERENT>(xp[n] + 64 * d + 32);
        }
    unsigned int rslot = 0;
#pragma unroll 1
    for (int j = 0; j < nsup; ++j) {
        cp_async_wait<RS - 2>();   // stage j has landed (this lane's copies)
        __syncwarp();                // ... and every lane's; every lane is done with stage j - 1
        issue();                     // stage j + FR_S - 1 into the slot of stage j - 1
        const unsigned char* st = ring + rslot;
        const int adv = j + 1 < nsup ? 256 : 0;   // the last stage re-reads its own first steps (unused)
        const __nv_bfloat16* xn[NT];
#pragma unroll
        for (int n = 0; n < NT; ++n) xn[n] = xp[n] + adv;
#pragma unroll
        for (int q = 0; q < FR_SUB; ++q) {
            const uint4 w = *reinterpret_cast<const uint4*>(st + q * (FR_U4 * 16) + lane * 16);
            const uint2 sc = *reinterpret_cast<const uint2*>(st + q * (FR_U4 * 16) + 512 + g * 8);
            uint4 xc[NT][2];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                xc[n][0] = xb[q % XD][n][0];
                xc[n][1] = xb[q % XD][n][1];
                if (!XEND) {
                    const __nv_bfloat16* p = q + XD < FR_SUB ? xp[n] + 64 * (q + XD) : xn[n] + 64 * (q + XD - FR_SUB);
                    xb[q % XD][n][0] = ld_x16<COHERENT>(p);
                    xb[q % XD][n][1] = ld_x16<COHERENT>(p + 32);
                }
            }
            frag_step<NT>(acc, w, sc, xc);
        }
        if (XEND) {
#pragma unroll
            for (int d = 0; d < XD; ++d)
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    xb[d][n][0] = ld_x16<COHERENT>(xn[n] + 64 * d);
                    xb[d][n][1] = ld_x16<COHERENT>(xn[n] + 64 * d + 32);
                }
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) xp[n] = xn[n];
        rslot = ring_next<RS>(rslot);
    }
    cp_async_wait<0>();
    __syncwarp();   // the ring is free for the next task
}

struct SmallItems {
    const int* e;       // expert of each pair (-1: invalid id), [P]
    const int* sorted;  // pair id of each slot
    const int* ie;      // item expert
    const int* islot;   // item first slot
    const int* icnt;    // item slot count (<= FR_CHUNK)
};


// Gate/up's outputs of one lane's mma fragment: h[slot0 + col, 8 tile + g] = bf16(SiLU(gate) x up) for columns
// col = col0 + 2t and col0 + 2t + 1 of the item starting at slot0, those below cnt (gate: rows g of the fragment, c0 / c1;
// up: rows g + 8, c2 / c3). hbuf: bf16 [P, I].
__device__ __forceinline__ void store_h(__nv_bfloat16* __restrict__ hbuf, int slot0, int cnt, int col0, int I, int tile,
                                        const float (&c)[4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
        const int col = col0 + 2 * t + cc;
        if (col < cnt) {
            const float gt = c[cc], up = c[2 + cc];
            hbuf[(long long)(slot0 + col) * I + 8 * tile + g] = __float2bfloat16(gt / (1.f + __expf(-gt)) * up);
        }
    }
}

// PUBLISH = false (the phased form, the only caller): no fence or done_gu count after h is stored (the launch
// boundary orders it).
template <int NT, bool PUBLISH = true, int RS = FR_S, int XDP = 0, bool XEND = false>
__device__ __forceinline__ void small_gate_up(const SmallItems& it, int item, int tile, const uint4* __restrict__ Fgu,
                                              const __nv_bfloat16* __restrict__ X, int topk, int H, int I,
                                              __nv_bfloat16* __restrict__ hbuf, int* done_gu,
                                              unsigned char* ring) {
    const int lane = threadIdx.x & 31, g = lane >> 2;
    const int ex = it.ie[item], slot0 = it.islot[item], cnt = it.icnt[item];
    const int tiles = I / 8, nsup = H / (64 * FR_SUB);
    const uint4* wt = Fgu + ((long long)ex * nsup * tiles + tile) * FR_STAGE_U4;   // [E, H/256, tiles, 4, 144]
    const __nv_bfloat16* xr[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const int col = g + 8 * n;
        xr[n] = X + (long long)(it.sorted[slot0 + (col < cnt ? col : 0)] / topk) * H;
    }
    float acc[NT][4];
    frag_gemm<NT, false, RS, XDP, XEND>(acc, wt, nsup, (long long)tiles * FR_STAGE_U4, xr, nullptr, 0, ring);
#pragma unroll
    for (int n = 0; n < NT; ++n) store_h(hbuf, slot0, cnt, 8 * n, I, tile, acc[n]);
    if (!PUBLISH) return;
    fence_acq_rel_gpu();
    __syncwarp();
    if (lane == 0) {
        fence_acq_rel_gpu();
        atomicAdd(done_gu + item, 1);
    }
}


// Prologue of the small-M kernels (every CTA, block of 128 threads, P = M * topk <= 128): sorts the
// pairs by (expert, pair id) into s_sorted and cuts each expert's run into items of <= FR_CHUNK slots
// (s_ie / s_islot / s_icnt); returns the number of items. Pairs with an id outside [0, E) are dropped
// (s_e = -1); when every id is invalid, CTA 0 writes NaN to every output row.
__device__ __forceinline__ int small_prologue(const int* __restrict__ ids, int M, int topk, int E, int H,
                                              __nv_bfloat16* __restrict__ out, int* s_e, int* s_sorted, int* s_flag,
                                              int* s_ie, int* s_islot, int* s_icnt, int* s_wcnt) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int P = M * topk;
    int e = -1;
    if (tid < P) {
        e = ids[tid];
        if (e < 0 || e >= E) e = -1;
    }
    s_e[tid] = e;
    s_flag[tid] = 0;
    __syncthreads();
    int pos = 0, rank = 0;
    if (e >= 0) {
        for (int q = 0; q < P; ++q) {
            const int eq = s_e[q];
            pos += (eq >= 0) && (eq < e || (eq == e && q < tid));
            rank += (eq == e) && (q < tid);
        }
    }
    const int nvalid = __syncthreads_count(e >= 0);
    if (e >= 0) {
        s_sorted[pos] = tid;
        s_flag[pos] = (rank % FR_CHUNK) == 0;
    }
    __syncthreads();
    const int f = s_flag[tid];   // tid is a slot here
    const unsigned int bal = __ballot_sync(0xffffffffu, f);
    if (lane == 0) s_wcnt[warp] = __popc(bal);
    __syncthreads();
    int base = 0;
    for (int w = 0; w < warp; ++w) base += s_wcnt[w];
    const int nitems = s_wcnt[0] + s_wcnt[1] + s_wcnt[2] + s_wcnt[3];
    if (f) {
        const int idx = base + __popc(bal & ((1u << lane) - 1u));
        const int ex = s_e[s_sorted[tid]];
        int c = 1;
        while (c < FR_CHUNK && tid + c < nvalid && s_e[s_sorted[tid + c]] == ex) ++c;
        s_ie[idx] = ex;
        s_islot[idx] = tid;
        s_icnt[idx] = c;
    }
    __syncthreads();
    if (nitems == 0) {   // every id invalid: every token's row is NaN
        if (blockIdx.x == 0)
            for (int i = tid; i < M * H; i += blockDim.x) out[i] = __float2bfloat16(__int_as_float(0x7fc00000));
    }
    return nitems;
}

// The item table of a small-M kernel (every CTA, block of 128 threads): its shared arrays (one set per CTA) filled by
// small_prologue; returns the table's view and sets `nitems`.
__device__ __forceinline__ SmallItems small_items(const int* __restrict__ ids, int M, int topk, int E, int H,
                                                  __nv_bfloat16* __restrict__ out, int& nitems) {
    __shared__ int s_e[FR_MAX_PAIRS], s_sorted[FR_MAX_PAIRS], s_flag[FR_MAX_PAIRS];
    __shared__ int s_ie[FR_MAX_PAIRS], s_islot[FR_MAX_PAIRS], s_icnt[FR_MAX_PAIRS];
    __shared__ int s_wcnt[4];
    nitems = small_prologue(ids, M, topk, E, H, out, s_e, s_sorted, s_flag, s_ie, s_islot, s_icnt, s_wcnt);
    return SmallItems{s_e, s_sorted, s_ie, s_islot, s_icnt};
}

// ---------------------------------------------------------------------------------------------------
// The two launches. Only synchronisation: the launch boundary and one block barrier per down tile.
//   moe_small_phased_gu_*: every CTA runs small_prologue; warp gw of nw takes the (item, tile) tasks gw,
//     gw + nw, ... (item-major, so warps running together read neighbouring tiles of one stage), each a whole
//     tile's K through its RS-stage ring (frag_gemm, activations a whole stage ahead), and stores
//     h = SiLU(gate) * up (bf16 [P, I]). No counter, fence or atomic.
//   moe_small_phased_dn_*: CTA b takes tiles b, b + gridDim.x, ... of 16 rows of H; its warp w the items
//     w, w + 4, ..., a whole item's K (I) each; w_pair * y goes to shared memory s_y[pair][16]; after a block
//     barrier, out[m, tile rows] = the sum over k ascending, in one fp32 chain from 0, NaN for a token with an
//     invalid id.
// grid (host, workbench/moe/fused.py): gate/up min(resident CTAs, ceil(items bound x I/8 / 4)), down min(resident
// CTAs, H/16); any grid is correct (both loops stride). No workspace; nothing is left for the next call.
template <int RS, bool PDL = false>
__device__ __forceinline__ void phased_gate_up(const uint4* __restrict__ Fgu, const __nv_bfloat16* __restrict__ X,
                                               const int* __restrict__ ids, int M, int topk, int E, int H, int I,
                                               __nv_bfloat16* __restrict__ hbuf, __nv_bfloat16* __restrict__ out,
                                               unsigned char* s_ring) {
    const int warp = threadIdx.x >> 5;
    if (PDL) asm volatile("griddepcontrol.launch_dependents;");   // the down launch may start its CTAs now
    int nitems;
    const SmallItems it = small_items(ids, M, topk, E, H, out, nitems);
    unsigned char* ring = s_ring + warp * (RS * FR_STAGE_U4 * 16);
    const int tiles = I / 8, tasks = nitems * tiles, nw = gridDim.x * MOE_WARPS;
    for (int task = blockIdx.x * MOE_WARPS + warp; task < tasks; task += nw) {
        const int item = task / tiles, tile = task - item * tiles;
        small_gate_up<1, false, RS, FR_SUB, true>(it, item, tile, Fgu, X, topk, H, I, hbuf, nullptr, ring);
    }
}

// K-split gate/up (dispatched kernel "phased_r3_pdl_k4"): a CTA per (item, tile) task, its
// four warps each a quarter of K (warp w: stages [w nsup / 4, (w + 1) nsup / 4), 7 of Kimi's 28), then the four
// partial sums added in shared memory in a fixed order (warp 0 + 1 + 2 + 3) and h = SiLU(gate) * up stored by warp 0.
// Why: at M = 2 the whole-K form has 4096 tasks on 2640 warps, a second round half full (Nsight: the gate/up SMs
// idle a quarter of the kernel's cycles); tasks a quarter as long leave a shorter partial round. Not bit-identical to
// the whole-K form (whose sum over K runs in one chain); deterministic. grid: min(resident CTAs, tasks bound), striding.
template <int RS, bool PDL = false>
__device__ __forceinline__ void phased_gate_up_k4(const uint4* __restrict__ Fgu, const __nv_bfloat16* __restrict__ X,
                                                  const int* __restrict__ ids, int M, int topk, int E, int H, int I,
                                                  __nv_bfloat16* __restrict__ hbuf, __nv_bfloat16* __restrict__ out,
                                                  unsigned char* s_ring) {
    __shared__ float4 s_part[MOE_WARPS - 1][32];   // warps 1-3's partial sums of the task, per lane
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
    if (PDL) asm volatile("griddepcontrol.launch_dependents;");   // the down launch may start its CTAs now
    int nitems;
    const SmallItems it = small_items(ids, M, topk, E, H, out, nitems);
    unsigned char* ring = s_ring + warp * (RS * FR_STAGE_U4 * 16);
    const int tiles = I / 8, tasks = nitems * tiles, nsup = H / (64 * FR_SUB);
    const int q0 = warp * nsup / MOE_WARPS, q1 = (warp + 1) * nsup / MOE_WARPS;
    for (int task = blockIdx.x; task < tasks; task += gridDim.x) {
        const int item = task / tiles, tile = task - item * tiles;
        const int ex = it.ie[item], slot0 = it.islot[item], cnt = it.icnt[item];
        const uint4* wt = Fgu + ((long long)(ex * nsup + q0) * tiles + tile) * FR_STAGE_U4;   // [E, H/256, tiles, ...]
        const __nv_bfloat16* const xr[1] = {X + (long long)(it.sorted[slot0 + (g < cnt ? g : 0)] / topk) * H +
                                            q0 * (64 * FR_SUB)};
        float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
        if (q1 > q0)
            frag_gemm<1, false, RS, FR_SUB, true>(acc, wt, q1 - q0, (long long)tiles * FR_STAGE_U4, xr, nullptr, 0,
                                                  ring);
        if (warp > 0) s_part[warp - 1][lane] = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
        __syncthreads();
        if (warp == 0) {
#pragma unroll
            for (int w = 0; w < MOE_WARPS - 1; ++w) {   // fixed order: warp 0's part, then 1, 2, 3
                const float4 v = s_part[w][lane];
                acc[0][0] += v.x;
                acc[0][1] += v.y;
                acc[0][2] += v.z;
                acc[0][3] += v.w;
            }
            store_h(hbuf, slot0, cnt, 0, I, tile, acc[0]);
        }
        __syncthreads();   // s_part is rewritten by the next task
    }
}

template <int RS, bool PDL = false>
__device__ __forceinline__ void phased_down(const uint4* __restrict__ Fdn, const __nv_bfloat16* __restrict__ hbuf,
                                            const int* __restrict__ ids, const float* __restrict__ topk_w, int M,
                                            int topk, int E, int H, int I, __nv_bfloat16* __restrict__ out,
                                            unsigned char* s_ring) {
    __shared__ float s_y[FR_MAX_PAIRS * 16];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    int nitems;
    const SmallItems it = small_items(ids, M, topk, E, H, out, nitems);
    unsigned char* ring = s_ring + warp * (RS * FR_STAGE_U4 * 16);
    const int tiles = H / 16, nsup = I / (64 * FR_SUB);
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        for (int item = warp; item < nitems; item += MOE_WARPS) {
            const int ex = it.ie[item], slot0 = it.islot[item], cnt = it.icnt[item];
            const uint4* wt = Fdn + ((long long)ex * nsup * tiles + tile) * FR_STAGE_U4;   // [E, I/256, tiles, 4, 144]
            const __nv_bfloat16* const xr[1] = {hbuf + (long long)(slot0 + (g < cnt ? g : 0)) * I};
            float acc[1][4];
            frag_gemm<1, false, RS, FR_SUB, true, PDL>(acc, wt, nsup, (long long)tiles * FR_STAGE_U4, xr, nullptr, 0,
                                                       ring);
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {   // lane (g, t): rows g and g + 8 of the tile, columns 2t and 2t + 1
                const int col = 2 * t + cc;
                if (col < cnt) {
                    const int pair = it.sorted[slot0 + col];
                    const float wgt = __ldg(topk_w + pair);
                    s_y[pair * 16 + g] = wgt * acc[0][cc];
                    s_y[pair * 16 + g + 8] = wgt * acc[0][2 + cc];
                }
            }
        }
        __syncthreads();
        for (int idx = tid; idx < M * 16; idx += blockDim.x) {
            const int m = idx >> 4, r = idx & 15;
            const float sum = token_sum_over_k(it.e, m, topk, [&](float& s, int pair) { s += s_y[pair * 16 + r]; });
            out[(long long)m * H + 16 * tile + r] = __float2bfloat16(sum);
        }
        __syncthreads();   // s_y is rewritten for the next tile
    }
}

// GU / DN: the two kernels' names; GUBODY: the gate/up form (phased_gate_up, or phased_gate_up_k4, the K-split);
// RS / DNRS: GU's / DN's ring stages; PDL:
// programmatic dependent launch
// (the host launches DN with programmatic stream serialisation: GU lets it start at once, and DN's warps issue their
// first weight stages before griddepcontrol.wait, which returns when GU has completed and its h is visible; launched
// without the attribute, both instructions do nothing).
#define MOE_PHASED_KERNELS(GU, DN, GUBODY, RS, DNRS, PDL)                                                          \
    extern "C" __global__ void __launch_bounds__(128, 5) GU(                                                       \
        const uint4* __restrict__ Fgu, const __nv_bfloat16* __restrict__ X, const int* __restrict__ ids, int M,   \
        int topk, int E, int H, int I, __nv_bfloat16* __restrict__ hbuf, __nv_bfloat16* __restrict__ out) {        \
        __shared__ __align__(16) unsigned char s_ring[MOE_WARPS * RS * FR_STAGE_U4 * 16];                         \
        GUBODY<RS, PDL>(Fgu, X, ids, M, topk, E, H, I, hbuf, out, s_ring);                                         \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128, 4) DN(                                                       \
        const uint4* __restrict__ Fdn, const __nv_bfloat16* __restrict__ hbuf, const int* __restrict__ ids,        \
        const float* __restrict__ topk_w, int M, int topk, int E, int H, int I, __nv_bfloat16* __restrict__ out) { \
        __shared__ __align__(16) unsigned char s_ring[MOE_WARPS * DNRS * FR_STAGE_U4 * 16];                       \
        phased_down<DNRS, PDL>(Fdn, hbuf, ids, topk_w, M, topk, E, H, I, out, s_ring);                            \
    }
// The dispatched pairs (workbench/moe/fused.py: KERNELS): "phased_r3_pdl_k4" (K-split gate/up, 3-stage rings),
// "phased_r2_pdl" (2-stage rings in both launches), "phased_r3_pdl_gu2" (2-stage gate/up ring, 3-stage down ring).
MOE_PHASED_KERNELS(moe_small_phased_gu_r3p_k4, moe_small_phased_dn_r3p_k4, phased_gate_up_k4, 3, 3, true)
MOE_PHASED_KERNELS(moe_small_phased_gu_r2p, moe_small_phased_dn_r2p, phased_gate_up, 2, 2, true)
MOE_PHASED_KERNELS(moe_small_phased_gu_r3p_gu2, moe_small_phased_dn_r3p_gu2, phased_gate_up, 2, 3, true)


// ---------------------------------------------------------------------------------------------------
// Four-launch gate/up and down on the fragment layout (experts stored once, in the small-M kernels' layout):
// moe_align's items (expert, first slot, count <= 8 NT) and moe_combine as for the compressed-tensors variants;
// gate/up writes h by slot (bf16 [P, I]), down writes Y by pair (f32 [P, H], times the pair's weight).
// grid: (tiles / MOE_WARPS, max items): warp w of CTA x takes tile MOE_WARPS x + w of item blockIdx.y, its whole K
// through its ring (frag_gemm; gate/up tiles are 8 gate + the same 8 up rows, down tiles 16 rows of H). The sums
// run as the small-M kernels' do (whole K in one chain, the pairs of a token added k ascending by moe_combine),
// so for the same items the output equals the small-M pair "phased_r2_pdl" bit for bit.
// NT = 1: activations a whole ring stage ahead (XEND); NT > 1: one 64-K step ahead (registers).
template <int NT, bool GATE_UP>
__device__ __forceinline__ void frag_items_gemm(const uint4* __restrict__ F, const __nv_bfloat16* __restrict__ X,
                                                const int* __restrict__ sorted_pair, const int* __restrict__ items,
                                                const int* __restrict__ num_items, const float* __restrict__ topk_w,
                                                int topk, int H, int I, __nv_bfloat16* __restrict__ h_out,
                                                float* __restrict__ y_out, unsigned char* s_ring) {
    const int item = blockIdx.y;
    if (item >= num_items[0]) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tiles = GATE_UP ? I / 8 : H / 16, K = GATE_UP ? H : I, nsup = K / (64 * FR_SUB);
    const int tile = blockIdx.x * MOE_WARPS + warp;
    if (tile >= tiles) return;   // frag_gemm synchronises only its own warp
    const int ex = items[3 * item], slot0 = items[3 * item + 1], cnt = items[3 * item + 2];
    const uint4* wt = F + ((long long)ex * nsup * tiles + tile) * FR_STAGE_U4;   // [E, K/256, tiles, 4, 144]
    const __nv_bfloat16* xr[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const int col = g + 8 * n, slot = slot0 + (col < cnt ? col : 0);
        xr[n] = GATE_UP ? X + (long long)(sorted_pair[slot] / topk) * H : X + (long long)slot * I;
    }
    float acc[NT][4];
    constexpr int XD = NT == 1 ? FR_SUB : 1;
    frag_gemm<NT, false, FR_S, XD, NT == 1>(acc, wt, nsup, (long long)tiles * FR_STAGE_U4, xr, nullptr, 0,
                                           s_ring + warp * (FR_S * FR_STAGE_U4 * 16));
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        if (GATE_UP) {
            store_h(h_out, slot0, cnt, 8 * n, I, tile, acc[n]);
        } else {
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {   // lane (g, t): rows g and g + 8 of the tile, columns 2t and 2t + 1
                const int col = 8 * n + 2 * t + cc;
                if (col < cnt) {
                    const int pair = sorted_pair[slot0 + col];
                    const float wgt = topk_w[pair];
                    y_out[(long long)pair * H + 16 * tile + g] = wgt * acc[n][cc];
                    y_out[(long long)pair * H + 16 * tile + g + 8] = wgt * acc[n][2 + cc];
                }
            }
        }
    }
}

#define MOE_FRAG_INSTANCE(NT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(128) moe_gate_up_frag_nt##NT(                                    \
        const uint4* __restrict__ F, const __nv_bfloat16* __restrict__ X, const int* __restrict__ sorted_pair,    \
        const int* __restrict__ items, const int* __restrict__ num_items, int topk, int H, int I,                 \
        __nv_bfloat16* __restrict__ h_out) {                                                                      \
        __shared__ __align__(16) unsigned char s_ring[MOE_WARPS * FR_S * FR_STAGE_U4 * 16];                       \
        frag_items_gemm<NT, true>(F, X, sorted_pair, items, num_items, nullptr, topk, H, I, h_out, nullptr,       \
                                  s_ring);                                                                        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(128) moe_down_frag_nt##NT(                                       \
        const uint4* __restrict__ F, const __nv_bfloat16* __restrict__ h, const int* __restrict__ sorted_pair,    \
        const int* __restrict__ items, const int* __restrict__ num_items, const float* __restrict__ topk_w,       \
        int topk, int H, int I, float* __restrict__ y_out) {                                                      \
        __shared__ __align__(16) unsigned char s_ring[MOE_WARPS * FR_S * FR_STAGE_U4 * 16];                       \
        frag_items_gemm<NT, false>(F, h, sorted_pair, items, num_items, topk_w, topk, H, I, nullptr, y_out,       \
                                   s_ring);                                                                       \
    }
// NT = 1 up to M = 1023, NT = 4 beyond (data/dispatch/h200.json; data/measurements/h200/moe_layout_ab.json). NT = 2 was
// never the fastest at M 17-1024 with 64 or 384 experts (in git at 057e4a8).
MOE_FRAG_INSTANCE(1)
MOE_FRAG_INSTANCE(4)
