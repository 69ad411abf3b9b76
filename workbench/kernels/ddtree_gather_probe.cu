// Gather probe for the tree-verify attention kernel (diagnostic, not used by verify_attention).
//
// The verify kernel (ddtree_verify.cu, ddtree_verify_wgmma_bf16) gathers every 64-key tile of its chunk
// through the prefix slot indices (page size 1: each key row is its own 1152-byte row somewhere in the
// KV cache) into shared memory, and the whole grid reads each row once per row block (5 times at H = 8,
// 33 times at H = 64), mostly from L2. These kernels do only that gather, at the verify kernel's grid
// (row blocks x chunks, 256 threads, one CTA per SM), by three methods and at two depths, so that the
// gather's rate can be compared between the ways of issuing it:
//
//   METHOD 0  cp.async, 16 bytes per thread per copy, 4 threads per key, 18 copies per thread per tile
//             (the verify kernel's gather), into the 128-byte-swizzled [64 x 576] layout wgmma reads.
//   METHOD 1  the bulk tensor copy (TMA): a 2-D tensor map over the KV cache [S rows x 576], box of
//             64 columns x 1 row, 128-byte swizzle; 9 copies per key row (one per 64-column block),
//             issued by the lanes of warp 0, completing on the stage's mbarrier. Destination: the same
//             swizzled layout as METHOD 0 (the swizzle is taken from the shared-memory address bits,
//             which the check mode verifies).
//   METHOD 2  the non-tensor bulk copy: ONE 1152-byte copy per key row (warp 0's lanes), completing on
//             the stage's mbarrier, into a plain row-major [64 x 1152 B] stage. That layout is not one
//             wgmma can read as the score operand; it measures what one request per row costs.
//
//   DEPTH     tiles in flight while a tile is consumed: 1 is the verify kernel's schedule (two stages:
//             wait for tile it, barrier, issue tile it + 1), 2 uses three stages (no room for Q then).
//
// With check != 0 every thread compares its share of each landed tile with the KV rows in global
// memory (16 bytes at a time, at the layout of the method) and adds its mismatches to *err.
//
// Kernels (extern "C"): ddtree_gather_m<METHOD>_d<DEPTH>, grid (row blocks, chunks), block 256, dynamic
// shared memory (DEPTH + 1) * 73728 + 1024 (alignment) bytes.
// Arguments: kv [S, kv_stride] bf16, kv_stride (elements), slots [P] int64, P, chunk_len (keys per CTA),
// tmap (device pointer to a 128-byte CUtensorMap, METHOD 1 only), check, err [1] uint32.

typedef unsigned short bf16_t;
typedef unsigned int u32;

#define GP_KEYS 64
#define GP_ROW_BYTES 1152
#define GP_TILE_BYTES (GP_KEYS * GP_ROW_BYTES)  // 73728

