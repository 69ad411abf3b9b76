// Fused W4A16 MoE for decode shapes (Kimi K2.x / DeepSeek-V3 routed experts).
//
// Weights stay in the compressed-tensors pack-quantized layout (workbench/int4.py):
// int32 words [rows, K/8], eight 4-bit values q+8 per word along K (value j in
// bits 4j..4j+3), bf16 scales [rows, K/32] (symmetric, group 32). The only
// re-packing (workbench/moe/packing.py) stacks experts and concatenates
// gate_proj and up_proj rows: gate_up [E, 2I, H/8], down [E, H, I/8].
//
// Pipeline (four launches, no host synchronisation):
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
// D steps ahead in registers.
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
// S > 0:  weights and scales stream through a per-warp ring of S shared-memory
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
#pragma unroll
    for (int d = 0; d < D; ++d) {
        if (d < steps) {
            const int G = 4 * (step0 + d) + t;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                buf[d][r].wa = ld_stream16(Wb + (long long)rowA[r] * kgroups + G);
                buf[d][r].wb = ld_stream16(Wb + (long long)rowB[r] * kgroups + G);
                buf[d][r].sa = ld_u16(Sb + (long long)rowA[r] * kgroups + G);
                buf[d][r].sb = ld_u16(Sb + (long long)rowB[r] * kgroups + G);
            }
        }
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
                if (j + D < steps) {
                    const int G2 = G + 4 * D;
#pragma unroll
                    for (int r = 0; r < RT; ++r) {
                        buf[d][r].wa = ld_stream16(Wb + (long long)rowA[r] * kgroups + G2);
                        buf[d][r].wb = ld_stream16(Wb + (long long)rowB[r] * kgroups + G2);
                        buf[d][r].sa = ld_u16(Sb + (long long)rowA[r] * kgroups + G2);
                        buf[d][r].sb = ld_u16(Sb + (long long)rowB[r] * kgroups + G2);
                    }
                }
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
    unsigned char* ring = smem + warp * (S * STAGE_BYTES);
    auto issue = [&](int j, int slot) {
        const int G = 4 * (step0 + j) + t;
        unsigned char* st = ring + slot * STAGE_BYTES;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            cp_async16(st + (2 * r) * 512 + lane * 16, Wb + (long long)rowA[r] * kgroups + G);
            cp_async16(st + (2 * r + 1) * 512 + lane * 16, Wb + (long long)rowB[r] * kgroups + G);
            cp_async4(st + RT * 1024 + (2 * r) * 128 + lane * 4, Sb + (long long)rowA[r] * kgroups + (G & ~1));
            cp_async4(st + RT * 1024 + (2 * r + 1) * 128 + lane * 4, Sb + (long long)rowB[r] * kgroups + (G & ~1));
        }
    };
#pragma unroll
    for (int st = 0; st < S - 1; ++st) {
        if (st < steps) issue(st, st);
        cp_async_commit();
    }
    uint4 xq[NT][4];
    load_x<NT>(xq, xrow, 4 * step0 + t);
    const unsigned int sel = (t & 1) ? 0x3232u : 0x1010u;   // scale of group G within the aligned pair
#pragma unroll 1
    for (int j = 0; j < steps; ++j) {
        if (j + S - 1 < steps) issue(j + S - 1, (j + S - 1) % S);
        cp_async_commit();
        uint4 xn[NT][4];
        if (j + 1 < steps) load_x<NT>(xn, xrow, 4 * (step0 + j + 1) + t);
        cp_async_wait<S - 1>();
        const unsigned char* st = ring + (j % S) * STAGE_BYTES;
        uint4 wa4[RT], wb4[RT];
        unsigned int sa2[RT], sb2[RT];
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            wa4[r] = *reinterpret_cast<const uint4*>(st + (2 * r) * 512 + lane * 16);
            wb4[r] = *reinterpret_cast<const uint4*>(st + (2 * r + 1) * 512 + lane * 16);
            sa2[r] = __byte_perm(*reinterpret_cast<const unsigned int*>(st + RT * 1024 + (2 * r) * 128 + lane * 4), 0u, sel);
            sb2[r] = __byte_perm(*reinterpret_cast<const unsigned int*>(st + RT * 1024 + (2 * r + 1) * 128 + lane * 4), 0u, sel);
        }
        compute_step<NT, RT>(acc, wa4, wb4, sa2, sb2, xq);
        if (j + 1 < steps) {
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int q = 0; q < 4; ++q) xq[n][q] = xn[n][q];
        }
    }
    cp_async_wait<0>();
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
// s<S>: S-stage cp.async ring in fragment order, l<S>: S-stage ring of whole-line fetches).
// workbench/moe/fused.py's VARIANTS lists them.
MOE_INSTANCE(1, 1, 4, 0, false, d4)
MOE_INSTANCE(1, 2, 2, 0, false, d2)
MOE_INSTANCE(2, 2, 2, 0, false, d2)
MOE_INSTANCE(4, 2, 2, 0, false, d2)
MOE_INSTANCE(1, 2, 0, 4, false, s4)
MOE_INSTANCE(2, 2, 0, 4, false, s4)
MOE_INSTANCE(1, 1, 0, 4, true, l4)
MOE_INSTANCE(1, 1, 0, 5, true, l5)
MOE_INSTANCE(1, 2, 0, 2, true, l2)
MOE_INSTANCE(2, 1, 0, 4, true, l4)
MOE_INSTANCE(2, 2, 0, 2, true, l2)

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
// Small-M path (P = M * topk <= 128 pairs): ONE persistent launch, moe_small_fused.
//
// Weights in the fragment layout (workbench/moe/packing.py: fragment_pack, made once per set of
// experts and cached by Int4Experts.fragments, stage-major): int32 [E, K/256, R/16, 4, 144]; for each
// 64-wide K step and tile of 16 rows a 576-byte block: 128 words of nibbles (lane-major: word 4*lane + kc
// is the whole A fragment of mma chunk kc for that lane) then 16 words of bf16 scale pairs (word
// 2*g + gr: row g (low), row g+8 (high) of quantisation group gr). The four blocks of one tile and
// 256-wide K stage are one contiguous 2304-byte stretch: a warp copies one stretch (4096 weights) per
// loop iteration (one cp.async wait, one warp barrier), and the stretches of neighbouring tiles (tasks
// taken at the same time by other warps) are adjacent, so the warps of an expert sweep its weights
// together, as a copy does. (Version 2 of this kernel moved one 576-byte block per iteration, and its
// per-iteration costs made it issue-bound: NOTES.md.)
// Chunk kc = 2*gr + h of lane (g, t) covers physical K = 64*s + 32*gr + 8*t + 4*h + {0,1,2,3}:
// mma k slots (2t, 2t+1, 2t+8, 2t+9) -> those four, for A and B alike, so the 16 slots of a chunk
// stay inside quantisation group gr and the group scale is applied once per group to fp32
// partial sums. Nibble j of the word: A register j&3 (row g / g+8 alternating, k pair kb/kb+2),
// low half from nibble j, high half from nibble j+4: register r = (w >> 4r) & 0x000F000F | 0x43004300
// = bf16 pair (128 + u): one shift and one LOP3 per two weights (the LOP3 written in PTX: from C, ptxas
// emits an AND and an OR), then one exact bf16x2 subtraction of 136 (u = q + 8). (The first version
// subtracted on the tensor core, a second mma with A = -136; at the 80-register limit here that costs
// as many instructions as the subtractions, because ptxas rematerialises the constant A registers.)
//
// Work: prologue (every CTA, in shared memory): pairs sorted by (expert, pair id), cut into items
// of <= 8 slots of one expert (one mma token tile; columns past an item's count read its first row and
// are not stored). Tasks, grabbed by warps from a global counter in order:
//   gate_up (item, tile of 8 gate + 8 up rows): h[slot, f] = SiLU(gate) * up, bf16 [P, I];
//            then done_gu[item] += 1 (release).
//   down    (item, tile of 16 rows of H): first fills its weight prefetch ring, then waits until
//            done_gu[item] == I/8 (acquire), reads h (L2, .cg); writes Y[pair, n] = w_pair * y (f32);
//            done_dn[tile] += 1; the warp that completes a tile sums Y over k in fixed order for every
//            token into out (bf16) and resets done_dn[tile].
// Every gate_up task is grabbed before any down task and never waits, so a waiting down task
// always waits on running work: no deadlock whatever the residency. The last warp to finish
// resets the task counters (ws[0], ws[1], done_gu), so CUDA-graph replays start from zero.
// ws: int32 [2 + 128 + H/16], zero before the first launch.
#define FR_WORDS 144
#define FR_U4 36          // uint4 per (tile, 64-wide step)
#define FR_SUB 4          // 64-wide steps per ring stage: 16 rows x 256 K = 4096 weights per warp iteration
#define FR_STAGE_U4 144   // uint4 per stage (FR_SUB * FR_U4): 2304 bytes
#define FR_S 3            // shared-memory stages per warp (FR_S - 1 stages = 4.6 KB in flight)
#define FR_CHUNK 8        // slots per item (one token tile: 16 would need a second one, which spills at 80 registers)
#define FR_MAX_PAIRS 128

__device__ __forceinline__ uint2 ld_stream8(const uint2* p) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

__device__ __forceinline__ uint4 ld_cg16(const void* p) {
    uint4 r;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

__device__ __forceinline__ float ld_cg_f32(const float* p) {
    float r;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(r) : "l"(p));
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

// out[m, row0 .. row0 + rows) = bf16(sum over k ascending of Y[m * topk + k, n]) for every token m, by one warp, in one
// fp32 chain (fixed order); NaN for a token with an invalid id (s_e[pair] < 0). Y [P, H] f32 is written by other warps
// of this launch: read through L2. (The split-K kernels' form also sums over the parts: splitk_down.)
__device__ __forceinline__ void sum_rows_over_k(const int* s_e, const float* Y, __nv_bfloat16* __restrict__ out, int M,
                                                int topk, int H, int row0, int rows) {
    const int lane = threadIdx.x & 31;
    for (int idx = lane; idx < M * rows; idx += 32) {
        const int m = idx / rows, n = row0 + (idx - m * rows);
        const float sum = token_sum_over_k(s_e, m, topk, [&](float& s, int pair) {
            s += ld_cg_f32(Y + (long long)pair * H + n);
        });
        out[(long long)m * H + n] = __float2bfloat16(sum);
    }
}


__device__ __forceinline__ int ld_relaxed_gpu(const int* p) {
    int r;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(r) : "l"(p) : "memory");
    return r;
}

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
    int r;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(r) : "l"(p) : "memory");
    return r;
}

// Release / acquire at GPU scope (lighter than __threadfence, which is sequentially consistent).
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// 16 activations (bf16) of this lane's column: global, through L1 (gate_up: X is read-only) or L2 (down: h is
// written by other warps of this launch, so not through the incoherent L1).
template <bool COHERENT>
__device__ __forceinline__ uint4 ld_x16(const __nv_bfloat16* p) {
#ifdef MOE_DIAG_NOACT   // diagnostic build (workbench/moe/diag.py): no activation load, a value made from the address
    const unsigned long long a = reinterpret_cast<unsigned long long>(p);
    return make_uint4((unsigned int)a, (unsigned int)(a >> 32), 0u, 0u);
#else
    return COHERENT ? ld_cg16(p) : __ldg(reinterpret_cast<const uint4*>(p));
#endif
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

// One issue step of a per-warp ring (the issuers of the CTA-split and warp-split kernels): while the unit being
// issued has stages left, copy its next one from `src` into slot `wslot` of the ring at `dst0` (this lane's address)
// and step `src` by `stride`; commit a cp.async group either way (empty at the end, so the wait counts stay fixed)
// and move to the next slot.
template <int RS>
__device__ __forceinline__ void ring_issue_stage(unsigned int dst0, unsigned int& wslot, const uint4*& src, int stride,
                                                 int& left, bool scale_lane) {
    if (left > 0) {
        cp_async_stage(dst0 + wslot, src, scale_lane);
        src += stride;
        --left;
    }
    cp_async_commit();
    wslot = ring_next<RS>(wslot);
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
#ifdef MOE_DIAG_NODEQ_FRAG   // diagnostic build (diag.py FRAG_BUILDS): the mma on the raw words, no dequantisation
            const unsigned int a0 = word, a1 = word ^ 0x1u, a2 = word ^ 0x2u, a3 = word ^ 0x3u;
#else
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
#endif
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const unsigned int b0 = h == 0 ? xq[n][gr].x : xq[n][gr].z;
                const unsigned int b1 = h == 0 ? xq[n][gr].y : xq[n][gr].w;
#ifdef MOE_DIAG_NOMMA_FRAG   // diagnostic build (diag.py FRAG_BUILDS): the dequantisation kept, the mma one add
                tmp[n][0] += __uint_as_float((a0 ^ a1 ^ a2 ^ a3 ^ b0 ^ b1) & 0x007fffffu);
#else
                mma_bf16(tmp[n], a0, a1, a2, a3, b0, b1);
#endif
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
    // activation prefetch distance in 64-K steps (registers: NT = 2 has 1); XDP > 0 overrides (splitk_s4x*)
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
#ifdef MOE_DIAG_NOMATH_FRAG   // diagnostic build (workbench/moe/diag.py FRAG_BUILDS): loads kept, math one add
#pragma unroll
            for (int n = 0; n < NT; ++n)
                acc[n][0] += __uint_as_float((w.x ^ w.y ^ w.z ^ w.w ^ sc.x ^ sc.y ^ xc[n][0].x ^ xc[n][1].w) & 0x007fffffu);
#else
            frag_step<NT>(acc, w, sc, xc);
#endif
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

// Down's outputs of one lane's mma fragment (rows n0 and n0 + 8 of H; columns col0 + 2t and col0 + 2t + 1 of the item
// starting at slot0, those below cnt): Y[pair, n] = routing weight of the pair x y. Y: f32 [P, H].
__device__ __forceinline__ void store_weighted_y(const SmallItems& it, int slot0, int cnt, int col0,
                                                 const float* __restrict__ topk_w, float* Y, int H, int n0, float lo0,
                                                 float lo1, float hi0, float hi1) {
    const int t = threadIdx.x & 3;
    const float lo[2] = {lo0, lo1}, hi[2] = {hi0, hi1};
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
        const int col = col0 + 2 * t + cc;
        if (col < cnt) {
            const int pair = it.sorted[slot0 + col];
            const float wgt = __ldg(topk_w + pair);
            Y[(long long)pair * H + n0] = wgt * lo[cc];
            Y[(long long)pair * H + n0 + 8] = wgt * hi[cc];
        }
    }
}

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

// PUBLISH = false (the phased form): no fence or done_gu count after h is stored (the launch boundary orders it).
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

template <int NT>
__device__ __forceinline__ void small_down(const SmallItems& it, int item, int tile, int nitems,
                                           const uint4* __restrict__ Fdn, const __nv_bfloat16* hbuf,
                                           const float* __restrict__ topk_w, int M, int topk, int H, int I,
                                           float* Y, const int* done_gu, int* done_dn, __nv_bfloat16* __restrict__ out,
                                           unsigned char* ring) {
    const int lane = threadIdx.x & 31, g = lane >> 2;
    const int ex = it.ie[item], slot0 = it.islot[item], cnt = it.icnt[item];
    const int tiles = H / 16, nsup = I / (64 * FR_SUB);
    const uint4* wt = Fdn + ((long long)ex * nsup * tiles + tile) * FR_STAGE_U4;   // [E, I/256, tiles, 4, 144]
    const __nv_bfloat16* xr[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const int col = g + 8 * n;
        xr[n] = hbuf + (long long)(slot0 + (col < cnt ? col : 0)) * I;
    }
    float acc[NT][4];
    frag_gemm<NT, true>(acc, wt, nsup, (long long)tiles * FR_STAGE_U4, xr, done_gu + item, I / 8, ring);
    const int n0 = 16 * tile + g;
#pragma unroll
    for (int n = 0; n < NT; ++n)
        store_weighted_y(it, slot0, cnt, 8 * n, topk_w, Y, H, n0, acc[n][0], acc[n][1], acc[n][2], acc[n][3]);
    fence_acq_rel_gpu();
    __syncwarp();
    int last = 0;
    if (lane == 0) {
        fence_acq_rel_gpu();
        last = atomicAdd(done_dn + tile, 1) == nitems - 1;
        if (last) fence_acq_rel_gpu();
    }
    last = __shfl_sync(0xffffffffu, last, 0);
    if (!last) return;
    fence_acq_rel_gpu();
    // every item has written its rows of this tile: out[m, tile rows] = sum_k Y (k ascending)
    sum_rows_over_k(it.e, Y, out, M, topk, H, 16 * tile, 16);
    __syncwarp();
    if (lane == 0) done_dn[tile] = 0;
}

// Prologue of the one-launch kernels (every CTA, block of 128 threads, P = M * topk <= 128): sorts the
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

// grid: at most the CTAs that fit on the device at once (more only adds idle CTAs); block 128;
// at most 80 registers, so 6 CTAs (24 warps, 6 per scheduler) fit on an SM (shared memory: 6 x 30 KB).
extern "C" __global__ void __launch_bounds__(128, 6) moe_small_fused(
    const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn, const __nv_bfloat16* __restrict__ X,
    const int* __restrict__ ids, const float* __restrict__ topk_w, int M, int topk, int E, int H, int I,
    __nv_bfloat16* hbuf, float* Y, int* ws, __nv_bfloat16* __restrict__ out) {
    __shared__ __align__(16) unsigned char s_ring[4 * FR_S * FR_STAGE_U4 * 16];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned char* ring = s_ring + warp * (FR_S * FR_STAGE_U4 * 16);

    // ---- prologue: group the pairs by expert (every CTA does it; P <= 128)
    int nitems;
    const SmallItems it = small_items(ids, M, topk, E, H, out, nitems);

    // ---- tasks
    int* ctr_task = ws;
    int* ctr_fin = ws + 1;
    int* done_gu = ws + 2;
    int* done_dn = ws + 2 + FR_MAX_PAIRS;
    const int tiles_gu = I / 8, tiles_dn = H / 16;
    const int t_gu = nitems * tiles_gu, t_all = t_gu + nitems * tiles_dn;
    int task = 0;
    if (lane == 0) task = atomicAdd(ctr_task, 1);
    task = __shfl_sync(0xffffffffu, task, 0);
    while (task < t_all) {
        int next = 0;
        if (lane == 0) next = atomicAdd(ctr_task, 1);
        if (task < t_gu) {
            const int item = task / tiles_gu, tile = task - item * tiles_gu;
            small_gate_up<1>(it, item, tile, Fgu, X, topk, H, I, hbuf, done_gu, ring);
        } else {
            const int u = task - t_gu;
            const int item = u / tiles_dn, tile = u - item * tiles_dn;
            small_down<1>(it, item, tile, nitems, Fdn, hbuf, topk_w, M, topk, H, I, Y, done_gu, done_dn, out, ring);
        }
        task = __shfl_sync(0xffffffffu, next, 0);
    }
    __syncwarp();
    if (lane == 0) {
        __threadfence();
        if (atomicAdd(ctr_fin, 1) == (int)(gridDim.x * (blockDim.x / 32)) - 1) {
            // last warp of the launch: every other warp has finished with the counters
            ws[0] = 0;
            ws[1] = 0;
            for (int i = 0; i < FR_MAX_PAIRS; ++i) done_gu[i] = 0;
        }
    }
}


// ===================================================================================================
// Split-K form of the one-launch kernel (moe_small_splitk_s3 / _s4 / _s4x4_b5; fused.SMALL_TABLE dispatches
// _s4 at M = 2 and _s4x4_b5 at M = 3-16 on the H200; the others are selected with set_small_variant).
//
// Why: at M = 1-2, version 3 has fewer gate_up tasks (2048 at M = 1) than resident warps (3168), and each
// streams a whole tile's K (28 ring stages at H = 7168, 2 in flight) before the down phase can start; the
// four-launch kernels split K over 4 warps. Here a task is (item, K part, tile): the K range of a
// tile is cut into `s` equal parts (s = 1, 2 or 4, dividing the stages), one warp each, so a phase has
// s times as many, s times shorter, tasks. The split of each phase is chosen on the device (every CTA
// computes the same, from the item count): the smallest s <= s_max dividing the phase's stages with
// items x tiles x s >= want (want: tasks wanted per phase, from the host: 2 x the grid's warps), so at
// M >= 4 it is s = 1 and the kernel does what version 3 does.
//   gate_up, s > 1: each part stores its fp32 partial sums (columns < count) to gpart
//            [s, P, I/8, 16] (slot-major, 16 rows of the tile: gate g then up g), then counts itself
//            in red_gu[item, tile] (release); the part that arrives last (acquire) sums the s partials
//            in part order (0, 1, ...: deterministic, its own from registers), applies SiLU(gate) * up,
//            stores h, resets red_gu[item, tile] and counts the tile in done_gu[item]. s = 1: as version 3.
//   down:    each part waits for done_gu[item] == I/8 and stores w_pair * y for its K part to
//            ypart [s, P, H] (f32); done_dn[tile] counts items x s arrivals; the last sums, for every
//            token, s = sum over k ascending of (sum over parts ascending) in one fp32 chain (fixed order:
//            deterministic) into out, and resets the counter.
// Ordering of tasks: all gate_up tasks, item-major, then part, then tile (warps running at the same
// time read neighbouring tiles of one stage, as in version 3), then all down tasks in the same order.
// No gate_up task waits, and every gate_up task is grabbed before any down task: no deadlock.
// RS: ring stages per warp (RS - 1 in flight). RS = 3: 80 registers, 6 CTAs (24 warps) per SM, as
// version 3; RS = 4: one more stage in flight (6.9 KB per warp), shared memory allows 5 CTAs per SM.
// ws: int32 [2 + 128 + H/16 + 128 * I/8], zero before the first launch; left zero by every launch.

// Smallest split s in {1, 2, 4}, s <= smax, nsup % s == 0, with items * tiles * s >= want (else the
// largest allowed). workbench/moe/fused.py: splitk_choice is the same rule on the host.
__device__ __forceinline__ int splitk_pick(int items, int tiles, int nsup, int smax, int want) {
    int best = 1;
    for (int s = 1; s <= smax && s <= 4; s *= 2) {
        if (nsup % s) break;
        best = s;
        if (items * tiles * s >= want) break;
    }
    return best;
}

template <int NT, int RS, int XD = 0, bool XEND = false>
__device__ __forceinline__ void splitk_gate_up(const SmallItems& it, int item, int part, int tile, int sgu,
                                               const uint4* __restrict__ Fgu, const __nv_bfloat16* __restrict__ X,
                                               int P, int topk, int H, int I, __nv_bfloat16* __restrict__ hbuf,
                                               float* gpart, int* red_gu, int* done_gu, unsigned char* ring) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int ex = it.ie[item], slot0 = it.islot[item], cnt = it.icnt[item];
    const int tiles = I / 8, nsup = H / (64 * FR_SUB), nper = nsup / sgu;
    const uint4* wt = Fgu + ((long long)(ex * nsup + part * nper) * tiles + tile) * FR_STAGE_U4;
    const __nv_bfloat16* xr[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const int col = g + 8 * n;
        xr[n] = X + (long long)(it.sorted[slot0 + (col < cnt ? col : 0)] / topk) * H + part * nper * 64 * FR_SUB;
    }
    float acc[NT][4];
    frag_gemm<NT, false, RS, XD, XEND>(acc, wt, nper, (long long)tiles * FR_STAGE_U4, xr, nullptr, 0, ring);
    if (sgu > 1) {
        // partial sums of this part: gpart[((part * P + slot) * tiles + tile) * 16 + row], row g (gate), g + 8 (up)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
                const int col = 8 * n + 2 * t + cc;
                if (col < cnt) {
                    float* dst = gpart + ((long long)(part * P + slot0 + col) * tiles + tile) * 16;
                    dst[g] = acc[n][cc];
                    dst[g + 8] = acc[n][2 + cc];
                }
            }
        fence_acq_rel_gpu();
        __syncwarp();
        int last = 0;
        if (lane == 0) {
            fence_acq_rel_gpu();
            last = atomicAdd(red_gu + item * tiles + tile, 1) == sgu - 1;
            if (last) fence_acq_rel_gpu();
        }
        last = __shfl_sync(0xffffffffu, last, 0);
        if (!last) return;
        fence_acq_rel_gpu();
        // every part has stored: sum in part order (this warp's own part from registers)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
                const int col = 8 * n + 2 * t + cc;
                if (col < cnt) {
                    float gs = 0.f, us = 0.f;
                    for (int q = 0; q < sgu; ++q) {
                        float gv = acc[n][cc], uv = acc[n][2 + cc];
                        if (q != part) {
                            const float* src = gpart + ((long long)(q * P + slot0 + col) * tiles + tile) * 16;
                            gv = ld_cg_f32(src + g);
                            uv = ld_cg_f32(src + g + 8);
                        }
                        gs += gv;
                        us += uv;
                    }
                    acc[n][cc] = gs;
                    acc[n][2 + cc] = us;
                }
            }
        __syncwarp();
        if (lane == 0) red_gu[item * tiles + tile] = 0;   // every part has arrived: nobody else touches it
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) store_h(hbuf, slot0, cnt, 8 * n, I, tile, acc[n]);
    fence_acq_rel_gpu();
    __syncwarp();
    if (lane == 0) {
        fence_acq_rel_gpu();
        atomicAdd(done_gu + item, 1);
    }
}