__device__ __forceinline__ u32 gp_smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// byte offset of 16-byte chunk c (0..71) of row r (0..63) in the swizzled tile (as ddtree_verify.cu's sw128)
__device__ __forceinline__ u32 gp_sw128(int r, int c) {
    return (u32)((c >> 3) * 8192 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ void gp_cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void gp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gp_wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void gp_mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void gp_mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void gp_mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void gp_tma_row(u32 dst, const void* tmap, int col, int row, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(dst), "l"(tmap), "r"(col), "r"(row), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void gp_bulk_row(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

template <int METHOD, int DEPTH>
__device__ __forceinline__ void gather_body(const bf16_t* __restrict__ kv, long long kv_stride,
                                            const long long* __restrict__ slots, int P, int chunk_len,
                                            const void* tmap, int check, u32* err) {
    constexpr int STAGES = DEPTH + 1;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bars[STAGES];
    const u32 raw = gp_smem_u32(smem);
    const u32 base = raw + ((1024u - (raw & 1023u)) & 1023u);   // 1024-byte aligned (the swizzle's period)
    const unsigned char* sbase = smem + (base - raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int key_begin = blockIdx.y * chunk_len;
    const int key_end = min(key_begin + chunk_len, P);
    if (key_begin >= key_end) return;
    const int ntiles = (key_end - key_begin + GP_KEYS - 1) / GP_KEYS;

    if (METHOD != 0) {
        if (tid == 0) {
            for (int s = 0; s < STAGES; ++s) gp_mbar_init(gp_smem_u32(&bars[s]), 1);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
    }

    // issue tile `it` into stage it % STAGES (METHOD 0: every thread; else warp 0)
    auto issue = [&](int it) {
        const u32 st = base + (u32)(it % STAGES) * GP_TILE_BYTES;
        const int k0 = key_begin + it * GP_KEYS;
        if (METHOD == 0) {
            const int key = k0 + (tid >> 2);
            if (it < ntiles && key < key_end) {
                const bf16_t* src = kv + slots[key] * kv_stride;
#pragma unroll
                for (int i = 0; i < 18; ++i) {
                    const int c = (tid & 3) + 4 * i;
                    gp_cp_async16(st + gp_sw128(tid >> 2, c), src + c * 8);
                }
            }
            gp_commit();   // an empty group past the last tile keeps the group count
        } else if (warp == 0 && it < ntiles) {
            const u32 bar = gp_smem_u32(&bars[it % STAGES]);
            const int nrows = min(GP_KEYS, key_end - k0);
            if (lane == 0) gp_mbar_expect_tx(bar, (u32)nrows * GP_ROW_BYTES);
            __syncwarp();
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = lane + 32 * h;
                if (r < nrows) {
                    const long long slot = slots[k0 + r];
                    if (METHOD == 1) {
#pragma unroll
                        for (int cb = 0; cb < 9; ++cb) gp_tma_row(st + cb * 8192 + r * 128, tmap, cb * 64, (int)slot, bar);
                    } else {
                        gp_bulk_row(st + r * GP_ROW_BYTES, kv + slot * kv_stride, GP_ROW_BYTES, bar);
                    }
                }
            }
        }
    };

    for (int d = 0; d < DEPTH; ++d) issue(d);
    u32 bad = 0;
    for (int it = 0; it < ntiles; ++it) {
        if (METHOD == 0) gp_wait_group<DEPTH - 1>();
        else gp_mbar_wait(gp_smem_u32(&bars[it % STAGES]), (u32)((it / STAGES) & 1));
        __syncthreads();   // tile `it` landed for every thread; stage (it + DEPTH) % STAGES is free
        if (check) {
            const int key = key_begin + it * GP_KEYS + (tid >> 2);
            if (key < key_end) {
                const uint4* g = reinterpret_cast<const uint4*>(kv + slots[key] * kv_stride);
                const unsigned char* st = sbase + (size_t)(it % STAGES) * GP_TILE_BYTES;
                for (int i = 0; i < 18; ++i) {
                    const int c = (tid & 3) + 4 * i;
                    const u32 off = METHOD == 2 ? (u32)((tid >> 2) * GP_ROW_BYTES + c * 16) : gp_sw128(tid >> 2, c);
                    const uint4 s = *reinterpret_cast<const uint4*>(st + off);
                    const uint4 v = g[c];
                    bad += (s.x != v.x) | (s.y != v.y) | (s.z != v.z) | (s.w != v.w);
                }
            }
            __syncthreads();   // every check of this stage done before it is refilled
        }
        issue(it + DEPTH);
    }
    if (METHOD == 0) gp_wait_group<0>();
    if (check && bad) atomicAdd(err, bad);
}

#define GP_KERNEL(M, D)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 1) ddtree_gather_m##M##_d##D(                              \
        const bf16_t* __restrict__ kv, long long kv_stride, const long long* __restrict__ slots, int P,          \
        int chunk_len, const void* tmap, int check, u32* err) {                                                   \
        gather_body<M, D>(kv, kv_stride, slots, P, chunk_len, tmap, check, err);                                  \
    }

GP_KERNEL(0, 1)
GP_KERNEL(0, 2)
GP_KERNEL(1, 1)
GP_KERNEL(1, 2)
GP_KERNEL(2, 1)
GP_KERNEL(2, 2)