template <int NT, int RS, int XD = 0, bool XEND = false>
__device__ __forceinline__ void splitk_down(const SmallItems& it, int item, int part, int tile, int sdn, int nitems,
                                            const uint4* __restrict__ Fdn, const __nv_bfloat16* hbuf,
                                            const float* __restrict__ topk_w, int M, int topk, int H, int I,
                                            float* ypart, const int* done_gu, int* done_dn,
                                            __nv_bfloat16* __restrict__ out, unsigned char* ring) {
    const int lane = threadIdx.x & 31, g = lane >> 2;
    const int ex = it.ie[item], slot0 = it.islot[item], cnt = it.icnt[item];
    const int tiles = H / 16, nsup = I / (64 * FR_SUB), nper = nsup / sdn;
    const int P = M * topk;
    const uint4* wt = Fdn + ((long long)(ex * nsup + part * nper) * tiles + tile) * FR_STAGE_U4;
    const __nv_bfloat16* xr[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const int col = g + 8 * n;
        xr[n] = hbuf + (long long)(slot0 + (col < cnt ? col : 0)) * I + part * nper * 64 * FR_SUB;
    }
    float acc[NT][4];
    frag_gemm<NT, true, RS, XD, XEND>(acc, wt, nper, (long long)tiles * FR_STAGE_U4, xr, done_gu + item, I / 8, ring);
    const int n0 = 16 * tile + g;
    float* yp = ypart + (long long)part * P * H;
#pragma unroll
    for (int n = 0; n < NT; ++n)
        store_weighted_y(it, slot0, cnt, 8 * n, topk_w, yp, H, n0, acc[n][0], acc[n][1], acc[n][2], acc[n][3]);
    fence_acq_rel_gpu();
    __syncwarp();
    int last = 0;
    if (lane == 0) {
        fence_acq_rel_gpu();
        last = atomicAdd(done_dn + tile, 1) == nitems * sdn - 1;
        if (last) fence_acq_rel_gpu();
    }
    last = __shfl_sync(0xffffffffu, last, 0);
    if (!last) return;
    fence_acq_rel_gpu();
    // every (item, part) has written its rows of this tile: out[m, tile rows] = sum_k sum_part (k outer, both ascending)
    for (int idx = lane; idx < M * 16; idx += 32) {
        const int m = idx >> 4, n = 16 * tile + (idx & 15);
        const float s = token_sum_over_k(it.e, m, topk, [&](float& acc, int pair) {
            for (int q = 0; q < sdn; ++q) acc += ld_cg_f32(ypart + ((long long)q * P + pair) * H + n);
        });
        out[(long long)m * H + n] = __float2bfloat16(s);
    }
    __syncwarp();
    if (lane == 0) done_dn[tile] = 0;
}

template <int RS, int XD = 0, bool XEND = false>
__device__ __forceinline__ void moe_small_splitk_body(
    const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn, const __nv_bfloat16* __restrict__ X,
    const int* __restrict__ ids, const float* __restrict__ topk_w, int M, int topk, int E, int H, int I,
    int sgu_max, int sdn_max, int want, __nv_bfloat16* hbuf, float* gpart, float* ypart, int* ws,
    __nv_bfloat16* __restrict__ out, unsigned char* s_ring) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int P = M * topk;
    unsigned char* ring = s_ring + warp * (RS * FR_STAGE_U4 * 16);
    int nitems;
    const SmallItems it = small_items(ids, M, topk, E, H, out, nitems);

    int* ctr_task = ws;
    int* ctr_fin = ws + 1;
    int* done_gu = ws + 2;
    int* done_dn = ws + 2 + FR_MAX_PAIRS;
    int* red_gu = ws + 2 + FR_MAX_PAIRS + H / 16;
    const int tiles_gu = I / 8, tiles_dn = H / 16;
    // the task bounds live in shared memory, re-read per task (held in registers across the task they spilled)
    __shared__ int s_cfg[4];
    if (threadIdx.x == 0) {
        const int sg = splitk_pick(nitems, tiles_gu, H / (64 * FR_SUB), sgu_max, want);
        const int sd = splitk_pick(nitems, tiles_dn, I / (64 * FR_SUB), sdn_max, want);
        s_cfg[0] = sg;
        s_cfg[1] = sd;
        s_cfg[2] = nitems * sg * tiles_gu;                      // gate_up tasks
        s_cfg[3] = s_cfg[2] + nitems * sd * tiles_dn;           // all tasks
    }
    __syncthreads();
    const volatile int* cfg = s_cfg;
    int task = 0;
    if (lane == 0) task = atomicAdd(ctr_task, 1);
    task = __shfl_sync(0xffffffffu, task, 0);
    while (task < cfg[3]) {
        int next = 0;
        if (lane == 0) next = atomicAdd(ctr_task, 1);
        const int t_gu = cfg[2];
        if (task < t_gu) {
            const int sgu = cfg[0], per_gu = sgu * tiles_gu;
            const int item = task / per_gu, r = task - item * per_gu;
            const int part = r / tiles_gu, tile = r - part * tiles_gu;
            splitk_gate_up<1, RS, XD, XEND>(it, item, part, tile, sgu, Fgu, X, P, topk, H, I, hbuf, gpart, red_gu, done_gu,
                                  ring);
        } else {
            const int sdn = cfg[1], per_dn = sdn * tiles_dn;
            const int u = task - t_gu;
            const int item = u / per_dn, r = u - item * per_dn;
            const int part = r / tiles_dn, tile = r - part * tiles_dn;
            splitk_down<1, RS, XD, XEND>(it, item, part, tile, sdn, nitems, Fdn, hbuf, topk_w, M, topk, H, I, ypart, done_gu,
                               done_dn, out, ring);
        }
        task = __shfl_sync(0xffffffffu, next, 0);
    }
    __syncwarp();
    if (lane == 0) {
        __threadfence();
        if (atomicAdd(ctr_fin, 1) == (int)(gridDim.x * (blockDim.x / 32)) - 1) {
            // last warp of the launch: every other warp has finished with the counters
            ws[0] = 0;
            ws[1] = 0;
            for (int i = 0; i < FR_MAX_PAIRS; ++i) done_gu[i] = 0;
        }
    }
}

// grid: at most the CTAs that fit on the device at once; block 128. sgu_max / sdn_max in {1, 2, 4};
// want: tasks wanted per phase (split chosen per phase on the device, see splitk_pick).
// gpart: f32 [sgu_max, P, I/8, 16] (unused when sgu_max == 1), ypart: f32 [sdn_max, P, H].
// NAME: the kernel; RS ring stages; MINB CTAs per SM (launch bound); XD activation prefetch distance in 64-K
// steps (0: frag_gemm's default, 2).
#define MOE_SPLITK_KERNEL(NAME, RS, MINB, XD, XEND)                                                           \
    extern "C" __global__ void __launch_bounds__(128, MINB) NAME(                                              \
        const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn, const __nv_bfloat16* __restrict__ X,     \
        const int* __restrict__ ids, const float* __restrict__ topk_w, int M, int topk, int E, int H, int I,   \
        int sgu_max, int sdn_max, int want, __nv_bfloat16* hbuf, float* gpart, float* ypart, int* ws,          \
        __nv_bfloat16* __restrict__ out) {                                                                     \
        __shared__ __align__(16) unsigned char s_ring[4 * RS * FR_STAGE_U4 * 16];                             \
        moe_small_splitk_body<RS, XD, XEND>(Fgu, Fdn, X, ids, topk_w, M, topk, E, H, I, sgu_max, sdn_max, want, \
                                            hbuf, gpart, ypart, ws, out, s_ring);                              \
    }

MOE_SPLITK_KERNEL(moe_small_splitk_s3, 3, 6, 0, false)
MOE_SPLITK_KERNEL(moe_small_splitk_s4, 4, 5, 0, false)
// splitk_s4 with the activations 4 steps of 64 K ahead instead of 2 (Nsight Compute at M = 16 put a quarter of
// the stall samples on the HMMAs waiting for them). XD must divide FR_SUB (XD = 3 computed wrong results in
// moe_small_xprefetch.json and was removed). The 4-CTA forms (XD 4 and 2 at MINB 4) were slower than XD 4 at
// MINB 5 in the same run and were removed (history: eb8e061).
MOE_SPLITK_KERNEL(moe_small_splitk_s4x4_b5, 4, 5, 4, false)
// The same with the next stage's activations loaded after the stage's last step into the same registers (XEND):
// no buffer-rotation moves waiting for the loads (moe_profile_8c7598f, SASS).
MOE_SPLITK_KERNEL(moe_small_splitk_s4x4e_b5, 4, 5, 4, true)


// ===================================================================================================
// CTA-split form of the one-launch kernel (moe_small_ctasplit, _max and _x4: activations 4 steps ahead;
// workbench.moe.fused.SMALL_TABLE dispatches one of them at M = 1). Aimed at M = 1-2.
//
// Why (Nsight Compute of splitk_s4 at M = 1, NOTES.md): 0.43 issues per scheduler-cycle, stalls long
// scoreboard 3.8 + membar 2.1-2.3 + wait 1.3 cycles per issue: every split-K task (~6 per warp at M = 1)
// restarts its warp's ring (a DRAM round trip before its first stage), drains it at its end and fences
// its partial sums through L2. Here:
// - a task belongs to a CTA: (phase, item, group of 4/s tiles); warp w takes tile w / s of the group and
//   K part w % s (s = 4: one tile, its K cut in 4; s = 1: four tiles, whole K). The s partial sums of a
//   tile are added in shared memory after ONE block barrier (fixed part order: deterministic), by one
//   warp (the epilogue warp, warp j % 4 for the CTA's j-th task, so the extra work rotates), which
//   then does what the task's last warp did in splitk: SiLU(gate) x up -> h and done_gu[item] += 4/s
//   (one fence for the CTA task, not one per warp), or w x y -> Y, done_dn[group] += 1 and, if last,
//   the sum over k of the group's 64 / s rows. No L2 partial sums, no reduction counters.
// - each warp's ring runs continuously over the CTA's task sequence: thread 0 grabs tasks from the
//   global counter L + 1 ahead of the task being computed (queue s_q of 8 in shared memory, published
//   by the task's block barrier), so the ring's issuer, RS - 1 = 3 stages ahead, moves to the next
//   task's weights while the current task is computed, and the ring never drains until the end.
//   L = ceil((RS - 1) / fewest stages per warp of a task), 1 at Kimi shapes (7 and 4 stages).
// - down tasks wait for their item's gate_up tiles (done_gu) before loading h, only when the item
//   differs from the last one this warp saw complete (items are grabbed in increasing order).
// Deadlock: every task grabbed is held by a running CTA; gate_up tasks never wait; a CTA holding
// grabbed-but-not-started tasks is either computing a gate_up task (never waits) or a down task, and
// then every task it holds is a down task too (grabs increase), so the gate_up tasks a down task waits
// for are held by CTAs that finish them. The stage loop is splitk_s4's (frag_step; the issuer's task
// switch is a branch taken once per task).
// Safety of the shared queue and the partial-sum buffers (CPU model: workbench/moe/ctasplit.py):
//   s_q[(j + L + 1) & 7] is written by thread 0 after barrier j - 1 (read of the old value: before
//   barrier j + L - 7 <= j - 4); partial sums of task j go to buffer j & 1, written before barrier j,
//   read by the epilogue warp after it and before that warp reaches barrier j + 1, which every writer
//   of task j + 2 has passed.
// ws: int32 [2 + 128 + H/16], zero before the first launch; left zero by every launch.
#ifdef MOE_TRACE
// Timeline of moe_small_ctasplit (diagnostic build only: -DMOE_TRACE; workbench/moe/trace.py reads it). Per CTA
// MOE_TRACE_WORDS u64: [0] entry, [1] end of the prologue (queue filled), [2] exit, [3] tasks taken; then per
// task j < MOE_TRACE_TASKS, MOE_TRACE_TW words: task number; warp 0: before its wait for h (down tasks), after it
// (stages begin), after the task's block barrier; each warp w's arrival at that barrier (4 words); the epilogue
// warp: epilogue begin, fence begin, counter published (after the fence and the atomic), epilogue end.
// Times are %globaltimer (ns).
#define MOE_TRACE_TASKS 64
#define MOE_TRACE_TW 12
#define MOE_TRACE_WORDS (4 + MOE_TRACE_TW * MOE_TRACE_TASKS)
#define MOE_TRACE_CTAS 2048
__device__ unsigned long long moe_trace[MOE_TRACE_CTAS * MOE_TRACE_WORDS];
__shared__ int s_trace_j;   // the task the epilogue warp is finishing (set by its lane 0)
__device__ __forceinline__ unsigned long long trace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define TRACE_W(word, value) \
    do { if (blockIdx.x < MOE_TRACE_CTAS) moe_trace[blockIdx.x * MOE_TRACE_WORDS + (word)] = (value); } while (0)
#define TRACE_AT(word, value) do { if (threadIdx.x == 0) TRACE_W(word, value); } while (0)
#define TRACE_TASK(j, k, value) \
    do { if ((j) < MOE_TRACE_TASKS) TRACE_W(4 + MOE_TRACE_TW * (j) + (k), value); } while (0)
#else
#define TRACE_AT(word, value) do { } while (0)
#define TRACE_TASK(j, k, value) do { } while (0)
#endif

#define CS_RS 4     // ring stages per warp (3 in flight), as splitk_s4
#define CS_Q 8      // task queue entries

struct CsTask {
    bool gu;    // gate_up (else down)
    int s;      // K parts per tile (4 / s tiles per task)
    int item;
    int grp;    // tile group: tiles grp * 4 / s ... + 4 / s - 1
};

// Task index -> (phase, split, item, tile group): gate_up tasks first (item-major, then group), then down.
__device__ __forceinline__ CsTask cs_decode(int tn, int t_gu, int sgu, int sdn, int tiles_gu, int tiles_dn) {
    CsTask r;
    r.gu = tn < t_gu;
    r.s = r.gu ? sgu : sdn;
    const int groups = (r.gu ? tiles_gu : tiles_dn) * r.s / 4, u = r.gu ? tn : tn - t_gu;
    r.item = u / groups;
    r.grp = u - r.item * groups;
    return r;
}

// Epilogue of one CTA task, by one warp, after the block barrier: buf holds each warp's fp32 fragment
// (float4 per lane: rows g, g + 8 x columns 2t, 2t + 1); tile r of the task sums warps r * s ... r * s + s - 1.
// F1: publish with one fence (lane 0's, after __syncwarp, which orders the other lanes' stores before it) instead of
// a fence by every lane and then lane 0's.
template <bool F1 = false>
__device__ __forceinline__ void cs_epilogue(const CsTask tk, const SmallItems& it, const float4* buf, int M, int topk,
                                            int H, int I, int nitems, __nv_bfloat16* hbuf, float* Y,
                                            const float* __restrict__ topk_w, int* done_gu, int* done_dn,
                                            __nv_bfloat16* __restrict__ out) {
    const int lane = threadIdx.x & 31, g = lane >> 2;
    const bool gu = tk.gu;
    const int s = tk.s, item = tk.item, grp = tk.grp;
    const int slot0 = it.islot[item], cnt = it.icnt[item];
    const int ntile = 4 / s;
    if (gu) {
        for (int r = 0; r < ntile; ++r) {
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int pp = 0; pp < s; ++pp) {
                const float4 a = buf[(r * s + pp) * 32 + lane];
                v.x += a.x; v.y += a.y; v.z += a.z; v.w += a.w;
            }
            const float c[4] = {v.x, v.y, v.z, v.w};
            store_h(hbuf, slot0, cnt, 0, I, grp * ntile + r, c);
        }
#ifdef MOE_TRACE
        if (lane == 0) TRACE_TASK(s_trace_j, 9, trace_now());
#endif
        if (!F1) fence_acq_rel_gpu();
        __syncwarp();
        if (lane == 0) {
            fence_acq_rel_gpu();
            atomicAdd(done_gu + item, ntile);
#ifdef MOE_TRACE
            TRACE_TASK(s_trace_j, 10, trace_now());
#endif
        }
    } else {
        for (int r = 0; r < ntile; ++r) {
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int pp = 0; pp < s; ++pp) {
                const float4 a = buf[(r * s + pp) * 32 + lane];
                v.x += a.x; v.y += a.y; v.z += a.z; v.w += a.w;
            }
            store_weighted_y(it, slot0, cnt, 0, topk_w, Y, H, 16 * (grp * ntile + r) + g, v.x, v.y, v.z, v.w);
        }
#ifdef MOE_TRACE
        if (lane == 0) TRACE_TASK(s_trace_j, 9, trace_now());
#endif
        if (!F1) fence_acq_rel_gpu();
        __syncwarp();
        int last = 0;
        if (lane == 0) {
            fence_acq_rel_gpu();
            last = atomicAdd(done_dn + grp, 1) == nitems - 1;
            if (last) fence_acq_rel_gpu();
#ifdef MOE_TRACE
            TRACE_TASK(s_trace_j, 10, trace_now());
#endif
        }
        last = __shfl_sync(0xffffffffu, last, 0);
        if (last) {
            fence_acq_rel_gpu();
            // every item has written the group's rows: out[m, rows] = sum over k ascending of Y
            sum_rows_over_k(it.e, Y, out, M, topk, H, 16 * ntile * grp, 16 * ntile);
            __syncwarp();
            if (lane == 0) done_dn[grp] = 0;
        }
    }
}

// The stage loop of one CTA task for this warp (splitk_s4's, frag_gemm's loop body): nper ring stages, the
// activations two 64-K steps ahead in registers (COHERENT: h of this launch, through L2), the issuer called
// once per stage (RS - 1 stages ahead, crossing into the CTA's next tasks).
template <bool COHERENT, int RS, int XD, bool XEND, typename Issue>
__device__ __forceinline__ void cs_stages(float (&acc)[4], const __nv_bfloat16* xp, int nper, const unsigned char* ring,
                                          unsigned int& rslot, Issue& issue) {
    static_assert(FR_SUB % XD == 0, "the activation buffers cycle per 64-K step: XD must divide FR_SUB");
    static_assert(!XEND || XD == FR_SUB, "XEND loads a whole stage: XD must equal FR_SUB");
    const int lane = threadIdx.x & 31, g = lane >> 2;
    uint4 xb[XD][1][2];
#pragma unroll
    for (int d = 0; d < XD; ++d) {
        xb[d][0][0] = ld_x16<COHERENT>(xp + 64 * d);
        xb[d][0][1] = ld_x16<COHERENT>(xp + 64 * d + 32);
    }
    float a[1][4] = {{acc[0], acc[1], acc[2], acc[3]}};
#pragma unroll 1
    for (int k = 0; k < nper; ++k) {
        cp_async_wait<RS - 2>();   // this stage has landed (this lane's copies)
        __syncwarp();              // ... and every lane's; every lane is done with the previous stage
        issue();                   // RS - 1 stages ahead, into the previous stage's slot
        const unsigned char* st = ring + rslot;
        const __nv_bfloat16* xn = xp + (k + 1 < nper ? 256 : 0);   // the last stage re-reads its own steps
#pragma unroll
        for (int qq = 0; qq < FR_SUB; ++qq) {
            const uint4 w = *reinterpret_cast<const uint4*>(st + qq * (FR_U4 * 16) + lane * 16);
            const uint2 sc = *reinterpret_cast<const uint2*>(st + qq * (FR_U4 * 16) + 512 + g * 8);
            uint4 xc[1][2];
            xc[0][0] = xb[qq % XD][0][0];
            xc[0][1] = xb[qq % XD][0][1];
            if (!XEND) {
                const __nv_bfloat16* p = qq + XD < FR_SUB ? xp + 64 * (qq + XD) : xn + 64 * (qq + XD - FR_SUB);
                xb[qq % XD][0][0] = ld_x16<COHERENT>(p);
                xb[qq % XD][0][1] = ld_x16<COHERENT>(p + 32);
            }
#ifdef MOE_DIAG_NOMATH   // diagnostic build (workbench/moe/diag.py): the stage's loads kept, its math replaced by one add
            a[0][0] += __uint_as_float((w.x ^ w.y ^ w.z ^ w.w ^ sc.x ^ sc.y ^ xc[0][0].x ^ xc[0][1].w) & 0x007fffffu);
#else
            frag_step<1>(a, w, sc, xc);
#endif
        }
        if (XEND) {   // the whole next stage's activations, after this stage's last step (see frag_gemm)
#pragma unroll
            for (int d = 0; d < XD; ++d) {
                xb[d][0][0] = ld_x16<COHERENT>(xn + 64 * d);
                xb[d][0][1] = ld_x16<COHERENT>(xn + 64 * d + 32);
            }
        }
        xp = xn;
        rslot = ring_next<RS>(rslot);
    }
    acc[0] = a[0][0]; acc[1] = a[0][1]; acc[2] = a[0][2]; acc[3] = a[0][3];
}


// F1: the epilogues publish with one fence (cs_epilogue<true>) and a down task waits for its item's h with an acquire
// load instead of a relaxed load and a fence. SR (with F1): that wait spins on relaxed loads and then takes ONE
// acquire load: ld.acquire.gpu compiles to LDG.STRONG.GPU + CCTL.IVALL, so an acquire per spin iteration invalidates
// the SM's L1 (where the gate/up activations of the SM's other warps live) once per iteration. ST: each CTA's first
// L + 1 tasks are static (task q * gridDim.x + blockIdx.x), so no CTA waits for contended atomics on the task counter
// before its first weight issue; the counter then hands out tasks from (L + 1) * gridDim.x on. The order argument
// that rules out a deadlock still holds: no queue holds a down task ahead of a gate_up task. SD (with ST; run 27c): one
// more static task per CTA (L + 2), so the first grab from the counter happens at task 1 instead of task 0: in
// x4e_r3fst's timeline the first stages begin ~4 us after the prologue, while every CTA's thread 0 waits in the same
// contended returning atomic (the epilogue-warp form, whose streaming warps grab nothing, started them ~2 us earlier).
// Every CTA still takes its tasks in increasing number, so the deadlock argument is unchanged.
template <int RS, int XD = 2, bool XEND = false, bool F1 = false, bool SR = false, bool ST = false, bool SD = false>
__device__ __forceinline__ void moe_small_ctasplit_body(
    const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn, const __nv_bfloat16* __restrict__ X,
    const int* __restrict__ ids, const float* __restrict__ topk_w, int M, int topk, int E, int H, int I,
    int sgu, int sdn, __nv_bfloat16* hbuf, float* Y, int* ws, __nv_bfloat16* __restrict__ out,
    unsigned char* s_ring, float4* s_part) {
    __shared__ int s_q[CS_Q];
    __shared__ int s_cfg[4];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    unsigned char* ring = s_ring + warp * (RS * FR_STAGE_U4 * 16);
    TRACE_AT(0, trace_now());
    int nitems;
    const SmallItems it = small_items(ids, M, topk, E, H, out, nitems);

    int* ctr_task = ws;
    int* ctr_fin = ws + 1;
    int* done_gu = ws + 2;
    int* done_dn = ws + 2 + FR_MAX_PAIRS;
    const int tiles_gu = I / 8, tiles_dn = H / 16;
    const int nsup_gu = H / (64 * FR_SUB), nsup_dn = I / (64 * FR_SUB);
    if (tid == 0) {
        const int t_gu = nitems * (tiles_gu * sgu / 4);
        s_cfg[0] = t_gu;
        s_cfg[1] = t_gu + nitems * (tiles_dn * sdn / 4);
        const int spt = min(nsup_gu / sgu, nsup_dn / sdn);
        const int L = (RS - 1 + spt - 1) / spt;
        s_cfg[2] = L;
        static_assert(!SD || ST, "SD deepens the static first tasks");
        for (int q = 0; q <= L + (SD ? 1 : 0); ++q)
            s_q[q] = ST ? q * (int)gridDim.x + (int)blockIdx.x : atomicAdd(ctr_task, 1);
    }
    __syncthreads();
    TRACE_AT(1, trace_now());
    const volatile int* cfg = s_cfg;
    const volatile int* q = s_q;

    // ---- issuer: this warp's part of every task of the CTA's sequence, RS - 1 stages ahead
    const unsigned int dst0 = (unsigned int)__cvta_generic_to_shared(ring) + lane * 16;
    const bool scale_lane = lane < 16;
    int iq = -1, ileft = 0, istride = 0;
    const uint4* isrc = nullptr;
    unsigned int wslot = 0;
    auto issue = [&]() {
        if (ileft == 0) {   // this warp's part of the issuer's task is issued: move to the CTA's next task
            ++iq;
            const int tn = q[iq & (CS_Q - 1)];
            ileft = -1;     // no more tasks: issue nothing more
            if (tn < cfg[1]) {
                const CsTask tk = cs_decode(tn, cfg[0], sgu, sdn, tiles_gu, tiles_dn);
                const int nsup = tk.gu ? nsup_gu : nsup_dn, tiles = tk.gu ? tiles_gu : tiles_dn;
                const int tile = tk.grp * (4 / tk.s) + warp / tk.s, part = warp % tk.s, nper = nsup / tk.s;
                isrc = (tk.gu ? Fgu : Fdn) + ((long long)(it.ie[tk.item] * nsup + part * nper) * tiles + tile) * FR_STAGE_U4
                       + lane;
                istride = tiles * FR_STAGE_U4;
                ileft = nper;
            }
        }
        ring_issue_stage<RS>(dst0, wslot, isrc, istride, ileft, scale_lane);
    };
#pragma unroll
    for (int s = 0; s < RS - 1; ++s) issue();

    int ready = -1;          // last item whose gate_up tiles this warp saw complete
    unsigned int rslot = 0;
    for (int j = 0;; ++j) {
        const int tj = q[j & (CS_Q - 1)];
        if (tj >= cfg[1]) break;
        int grab = 0;
        if (tid == 0 && !(SD && j == 0))   // task j + L + 1 (static at j = 0 with SD); used only before the barrier
            grab = atomicAdd(ctr_task, 1) + (ST ? (cfg[2] + 1 + (SD ? 1 : 0)) * (int)gridDim.x : 0);
        const CsTask tk = cs_decode(tj, cfg[0], sgu, sdn, tiles_gu, tiles_dn);
        const bool gu = tk.gu;
        const int item = tk.item, part = warp % tk.s, nper = (gu ? nsup_gu : nsup_dn) / tk.s;
        const int slot0 = it.islot[item], cnt = it.icnt[item];
        const int col = g < cnt ? g : 0;   // columns past the item's count repeat its first row (not stored)
        const __nv_bfloat16* xp =
            gu ? X + (long long)(it.sorted[slot0 + col] / topk) * H + part * nper * 64 * FR_SUB
               : hbuf + (long long)(slot0 + col) * I + part * nper * 64 * FR_SUB;
#ifdef MOE_TRACE
        if (tid == 0) {
            TRACE_TASK(j, 0, (unsigned long long)tj);
            TRACE_TASK(j, 1, trace_now());
        }
#endif
#ifdef MOE_DIAG_NOWAIT   // diagnostic build (workbench/moe/diag.py): down tasks do not wait for their item's h
        ready = item;
#endif
        if (!gu && item != ready) {   // h of this item: every gate_up tile stored (acquire)
            if (lane == 0) {
                if (F1 && SR) {
                    while (ld_relaxed_gpu(done_gu + item) < tiles_gu) __nanosleep(128);
                    (void)ld_acquire_gpu(done_gu + item);   // >= tiles_gu: synchronises with every publish
                } else if (F1) {
                    while (ld_acquire_gpu(done_gu + item) < tiles_gu) __nanosleep(128);
                } else {
                    while (ld_relaxed_gpu(done_gu + item) < tiles_gu) __nanosleep(128);
                    fence_acq_rel_gpu();
                }
            }
            __syncwarp();
            ready = item;
        }
#ifdef MOE_TRACE
        if (tid == 0) TRACE_TASK(j, 2, trace_now());
#endif
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (gu) cs_stages<false, RS, XD, XEND>(acc, xp + 8 * t, nper, ring, rslot, issue);
        else cs_stages<true, RS, XD, XEND>(acc, xp + 8 * t, nper, ring, rslot, issue);
        float4* buf = s_part + (j & 1) * 128;
        buf[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        if (tid == 0 && !(SD && j == 0)) s_q[(j + cfg[2] + 1) & (CS_Q - 1)] = grab;
#ifdef MOE_TRACE
        if (lane == 0) TRACE_TASK(j, 4 + warp, trace_now());
#endif
        __syncthreads();   // barrier j: every part of task j is in buf; task j + L + 1 is in the queue
#ifdef MOE_TRACE
        if (tid == 0) TRACE_TASK(j, 3, trace_now());
        TRACE_AT(3, (unsigned long long)(j + 1));
#endif
        if (warp != (j & 3)) continue;
#ifdef MOE_TRACE
        if (lane == 0) {
            s_trace_j = j;
            TRACE_TASK(j, 8, trace_now());
        }
        __syncwarp();
#endif
        // ---- epilogue warp of task j: sum the s parts of each of the task's 4 / s tiles (part order)
        cs_epilogue<F1>(cs_decode(tj, cfg[0], sgu, sdn, tiles_gu, tiles_dn), it, buf, M, topk, H, I, nitems, hbuf, Y,
                    topk_w, done_gu, done_dn, out);
#ifdef MOE_TRACE
        if (lane == 0) TRACE_TASK(j, 11, trace_now());
#endif
    }
    TRACE_AT(2, trace_now());
    cp_async_wait<0>();
    __syncwarp();
    if (lane == 0) {
        __threadfence();
        if (atomicAdd(ctr_fin, 1) == (int)(gridDim.x * (blockDim.x / 32)) - 1) {
            // last warp of the launch: every other warp has finished with the counters
            ws[0] = 0;
            ws[1] = 0;
            for (int i = 0; i < FR_MAX_PAIRS; ++i) done_gu[i] = 0;
        }
    }
}

// grid: at most the CTAs that fit on the device at once; block 128 (4 warps). sgu / sdn in {1, 2, 4}: K parts
// per tile of each phase (4 / s tiles per CTA task), s dividing H/256 (gate_up) and I/256 (down); the host
// chooses them (fused.ctasplit_splits). Y: f32 [P, H]. Shared: 4 rings of 4 x 2304 B + 2 x 2 KB partial sums.
extern "C" __global__ void __launch_bounds__(128, 5) moe_small_ctasplit(
    const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn, const __nv_bfloat16* __restrict__ X,
    const int* __restrict__ ids, const float* __restrict__ topk_w, int M, int topk, int E, int H, int I,
    int sgu, int sdn, __nv_bfloat16* hbuf, float* Y, int* ws, __nv_bfloat16* __restrict__ out) {
    __shared__ __align__(16) unsigned char s_ring[4 * CS_RS * FR_STAGE_U4 * 16];
    __shared__ float4 s_part[2 * 128];
    moe_small_ctasplit_body<CS_RS>(Fgu, Fdn, X, ids, topk_w, M, topk, E, H, I, sgu, sdn, hbuf, Y, ws, out, s_ring,
                                   s_part);
}

// The CTA-split kernel with the activations 4 steps of 64 K ahead instead of 2 (x4), and the same with the next
// stage's activations loaded after the stage's last step into the same registers (x4e: no buffer-rotation moves);
// RS ring stages per warp (x4e_r3: 3, two in flight, 35 KB of shared memory per CTA instead of 44); F1: one fence per
// publish and acquire loads (x4e_r3f); SR: the h wait spins relaxed, then one acquire (x4e_r3fs); ST: static first
// tasks (x4e_r3fst); SD: one more static task, no grab at task 0 (x4e_r3fstd, run 27c).
#define MOE_CTASPLIT_KERNEL(NAME, XD, XEND, RS, F1, SR, ST, SD)                                                             \
    extern "C" __global__ void __launch_bounds__(128, 5) NAME(                                                      \
        const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn, const __nv_bfloat16* __restrict__ X,          \
        const int* __restrict__ ids, const float* __restrict__ topk_w, int M, int topk, int E, int H, int I,        \
        int sgu, int sdn, __nv_bfloat16* hbuf, float* Y, int* ws, __nv_bfloat16* __restrict__ out) {                \
        __shared__ __align__(16) unsigned char s_ring[4 * RS * FR_STAGE_U4 * 16];                                    \
        __shared__ float4 s_part[2 * 128];                                                                           \
        moe_small_ctasplit_body<RS, XD, XEND, F1, SR, ST, SD>(Fgu, Fdn, X, ids, topk_w, M, topk, E, H, I, sgu, sdn, hbuf, \
                                                          Y,                                                         \
                                                      ws,                                                            \
                                              out, s_ring, s_part);                                                  \
    }
MOE_CTASPLIT_KERNEL(moe_small_ctasplit_x4, 4, false, CS_RS, false, false, false, false)
MOE_CTASPLIT_KERNEL(moe_small_ctasplit_x4e, 4, true, CS_RS, false, false, false, false)
MOE_CTASPLIT_KERNEL(moe_small_ctasplit_x4e_r3, 4, true, 3, false, false, false, false)
MOE_CTASPLIT_KERNEL(moe_small_ctasplit_x4e_r3f, 4, true, 3, true, false, false, false)
MOE_CTASPLIT_KERNEL(moe_small_ctasplit_x4e_r3fs, 4, true, 3, true, true, false, false)
MOE_CTASPLIT_KERNEL(moe_small_ctasplit_x4e_r3fst, 4, true, 3, true, true, true, false)
MOE_CTASPLIT_KERNEL(moe_small_ctasplit_x4e_r3fstd, 4, true, 3, true, true, true, true)

// ===================================================================================================
// Warp-split form of the one-launch kernel (moe_small_wsplit_*; workbench/moe/fused.py "ws" variants).
//
// Why (run 24, papers/moe_int4.md): the CTA-split kernel's per-warp cp.async ring alone streams at 96-98% of a
// read-only kernel (moe_stream_ring), but the kernel reaches about three quarters of it at M = 1: the four warps
// of a CTA are coupled by every task's block barrier, and each task's epilogue (partial sums, fences, returning
// atomics, last-arriver sums) sits on the CTA's critical path. Here every warp is on its own, as in the ring
// kernel: a unit is one K part of one tile, (gate_up | down, item, part, tile), nper = stages / s ring stages
// (s = sgu or sdn parts per tile, from the host); the warp's ring runs on into its next unit (RS - 1 stages
// ahead), its first unit is static (the warp's global index) and the rest come from one counter, grabbed one
// unit ahead by lane 0 (units have at least RS - 1 stages: the host checks).
//   s > 1: each part stores its fp32 partial (columns < count) to gpart [s, P, I/8, 16] (gate_up) or
//          ypart [s, P, H] (down), fences (lane 0, after __syncwarp) and counts itself in red[item, tile]; the
//          part that arrives last (returning atomic) sums the s partials in part order 0..s-1 from 0 (its own
//          from registers: the same fp32 chain as the CTA-split kernel's shared-memory sum, so outputs are
//          bit-identical to it at the same split), resets the counter and finishes the tile:
//   gate_up tile: h = SiLU(gate) * up (bf16) for its 8 columns, then done_gu[item] += 1 (lane 0's fence first);
//   down tile:    Y[pair, rows] = w_pair * y, then done_dn[tile] += 1 (returning); the item that arrives last
//          sums, for every token, Y over k ascending into out (NaN for a token with an invalid id) and resets it.
// A down unit waits (lane 0: relaxed spin, then one acquire) until done_gu[item] == I/8. Units are numbered
// gate_up first: a down unit waits only for gate_up units with smaller numbers, every one of them held by a
// running warp that waits for nothing, so the persistent grid cannot deadlock.
// grid: at most the CTAs that fit at once; block 128. ws: int32 [2 + 128 + H/16 + 128 * I/8 + 128 * H/16], zero
// before the first launch, left zero by every launch.
struct WsUnit {
    bool gu;
    int item, part, tile;
};

__device__ __forceinline__ WsUnit ws_decode(int u, int u_gu, int sgu, int sdn, int tiles_gu, int tiles_dn) {
    WsUnit r;
    r.gu = u < u_gu;
    const int s = r.gu ? sgu : sdn, tiles = r.gu ? tiles_gu : tiles_dn, v = r.gu ? u : u - u_gu;
    r.item = v / (s * tiles);
    const int w = v - r.item * s * tiles;
    r.part = w / tiles;
    r.tile = w - r.part * tiles;
    return r;
}

template <int RS>
__device__ __forceinline__ void moe_small_wsplit_body(
    const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn, const __nv_bfloat16* __restrict__ X,
    const int* __restrict__ ids, const float* __restrict__ topk_w, int M, int topk, int E, int H, int I, int sgu,
    int sdn, __nv_bfloat16* hbuf, float* gpart, float* ypart, float* Y, int* ws, __nv_bfloat16* __restrict__ out,
    unsigned char* s_ring) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    unsigned char* ring = s_ring + warp * (RS * FR_STAGE_U4 * 16);
    int nitems;
    const SmallItems it = small_items(ids, M, topk, E, H, out, nitems);
    const int P = M * topk;
    const int tiles_gu = I / 8, tiles_dn = H / 16;
    const int nsup_gu = H / (64 * FR_SUB), nsup_dn = I / (64 * FR_SUB);
    int* ctr = ws;
    int* ctr_fin = ws + 1;
    int* done_gu = ws + 2;
    int* done_dn = ws + 2 + FR_MAX_PAIRS;
    int* red_gu = done_dn + tiles_dn;                 // [128, I/8]
    int* red_dn = red_gu + FR_MAX_PAIRS * tiles_gu;   // [128, H/16]
    const int u_gu = nitems * sgu * tiles_gu, u_all = u_gu + nitems * sdn * tiles_dn;
    const int W = gridDim.x * (blockDim.x >> 5), wid = blockIdx.x * (blockDim.x >> 5) + warp;

    // ---- issuer: this warp's units in order, RS - 1 stages ahead
    const unsigned int dst0 = (unsigned int)__cvta_generic_to_shared(ring) + lane * 16;
    const bool scale_lane = lane < 16;
    int grab = 0;                       // lane 0: the unit after the one being computed (from the counter)
    if (lane == 0 && wid < u_all) grab = W + atomicAdd(ctr, 1);
    int iu = wid, ileft = 0, istride = 0;   // unit being issued, its stages left (-1: nothing more to issue)
    bool ifirst = true;
    const uint4* isrc = nullptr;
    unsigned int wslot = 0;
    auto issue = [&]() {
        if (ileft == 0) {   // move to the next unit: the first, then the grabbed one
            if (!ifirst) iu = __shfl_sync(0xffffffffu, grab, 0);
            ifirst = false;
            ileft = -1;
            if (iu < u_all) {
                const WsUnit un = ws_decode(iu, u_gu, sgu, sdn, tiles_gu, tiles_dn);
                const int nsup = un.gu ? nsup_gu : nsup_dn, tiles = un.gu ? tiles_gu : tiles_dn;
                const int nper = nsup / (un.gu ? sgu : sdn);
                isrc = (un.gu ? Fgu : Fdn) + ((long long)(it.ie[un.item] * nsup + un.part * nper) * tiles + un.tile) *
                                                 FR_STAGE_U4 + lane;
                istride = tiles * FR_STAGE_U4;
                ileft = nper;
            }
        }
        ring_issue_stage<RS>(dst0, wslot, isrc, istride, ileft, scale_lane);
    };
#pragma unroll
    for (int i = 0; i < RS - 1; ++i) issue();

    int ready = -1;
    unsigned int rslot = 0;
    int cur = wid;
    while (cur < u_all) {
        const WsUnit un = ws_decode(cur, u_gu, sgu, sdn, tiles_gu, tiles_dn);
        const int s = un.gu ? sgu : sdn, nper = (un.gu ? nsup_gu : nsup_dn) / s;
        const int item = un.item, slot0 = it.islot[item], cnt = it.icnt[item];
        const int col = g < cnt ? g : 0;   // columns past the item's count repeat its first row (not stored)
        const __nv_bfloat16* xp =
            un.gu ? X + (long long)(it.sorted[slot0 + col] / topk) * H + un.part * nper * 64 * FR_SUB
                  : hbuf + (long long)(slot0 + col) * I + un.part * nper * 64 * FR_SUB;
        if (!un.gu && item != ready) {   // h of this item: every gate_up tile stored
            if (lane == 0) {
                while (ld_relaxed_gpu(done_gu + item) < tiles_gu) __nanosleep(128);
                (void)ld_acquire_gpu(done_gu + item);
            }
            __syncwarp();
            ready = item;
        }
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (un.gu) cs_stages<false, RS, 4, true>(acc, xp + 8 * t, nper, ring, rslot, issue);
        else cs_stages<true, RS, 4, true>(acc, xp + 8 * t, nper, ring, rslot, issue);
        const int next = __shfl_sync(0xffffffffu, grab, 0);   // the unit the issuer moved into
        if (lane == 0 && next < u_all) grab = W + atomicAdd(ctr, 1);

        // ---- this part's result; with s > 1 the last part to arrive finishes the tile
        bool finish = true;
        if (s > 1) {
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
                const int c = 2 * t + cc;
                if (c < cnt) {
                    float* q = un.gu ? gpart + (((long long)un.part * P + slot0 + c) * tiles_gu + un.tile) * 16
                                     : ypart + ((long long)un.part * P + slot0 + c) * H + 16 * un.tile;
                    q[g] = acc[cc];
                    q[g + 8] = acc[2 + cc];
                }
            }
            __syncwarp();
            int* red = (un.gu ? red_gu + item * tiles_gu : red_dn + item * tiles_dn) + un.tile;
            int last = 0;
            if (lane == 0) {
                fence_acq_rel_gpu();
                last = atomicAdd(red, 1) == s - 1;
                if (last) {
                    fence_acq_rel_gpu();
                    *red = 0;
                }
            }
            finish = __shfl_sync(0xffffffffu, last, 0);
            if (finish) {   // the s partials in part order, from 0 (own from registers)
                float v[4] = {0.f, 0.f, 0.f, 0.f};
                for (int pp = 0; pp < s; ++pp) {
#pragma unroll
                    for (int cc = 0; cc < 2; ++cc) {
                        const int c = 2 * t + cc;
                        float lo = acc[cc], hi = acc[2 + cc];
                        if (pp != un.part && c < cnt) {
                            const float* q = un.gu ? gpart + (((long long)pp * P + slot0 + c) * tiles_gu + un.tile) * 16
                                                   : ypart + ((long long)pp * P + slot0 + c) * H + 16 * un.tile;
                            lo = ld_cg_f32(q + g);
                            hi = ld_cg_f32(q + g + 8);
                        }
                        v[cc] += lo;
                        v[2 + cc] += hi;
                    }
                }
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[c] = v[c];
            }
        }
        if (finish) {
            if (un.gu) {
                store_h(hbuf, slot0, cnt, 0, I, un.tile, acc);
                __syncwarp();
                if (lane == 0) {
                    fence_acq_rel_gpu();
                    atomicAdd(done_gu + item, 1);
                }
            } else {
                store_weighted_y(it, slot0, cnt, 0, topk_w, Y, H, 16 * un.tile + g, acc[0], acc[1], acc[2], acc[3]);
                __syncwarp();
                int lastd = 0;
                if (lane == 0) {
                    fence_acq_rel_gpu();
                    lastd = atomicAdd(done_dn + un.tile, 1) == nitems - 1;
                    if (lastd) fence_acq_rel_gpu();
                }
                if (__shfl_sync(0xffffffffu, lastd, 0)) {   // every item has written the tile's rows
                    sum_rows_over_k(it.e, Y, out, M, topk, H, 16 * un.tile, 16);
                    __syncwarp();
                    if (lane == 0) done_dn[un.tile] = 0;
                }
            }
        }
        cur = next;
    }
    cp_async_wait<0>();
    __syncwarp();
    if (lane == 0) {
        __threadfence();
        if (atomicAdd(ctr_fin, 1) == W - 1) {   // last warp of the launch: every other warp is done with the counters
            ws[0] = 0;
            ws[1] = 0;
            for (int i = 0; i < FR_MAX_PAIRS; ++i) done_gu[i] = 0;
        }
    }
}

#define MOE_WSPLIT_KERNEL(NAME, RS)                                                                                \
    extern "C" __global__ void __launch_bounds__(128, 5) NAME(                                                     \
        const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn, const __nv_bfloat16* __restrict__ X,         \
        const int* __restrict__ ids, const float* __restrict__ topk_w, int M, int topk, int E, int H, int I,       \
        int sgu, int sdn, __nv_bfloat16* hbuf, float* gpart, float* ypart, float* Y, int* ws,                      \
        __nv_bfloat16* __restrict__ out) {                                                                         \
        __shared__ __align__(16) unsigned char s_ring[4 * RS * FR_STAGE_U4 * 16];                                   \
        moe_small_wsplit_body<RS>(Fgu, Fdn, X, ids, topk_w, M, topk, E, H, I, sgu, sdn, hbuf, gpart, ypart, Y, ws,  \
                                  out, s_ring);                                                                    \
    }
MOE_WSPLIT_KERNEL(moe_small_wsplit_r3, 3)
MOE_WSPLIT_KERNEL(moe_small_wsplit_r4, 4)

// ---------------------------------------------------------------------------------------------------------------
// The experts the ids touch, in increasing order, into s_list (the same list in every CTA: a ballot prefix per
// blockDim-wide chunk); returns their number. Every thread of the block must call it.
__device__ __forceinline__ int touched_experts(const int* __restrict__ ids, int P, int E, int* s_list) {
    __shared__ unsigned char s_flag[1024];
    __shared__ int s_wsum[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    for (int e = tid; e < E; e += blockDim.x) s_flag[e] = 0;
    __syncthreads();
    for (int p = tid; p < P; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < E) s_flag[e] = 1;
    }
    __syncthreads();
    int n = 0;
    for (int e0 = 0; e0 < E; e0 += blockDim.x) {
        const int e = e0 + tid;
        const bool f = e < E && s_flag[e];
        const unsigned int b = __ballot_sync(0xffffffffu, f);
        if (lane == 0) s_wsum[warp] = __popc(b);
        __syncthreads();
        int before = n;
        for (int w = 0; w < warp; ++w) before += s_wsum[w];
        if (f) s_list[before + __popc(b & ((1u << lane) - 1u))] = e;
        for (int w = 0; w < nw; ++w) n += s_wsum[w];
        __syncthreads();
    }
    return n;
}

// Streaming-read ceiling of the one-launch path (workbench/moe/ceiling.py): reads exactly the fragment bytes of
// every expert the ids touch (its gate_up stretch of ngu uint4, then its down stretch of ndn uint4; experts in
// increasing order) and nothing else: no compute, no dependency between the phases, no tasks. Each thread keeps U
// 16-byte streaming loads in flight, grid-stride over the touched experts' words as one index space. What it takes
// per call is the time a kernel that only streams those bytes, launched the same way, cannot beat.
// The words are XOR-reduced; sink[0] is written only where a thread's reduction equals `never`, so the loads stay.
// check != 0 (tests): each thread also XORs its reduction into sink[1] and adds its count of words read to sink[2].
// grid: any; block: a multiple of 32, at most 1024. ids: int32 [P], entries outside [0, E) ignored; E <= 1024;
// the host keeps (touched experts x (ngu + ndn) + grid x block x U) below 2^32.
// The read kernels' result: sink[0] is written only where a thread's XOR of what it read equals `never` (so the loads
// stay); check != 0 (tests): the XOR into sink[1] and the count of 16-byte words read added to sink[2].
__device__ __forceinline__ void sink_reads(unsigned int acc, unsigned int words, unsigned int never, int check,
                                           unsigned int* sink) {
    if (acc == never) sink[0] = acc;
    if (check) {
        atomicXor(sink + 1, acc);
        atomicAdd(sink + 2, words);
    }
}

template <int U>
__device__ __forceinline__ void stream_touched_body(const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn,
                                                    const int* __restrict__ ids, int P, int E, unsigned int ngu,
                                                    unsigned int ndn, unsigned int never, int check,
                                                    unsigned int* sink) {
    __shared__ int s_list[1024];
    const int tid = threadIdx.x;
    const int n = touched_experts(ids, P, E, s_list);
    const unsigned int per = ngu + ndn, total = (unsigned int)n * per;
    const unsigned int stride = gridDim.x * blockDim.x;
    unsigned int acc = 0, words = 0;
    for (unsigned int base = blockIdx.x * blockDim.x + tid; base < total; base += stride * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const unsigned int i = base + u * stride;
            v[u] = make_uint4(0u, 0u, 0u, 0u);
            if (i < total) {
                const unsigned int j = i / per, o = i - j * per;
                const unsigned int e = (unsigned int)s_list[j];
                v[u] = ld_stream16(o < ngu ? Fgu + (unsigned long long)e * ngu + o
                                           : Fdn + (unsigned long long)e * ndn + (o - ngu));
                ++words;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    sink_reads(acc, words, never, check, sink);
}

#define MOE_STREAM_TOUCHED_KERNEL(U)                                                                              \
    extern "C" __global__ void __launch_bounds__(1024) moe_stream_touched_u##U(                                   \
        const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn, const int* __restrict__ ids, int P, int E,  \
        unsigned int ngu, unsigned int ndn, unsigned int never, int check, unsigned int* sink) {                  \
        stream_touched_body<U>(Fgu, Fdn, ids, P, E, ngu, ndn, never, check, sink);                                    \
    }
MOE_STREAM_TOUCHED_KERNEL(2)
MOE_STREAM_TOUCHED_KERNEL(4)
MOE_STREAM_TOUCHED_KERNEL(8)

// Ring-read ceiling (workbench/moe/ceiling.py, stream_ring): the touched experts' bytes read the way the CTA-split
// kernel reads them and nothing more. Each warp streams 2304-byte stages through its own ring of RS shared-memory
// slots (cp.async 16 bytes per lane, four per lane plus one for lanes 0-15, RS - 1 stages in flight, one
// cp.async.wait_group and __syncwarp per stage: moe_small_ctasplit_body's issuer and stage loop) and XORs each landed
// stage's words from shared memory: no tasks, no block barriers, no epilogues, no math. Work comes in the kernel's
// units: nper_gu consecutive K stages of one gate_up tile (stages_gu / nper_gu parts per tile), nper_dn of one down
// tile, gate_up units then down units of each touched expert. rr != 0: unit u goes to warp u mod (warps of the grid),
// as the CTA-split kernel's static first tasks hand them out; rr == 0: every warp takes an equal contiguous share of
// the flat stage sequence (balanced to one stage). sync (diagnostic costs, rr only for bit 0): bit 0, lane 0 of a warp
// runs a fence.acq_rel.gpu after each unit's last stage (as an epilogue's publish would, with the ring's next stages in
// flight); bit 1, a block barrier after every nper_gu consumed stages (as many as every warp of the CTA reaches).
// block 128; P <= 128; sink as stream_touched's.
__device__ __forceinline__ unsigned long long ring_stage_u4(unsigned int e, unsigned int r, int tiles_gu,
                                                            int stages_gu, int nper_gu, int tiles_dn, int stages_dn,
                                                            int nper_dn, bool& gu) {
    // stage r (unit-major) of expert e -> uint4 offset of its 144 words in Fgu (gu) or Fdn
    const unsigned int per_gu = (unsigned int)(tiles_gu * stages_gu);
    gu = r < per_gu;
    const int tiles = gu ? tiles_gu : tiles_dn, stages = gu ? stages_gu : stages_dn, nper = gu ? nper_gu : nper_dn;
    const unsigned int q = gu ? r : r - per_gu, unit = q / nper, k = q - unit * nper, parts = stages / nper;
    const unsigned int tile = unit / parts, part = unit - tile * parts;
    return ((unsigned long long)(e * stages + part * nper + k) * tiles + tile) * FR_STAGE_U4;
}

template <int RS>
__device__ __forceinline__ void stream_ring_body(const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn,
                                                 const int* __restrict__ ids, int P, int E, int tiles_gu,
                                                 int stages_gu, int nper_gu, int tiles_dn, int stages_dn,
                                                 int nper_dn, int rr, int sync, unsigned int never, int check,
                                                 unsigned int* sink, unsigned char* s_ring) {
    __shared__ int s_list[FR_MAX_PAIRS];   // P <= FR_MAX_PAIRS (the host checks)
    __shared__ unsigned int s_left[4];
    const int n = touched_experts(ids, P, E, s_list);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned int per_gu = tiles_gu * stages_gu, per_e = per_gu + tiles_dn * stages_dn;
    const unsigned int ugu = tiles_gu * (stages_gu / nper_gu), per_u = ugu + tiles_dn * (stages_dn / nper_dn);
    const unsigned int W = gridDim.x * (blockDim.x >> 5), wid = blockIdx.x * (blockDim.x >> 5) + warp;
    // this warp's work: rr, units wid, wid + W, ... (stage k of the current unit); else flat stages [f, f1)
    unsigned int f = (unsigned int)((unsigned long long)n * per_e * wid / W);
    const unsigned int f1 = (unsigned int)((unsigned long long)n * per_e * (wid + 1) / W);
    unsigned int u = wid, k = 0, left = 0;
    if (rr) {
        for (unsigned int v = wid; v < (unsigned int)n * per_u; v += W) left += (v % per_u) < ugu ? nper_gu : nper_dn;
    } else {
        left = f1 - f;
    }
    // sync & 2: a block barrier after every nper_gu consumed stages, as many as every warp of the CTA reaches
    unsigned int bars = 0;
    if (sync & 2) {
        if (lane == 0) s_left[warp] = left;
        __syncthreads();
        bars = min(min(s_left[0], s_left[1]), min(s_left[2], s_left[3])) / nper_gu;
    }
    unsigned int uleft = 0;   // sync & 1: stages left in the unit being consumed (rr order)
    unsigned char* ring = s_ring + warp * (RS * FR_STAGE_U4 * 16);
    const unsigned int dst0 = (unsigned int)__cvta_generic_to_shared(ring) + lane * 16;
    unsigned int ileft = left, wslot = 0, rslot = 0, cu = wid;
    auto issue = [&]() {
        if (ileft > 0) {
            unsigned int e, r;
            if (rr) {
                const unsigned int j = u / per_u, lu = u - j * per_u;
                e = (unsigned int)s_list[j];
                r = lu < ugu ? lu * nper_gu + k : per_gu + (lu - ugu) * nper_dn + k;
                if (++k == (lu < ugu ? (unsigned int)nper_gu : (unsigned int)nper_dn)) {
                    k = 0;
                    u += W;
                }
            } else {
                const unsigned int j = f / per_e;
                e = (unsigned int)s_list[j];
                r = f - j * per_e;
                ++f;
            }
            bool gu;
            const unsigned long long off = ring_stage_u4(e, r, tiles_gu, stages_gu, nper_gu, tiles_dn, stages_dn,
                                                         nper_dn, gu);
            const uint4* src = (gu ? Fgu : Fdn) + off + lane;
            const unsigned int d = dst0 + wslot;
            cp_async_stage(d, src, lane < 16);
            --ileft;
        }
        cp_async_commit();
        wslot = ring_next<RS>(wslot);
    };
#pragma unroll
    for (int i = 0; i < RS - 1; ++i) issue();
    unsigned int acc = 0, words = 0;
    for (unsigned int c = 0; c < left; ++c) {
        cp_async_wait<RS - 2>();
        __syncwarp();
        issue();
        const uint4* st = reinterpret_cast<const uint4*>(ring + rslot);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const uint4 v = st[q * 32 + lane];
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
        words += 4;
        if (lane < 16) {
            const uint4 v = st[128 + lane];
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
            ++words;
        }
        rslot = ring_next<RS>(rslot);
        if ((sync & 1) && rr) {   // a unit's last stage consumed: publish as an epilogue would (lane 0's fence)
            if (uleft == 0) uleft = (cu % per_u) < ugu ? nper_gu : nper_dn;
            if (--uleft == 0) {
                cu += W;
                __syncwarp();
                if (lane == 0) fence_acq_rel_gpu();
                __syncwarp();
            }
        }
        if ((sync & 2) && bars > 0 && (c + 1) % nper_gu == 0) {
            --bars;
            __syncthreads();
        }
    }
    cp_async_wait<0>();
    sink_reads(acc, words, never, check, sink);
}

#define MOE_STREAM_RING_KERNEL(RS)                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) moe_stream_ring_rs##RS(                                      \
        const uint4* __restrict__ Fgu, const uint4* __restrict__ Fdn, const int* __restrict__ ids, int P, int E,  \
        int tiles_gu, int stages_gu, int nper_gu, int tiles_dn, int stages_dn, int nper_dn, int rr, int sync,    \
        unsigned int never, int check, unsigned int* sink) {                                                     \
        __shared__ __align__(16) unsigned char s_ring[4 * RS * FR_STAGE_U4 * 16];                                 \
        stream_ring_body<RS>(Fgu, Fdn, ids, P, E, tiles_gu, stages_gu, nper_gu, tiles_dn, stages_dn, nper_dn, rr,  \
                             sync, never, check, sink, s_ring);                                                   \
    }
MOE_STREAM_RING_KERNEL(3)
MOE_STREAM_RING_KERNEL(4)


// ===================================================================================================
// Phased form (run 28; fused variants "phased_r3" / "phased_r4"): the one-launch kernels' work in TWO launches
// with no task machinery, for M = 1-2 where every one-launch form stays below 80% of the copy.
//
// Why: run 24's decomposition at M = 1 in-graph left ~7 us between the CTA-split kernel with its maths, h waits and
// activation loads compiled out and a kernel that only streams the same bytes through the same per-warp rings
// (moe_stream_ring); what remains there is the machinery (task counter, per-task barrier and epilogue, fences,
// returning atomics, last-arriver sums). Here the only synchronisation is the launch boundary and one block
// barrier per down tile.
//   moe_small_phased_gu_r<RS>: every CTA runs small_prologue; warp gw of nw takes the (item, tile) tasks gw,
//     gw + nw, ... (item-major as moe_small_fused, so warps running together read neighbouring tiles of one
//     stage), each a whole tile's K through its RS-stage ring (frag_gemm, activations a whole stage ahead), and
//     stores h = SiLU(gate) * up (bf16 [P, I]). No counter, fence or atomic.
//   moe_small_phased_dn_r<RS>: CTA b takes tiles b, b + gridDim.x, ... of 16 rows of H; its warp w the items
//     w, w + 4, ..., a whole item's K (I) each; w_pair * y goes to shared memory s_y[pair][16]; after a block
//     barrier, out[m, tile rows] = the sum over k ascending, in one fp32 chain from 0 (as sum_rows_over_k), NaN for a
//     token with an invalid id. The arithmetic is moe_small_fused's (whole-K tiles, the same fragment steps and
//     the same order of sums), so the outputs are bit-identical to version 3's.
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

// K-split gate/up of the phased form (run 29f; fused variant "phased_r3_pdl_k4"): a CTA per (item, tile) task, its
// four warps each a quarter of K (warp w: stages [w nsup / 4, (w + 1) nsup / 4), 7 of Kimi's 28), then the four
// partial sums added in shared memory in a fixed order (warp 0 + 1 + 2 + 3) and h = SiLU(gate) * up stored by warp 0.
// Why: at M = 2 the whole-K form has 4096 tasks on 2640 warps, a second round half full (Nsight: the gate/up SMs
// idle a quarter of the kernel's cycles); tasks a quarter as long leave a shorter partial round. Not bit-identical to
// version 3 (its sum over K runs in one chain); deterministic. grid: min(resident CTAs, tasks bound), striding.
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

// GU / DN: the two kernels' names (the test of registered kernels looks for them in this file); GUBODY: the gate/up
// form (phased_gate_up, or phased_gate_up_k4: run 29f's K-split); RS / DNRS: GU's / DN's ring stages; PDL:
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
MOE_PHASED_KERNELS(moe_small_phased_gu_r3, moe_small_phased_dn_r3, phased_gate_up, 3, 3, false)
MOE_PHASED_KERNELS(moe_small_phased_gu_r4, moe_small_phased_dn_r4, phased_gate_up, 4, 4, false)
MOE_PHASED_KERNELS(moe_small_phased_gu_r3p, moe_small_phased_dn_r3p, phased_gate_up, 3, 3, true)
// run 29f: the K-split gate/up (phased_gate_up_k4) with the PDL down kernel
MOE_PHASED_KERNELS(moe_small_phased_gu_r3p_k4, moe_small_phased_dn_r3p_k4, phased_gate_up_k4, 3, 3, true)
// run 33: two-stage rings (one stage in flight while a stage is computed) in both launches, in the down launch only, in
// the gate/up launch only (run 28e's deeper rings were slower; this is the other side)
MOE_PHASED_KERNELS(moe_small_phased_gu_r2p, moe_small_phased_dn_r2p, phased_gate_up, 2, 2, true)
MOE_PHASED_KERNELS(moe_small_phased_gu_r3p_dn2, moe_small_phased_dn_r3p_dn2, phased_gate_up, 3, 2, true)
MOE_PHASED_KERNELS(moe_small_phased_gu_r3p_gu2, moe_small_phased_dn_r3p_gu2, phased_gate_up, 2, 3, true)
// (run 28c's phased_r3_pdl_even, gate/up warps in full rounds, was slower at M = 2-4: reverted, in git history at
// 475fe6f; moe_small_even*.json; run 28d's phased_r3_pdl_seq, each warp's tasks and items through one ring, was
// slower at M = 1-8: reverted, in git history at 804159d; moe_small_seq*.json; run 28e's 4-stage PDL pairs,
// phased_r4_pdl and phased_r3_pdl_dn4, were slower at M = 1-2: reverted, in git history at 6fe5fd0; moe_small_dn4*.json;
// run 29's phased_r3_pdl_c2, the down launch as clusters of two CTAs per tile writing into rank 0's shared memory,
// bit-identical but its down launch ~4 us slower at M = 1 (896 CTAs in 1.4 waves, 8-stage chains): reverted, in git
// history at 00df147; moe_small_c2*.json; run 29b's launch bounds (128, 6) for gate/up (_g6, 79 registers) and also
// (128, 5) for down (_g6d5, 96): _g6 level with phased_r3_pdl at M = 1-2 and behind at M = 4, _g6d5 behind
// everywhere: reverted, in git history at 5593ac9; moe_small_g6*.json; run 29e's _cm, frag_step's four bf16x2
// subtractions a word replaced by a second mma with A = -136 on the same accumulator: 5-17 points slower (two dependent
// mmas a chunk lengthen the chain), reverted, in git history at 7de299f; moe_small_cm*.json; run 30's L2 prefetches of
// the down weights (cp.async.bulk.prefetch.L2) by the gate/up warps at their end (_pfg), by each down item at its start
// (_pfd), both (_pfgd, _k4_pfgd): 3-10 points slower at M = 1, the down launch alone ~5 us slower with _pfd: reverted,
// in git history at 4e1a5c6; moe_small_pf*.json; run 30b's _ei / _k4_ei, each gate/up warp's first stages issued before
// the CTA's prologue (the item table by warp shuffles): level or behind at M = 1-4: reverted, in git history at
// aded977; moe_small_ei*.json; run 31's _fd / _fgd / _fg / _k4_fd, the dequantisation's -136 folded into one mma per
// stage with the group sums as bf16 hi + lo (gate/up: a per-CTA table of X's sums; down: h's partial sums stored by
// gate/up): slower at every M, the folded down launch alone slower in-graph at M = 1 and 16: reverted, in git history
// at d11ae6f; moe_small_fo*.json; run 32's _ks6 / _ks7 / _ks6a, the K-span gate/up (each CTA T consecutive tasks, its
// warps equal quarters of their stages; ks6a stage-aligned at T = 3): slower at every M, the gate/up launch alone
// 4.4-10.5 us slower in-graph at M = 1: reverted, in git history at 40fdae4; moe_small_ks*.json)
