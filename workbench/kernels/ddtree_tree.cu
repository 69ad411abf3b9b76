// DDTree tree kernels: best-first tree build, visibility, greedy accept, KV commit.
//
// Tree build: two kernels with one argument list (DDT_BUILD_PARAMS) and one output, each
// bit-exact with workbench.ddtree.reference.build_tree, ties included; the dispatch
// (data/dispatch/*.json, tree_build) picks "small" up to 32 non-root nodes, "heap" above:
// ddtree_build_small     n - 1 <= 32: one warp per request, one lane per tree node holding that
//                        node's pending child; a pop is a warp arg-max (__reduce_max_sync).
// ddtree_build           one thread block per request; thread 0 runs a binary heap in shared
//                        memory (float64 scores, order (-score, rank path)).
// (The warp-reduction builder, the sorted-list small builder and the branchy small builder
// were slower; they are in git at 2c78290, papers/ddtree_kernels.md lists them.)
// ddtree_visibility one thread per (request, i, j): j is i or an ancestor of i.
// ddtree_accept     one warp per request: greedy longest matching root path.
// ddtree_commit_scattered  keep slots (accepted path order) and free slots.
// ddtree_commit_compact    move accepted KV rows to contiguous slots, in place.
//
// Integer tensors are int64 ("long long"); no includes (NVRTC and nvcc).

#define DDT_FULL_MASK 0xffffffffu

// ---------------------------------------------------------------------------------------------
// Tree build: shared pieces
// ---------------------------------------------------------------------------------------------

// The argument list of both build kernels. Request b = blockIdx.x for the heap kernel; B bounds
// the warp-per-request kernel.
#define DDT_BUILD_PARAMS                                                                       \
    const float* __restrict__ logprobs,        /* [B, L, Kin] */                               \
    const long long* __restrict__ token_ids,   /* [B, L, Kin] */                               \
    const long long* __restrict__ root_tokens, /* [B] or null (then root_default) */           \
    long long root_default, int B, int L, int Kin, int K, int n,                               \
    long long* __restrict__ out_tokens,        /* [B, n] */                                    \
    long long* __restrict__ out_parents,       /* [B, n] */                                    \
    long long* __restrict__ out_depths,        /* [B, n] */                                    \
    long long* __restrict__ out_ranks,         /* [B, n] */                                    \
    float* __restrict__ out_scores             /* [B, n] */

#define DDT_OUT_ARGS out_tokens, out_parents, out_depths, out_ranks, out_scores

// Rank path of a heap entry = rank path of node `p` followed by rank `r`.
// Lexicographic "less than" of two entries' rank paths (Python tuple order),
// walking parent pointers of popped nodes (depth <= 32).
__device__ __forceinline__ bool ddt_path_less(int pa, int ra, int pb, int rb,
                                              const int* npar, const int* nrank,
                                              const int* ndep) {
    if (pa == pb) return ra < rb;
    int da = ndep[pa], db = ndep[pb];
    const bool b_longer = db > da;
    while (da > db) { ra = nrank[pa]; pa = npar[pa]; --da; }
    while (db > da) { rb = nrank[pb]; pb = npar[pb]; --db; }
    while (pa != pb) {
        ra = nrank[pa]; pa = npar[pa];
        rb = nrank[pb]; pb = npar[pb];
    }
    if (ra != rb) return ra < rb;
    return b_longer;  // one path is a prefix of the other: the shorter is smaller
}

// Entry order "a comes out before b": higher score, then smaller rank path.
__device__ __forceinline__ bool ddt_before(double sa, int pa, int ra, double sb, int pb, int rb,
                                           const int* npar, const int* nrank, const int* ndep) {
    if (sa != sb) return sa > sb;
    return ddt_path_less(pa, ra, pb, rb, npar, nrank, ndep);
}

__device__ __forceinline__ long long ddt_root(const long long* root_tokens, long long root_default,
                                              int b) {
    return root_tokens ? root_tokens[b] : root_default;
}

// lps[d * K + r] = lpb[d * Kin + r] (and sids likewise when sids is not null), d < L, r < K;
// thread tid of nthreads.
__device__ __forceinline__ void ddt_stage_rows(const float* __restrict__ lpb,
                                               const long long* __restrict__ idb, int L, int Kin,
                                               int K, float* lps, long long* sids, int tid,
                                               int nthreads) {
    for (int e = tid; e < L * K; e += nthreads) {
        const int d = e / K, r = e - d * K;
        lps[e] = lpb[(long long)d * Kin + r];
        if (sids) sids[e] = idb[(long long)d * Kin + r];
    }
}

// Shared layout of the heap kernel (cap frontier slots, n nodes):
//   double s[cap] | float lps[L*K] | int k[cap] | int npar[n] | int nrank[n] | int ndep[n]
struct DdtFrontierSmem {
    double* s; float* lps; int* k; int* npar; int* nrank; int* ndep;
};

__device__ __forceinline__ DdtFrontierSmem ddt_frontier_smem(double* base, int cap, int L, int K,
                                                             int n) {
    DdtFrontierSmem m;
    m.s = base;
    m.lps = reinterpret_cast<float*>(base + cap);
    m.k = reinterpret_cast<int*>(m.lps + L * K);
    m.npar = m.k + cap;
    m.nrank = m.npar + n;
    m.ndep = m.nrank + n;
    return m;
}

// Prologue of the one-block-per-request kernel: stage request b's rows (its token ids too when
// sids is not null), node 0 = the root in the node arrays, block barrier. Returns the request's
// token ids in global memory.
__device__ __forceinline__ const long long* ddt_block_prologue(
        const float* __restrict__ logprobs, const long long* __restrict__ token_ids, int b, int L,
        int Kin, int K, float* lps, long long* sids, int* npar, int* nrank, int* ndep) {
    const long long off = (long long)b * L * Kin;
    ddt_stage_rows(logprobs + off, token_ids + off, L, Kin, K, lps, sids, threadIdx.x, blockDim.x);
    if (threadIdx.x == 0) { npar[0] = -1; nrank[0] = -1; ndep[0] = 0; }
    __syncthreads();
    return token_ids + off;
}

// One output node: node i of request b (root when i == 0), token of a node at depth d and
// rank r = ids[(d - 1) * ids_stride + r]. write_score: also its score (else written earlier).
__device__ __forceinline__ void ddt_put_node(long long* out_tokens, long long* out_parents,
                                             long long* out_depths, long long* out_ranks,
                                             float* out_scores, long long o, int i, int parent,
                                             int d, int r, float score, bool write_score,
                                             const long long* ids, int ids_stride,
                                             long long root) {
    if (i == 0) {
        out_tokens[o] = root; out_parents[o] = -1; out_depths[o] = 0;
        out_ranks[o] = -1; out_scores[o] = 0.0f;
    } else {
        out_tokens[o] = ids[(d - 1) * ids_stride + r];
        out_parents[o] = parent; out_depths[o] = d; out_ranks[o] = r;
        if (write_score) out_scores[o] = score;
    }
}

// Epilogue of the kernel that keeps the nodes in shared arrays (scores already written).
__device__ __forceinline__ void ddt_write_nodes(long long* out_tokens, long long* out_parents,
                                                long long* out_depths, long long* out_ranks,
                                                float* out_scores, int b, int n,
                                                const int* npar, const int* nrank,
                                                const int* ndep, const long long* ids,
                                                int ids_stride, long long root, int tid,
                                                int nthreads) {
    for (int i = tid; i < n; i += nthreads)
        ddt_put_node(DDT_OUT_ARGS, (long long)b * n + i, i, npar[i], ndep[i], nrank[i], 0.0f,
                     false, ids, ids_stride, root);
}

// ---------------------------------------------------------------------------------------------
// ddtree_build: binary heap run by one thread; the entry being sifted stays in registers (hole
// sifting). Entries packed as parent << 16 | rank.
// Shared memory: ddt_frontier_smem with cap = n heap slots (K = min(budget, K_in)).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ bool ddt_hk_before(double sa, int ka, double sb, int kb,
                                              const int* npar, const int* nrank, const int* ndep) {
    return ddt_before(sa, ka >> 16, ka & 0xffff, sb, kb >> 16, kb & 0xffff, npar, nrank, ndep);
}

extern "C" __global__ void ddtree_build(DDT_BUILD_PARAMS) {
    extern __shared__ double ddt_smem[];
    const int b = blockIdx.x;
    const DdtFrontierSmem m = ddt_frontier_smem(ddt_smem, n, L, K, n);
    double* hs = m.s;
    float* lps = m.lps;
    int* hk = m.k;
    int *npar = m.npar, *nrank = m.nrank, *ndep = m.ndep;

    const long long* idb = ddt_block_prologue(logprobs, token_ids, b, L, Kin, K, lps, nullptr,
                                              npar, nrank, ndep);
    if (threadIdx.x == 0) {
        hs[0] = (double)lps[0]; hk[0] = 0;
        int size = 1;
        for (int i = 1; i < n; ++i) {
            // pop the top entry as node i
            const double score = hs[0];
            const int pk = hk[0];
            const int parent = pk >> 16, r = pk & 0xffff;
            const int d = ndep[parent] + 1;
            npar[i] = parent; nrank[i] = r; ndep[i] = d;
            out_scores[(long long)b * n + i] = (float)score;
            const bool last = (i == n - 1);
            // the top is replaced by the next sibling, or by the last entry
            double xs = 0.0;
            int xk = 0;
            bool sift = true;
            if (!last && r + 1 < K) {
                xs = (score - (double)lps[(d - 1) * K + r]) + (double)lps[(d - 1) * K + r + 1];
                xk = (parent << 16) | (r + 1);
            } else {
                --size;
                if (size > 0) { xs = hs[size]; xk = hk[size]; } else { sift = false; }
            }
            if (sift) {
                int pos = 0;
                while (true) {
                    const int lc = 2 * pos + 1;
                    if (lc >= size) break;
                    double cs = hs[lc];
                    int ck = hk[lc], best = lc;
                    const int rc = lc + 1;
                    if (rc < size) {
                        const double rs = hs[rc];
                        const int rk = hk[rc];
                        if (ddt_hk_before(rs, rk, cs, ck, npar, nrank, ndep)) { cs = rs; ck = rk; best = rc; }
                    }
                    if (!ddt_hk_before(cs, ck, xs, xk, npar, nrank, ndep)) break;
                    hs[pos] = cs; hk[pos] = ck;
                    pos = best;
                }
                hs[pos] = xs; hk[pos] = xk;
            }
            // push the first child
            if (!last && d < L) {
                const double ys = score + (double)lps[d * K];
                const int yk = i << 16;
                int c = size++;
                while (c > 0) {
                    const int up = (c - 1) >> 1;
                    const double us = hs[up];
                    const int uk = hk[up];
                    if (!ddt_hk_before(ys, yk, us, uk, npar, nrank, ndep)) break;
                    hs[c] = us; hk[c] = uk;
                    c = up;
                }
                hs[c] = ys; hk[c] = yk;
            }
        }
    }
    __syncthreads();
    ddt_write_nodes(DDT_OUT_ARGS, b, n, npar, nrank, ndep, idb, Kin,
                    ddt_root(root_tokens, root_default, b), threadIdx.x, blockDim.x);
}

// ---------------------------------------------------------------------------------------------
// ddtree_build_small: n - 1 <= 32 (so K <= 32), one warp per request, blockDim.x / 32 requests
// per block.
//
// Every node p popped so far has at most one entry in the frontier: its next child not yet
// popped (the first child is pushed when p is popped, the next sibling when a child is popped).
// So lane p holds node p's pending child (rank kr, score cs; the last popped node never needs
// one, so lanes 0..n-2 suffice), and a pop is a warp arg-max over the lanes under the order
// (higher score, then smaller rank path):
//   key = the score as an order-preserving unsigned 64-bit integer (0: no pending child);
//   one __reduce_max_sync on the high 32 bits and a ballot of the lanes at the maximum; only
//   when several lanes share it, a second reduction on the low 32 bits; only when several
//   lanes hold the very same score, the rank paths decide (walk of node arrays in shared
//   memory), so the tie order is the reference's.
// Every lane precomputes, branch-free and while the reduction is in flight, its pending
// child's next sibling (score, key) and first child (score, key); a pop then is the
// reduction, one ballot, one round of shuffles from the winning lane, and selects: the winner
// takes its precomputed next sibling, lane i (the new node i) takes over its first child.
// Log-probs and token ids are staged with cp.async (the ids land while the pops run); lane j
// keeps node j + 1 in registers and every output is written once, at the end.
// Shared per warp (ddt_small_words long longs):
//   long long sids[L*K] | float lps[L*K] | int npar[33] | int nrank[33] | int ndep[33]
// ---------------------------------------------------------------------------------------------
#define DDT_SMALL_NODES 33

__device__ __forceinline__ int ddt_small_words(int L, int K) {
    return (12 * L * K + 3 * DDT_SMALL_NODES * 4 + 7) / 8;
}

__device__ __forceinline__ unsigned ddt_smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void ddt_cp_async4(void* smem, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(ddt_smem_addr(smem)), "l"(gmem)
                 : "memory");
}

__device__ __forceinline__ void ddt_cp_async8(void* smem, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(ddt_smem_addr(smem)), "l"(gmem)
                 : "memory");
}

__device__ __forceinline__ void ddt_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// float at element e of the shared array whose 32-bit shared address is base
__device__ __forceinline__ float ddt_lds(unsigned base, int e) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(base + 4u * (unsigned)e));
    return v;
}

// Order-preserving key of a float64 score (not NaN): a > b  <=>  key(a) > key(b); -0.0 and
// +0.0 (equal scores) get one key. Every finite score has a key with a nonzero high word.
__device__ __forceinline__ void ddt_key(double s, unsigned& hi, unsigned& lo) {
    const unsigned long long u = (unsigned long long)__double_as_longlong(s == 0.0 ? 0.0 : s);
    const unsigned long long m = (unsigned long long)(((long long)u) >> 63);
    const unsigned long long k = u ^ (m | 0x8000000000000000ull);
    hi = (unsigned)(k >> 32);
    lo = (unsigned)k;
}

// Among the candidate lanes `cand` (several, warp-uniform; equal scores), the one whose pending
// child (node = lane, rank = kr) has the smallest rank path. Every lane computes the same.
__device__ __forceinline__ int ddt_tie_winner(unsigned cand, int kr, const int* npar,
                                              const int* nrank, const int* ndep) {
    int best = __ffs(cand) - 1;
    cand &= cand - 1u;
    int kb = __shfl_sync(DDT_FULL_MASK, kr, best);
    while (cand) {
        const int q = __ffs(cand) - 1;
        cand &= cand - 1u;
        const int kq = __shfl_sync(DDT_FULL_MASK, kr, q);
        if (ddt_path_less(q, kq, best, kb, npar, nrank, ndep)) { best = q; kb = kq; }
    }
    return best;
}

__device__ __forceinline__ void ddt_build_small(DDT_BUILD_PARAMS) {
    extern __shared__ long long ddt_lane_smem[];
    const int warp = threadIdx.x >> 5;
    int lane = threadIdx.x & 31;
    const int b = blockIdx.x * (blockDim.x >> 5) + warp;
    if (b >= B) return;  // the whole warp leaves; no block-wide barrier follows
    const int LK = L * K;
    // lane and the warp's base through a shuffle: ptxas keeps them in registers instead of
    // recomputing them from %tid inside the pop loop, where they feed the log-prob loads
    lane = __shfl_xor_sync(DDT_FULL_MASK, lane, 0);
    const int wbase = __shfl_xor_sync(DDT_FULL_MASK, warp * ddt_small_words(L, K), 0);
    long long* sids = ddt_lane_smem + wbase;
    float* lps = reinterpret_cast<float*>(sids + LK);
    int* npar = reinterpret_cast<int*>(lps + LK);
    int* nrank = npar + DDT_SMALL_NODES;
    int* ndep = nrank + DDT_SMALL_NODES;

    // stage: log-probs (group 0), then token ids (group 1, waited for only at the end)
    const float* lpb = logprobs + (long long)b * L * Kin;
    const long long* idb = token_ids + (long long)b * L * Kin;
    if (lane < K) {
        for (int d = 0; d < L; ++d) ddt_cp_async4(lps + d * K + lane, lpb + (long long)d * Kin + lane);
    }
    ddt_cp_async_commit();
    if (lane < K) {
        for (int d = 0; d < L; ++d) ddt_cp_async8(sids + d * K + lane, idb + (long long)d * Kin + lane);
    }
    ddt_cp_async_commit();
    const long long root = ddt_root(root_tokens, root_default, b);
    if (lane == 0) { npar[0] = -1; nrank[0] = -1; ndep[0] = 0; }
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    __syncwarp();  // every lane's log-probs have landed

    // lane p: node p (depth dep) and its pending child (rank kr, score cs, key khi:klo; 0 =
    // none). Offsets into lps, always in range: ao = its own log-prob lp[dep, kr], bo = its next
    // sibling's lp[dep, kr + 1] (ao when there is none), ho = its first child's lp[dep + 1, 0]
    // (0 when there is none). Loads go through the warp's shared address kept in a register.
    const unsigned lps_s = __shfl_xor_sync(DDT_FULL_MASK, ddt_smem_addr(lps), 0);
    int dep = 0, kr = 0, ao = 0, bo = 0, ho = 0;
    double cs = 0.0;
    unsigned khi = 0u, klo = 0u;
    if (lane == 0) {
        cs = (double)ddt_lds(lps_s, 0);  // the first entry's score is lp[0, 0] itself
        ddt_key(cs, khi, klo);
        bo = K > 1 ? 1 : 0;
        ho = L > 1 ? K : 0;
    }
    // lane j: node j + 1 of the output
    int o_par = 0, o_dep = 1, o_rank = 0;
    float o_score = 0.0f;

    for (int i = 1; i < n; ++i) {
        const unsigned m1 = __reduce_max_sync(DDT_FULL_MASK, khi);
        // every lane, branch-free, while the reduction is in flight: the pending child's next
        // sibling ns and first child hs (used only if this lane wins this pop)
        const float la = ddt_lds(lps_s, ao), lb = ddt_lds(lps_s, bo), lh = ddt_lds(lps_s, ho);
        unsigned win = __ballot_sync(DDT_FULL_MASK, khi == m1);
        if (win & (win - 1u)) {
            const unsigned m2 = __reduce_max_sync(DDT_FULL_MASK, khi == m1 ? klo : 0u);
            win = __ballot_sync(DDT_FULL_MASK, khi == m1 && klo == m2);
            if (win & (win - 1u)) {
                __syncwarp();  // node arrays of every popped node visible
                win = 1u << ddt_tie_winner(win, kr, npar, nrank, ndep);
            }
        }
        const double ns = (cs - (double)la) + (double)lb;
        const double hs = cs + (double)lh;
        unsigned nhi, nlo, hhi, hlo;
        ddt_key(ns, nhi, nlo);
        ddt_key(hs, hhi, hlo);
        if (kr + 1 >= K) { nhi = 0u; nlo = 0u; }
        if (dep + 1 >= L) { hhi = 0u; hlo = 0u; }
        const int w = __ffs(win) - 1;
        const int w_dr = __shfl_sync(DDT_FULL_MASK, ((dep + 1) << 16) | kr, w);
        const float w_fs = __shfl_sync(DDT_FULL_MASK, (float)cs, w);
        const double c_s = __shfl_sync(DDT_FULL_MASK, hs, w);
        const unsigned c_hi = __shfl_sync(DDT_FULL_MASK, hhi, w);
        const unsigned c_lo = __shfl_sync(DDT_FULL_MASK, hlo, w);
        const int d_i = w_dr >> 16, r_i = w_dr & 0xffff;  // node i: depth, rank; parent w
        if (lane == i - 1) { o_par = w; o_dep = d_i; o_rank = r_i; o_score = w_fs; }
        if (i == n - 1) break;
        if (lane == 0) { npar[i] = w; nrank[i] = r_i; ndep[i] = d_i; }
        // the winner's and the new node's lane updates as selects: no divergent branch in the pop
        // loop (as branches taken by one lane each, e108f3c's form, it was slower)
        const bool is_w = lane == w, is_i = lane == i, has = d_i < L;
        const int ao_i = has ? d_i * K : 0;
        const int bo_i = has && K > 1 ? ao_i + 1 : ao_i;
        const int ho_i = d_i + 1 < L ? ao_i + K : 0;
        const int bo_w = kr + 2 < K ? bo + 1 : bo;
        ao = is_w ? bo : (is_i ? ao_i : ao);
        bo = is_w ? bo_w : (is_i ? bo_i : bo);
        ho = is_i ? ho_i : ho;
        dep = is_i ? d_i : dep;
        kr = is_w ? kr + 1 : (is_i ? 0 : kr);
        cs = is_w ? ns : (is_i ? c_s : cs);
        khi = is_w ? nhi : (is_i ? c_hi : khi);
        klo = is_w ? nlo : (is_i ? c_lo : klo);
    }

    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncwarp();  // every lane's token ids have landed
    const long long base = (long long)b * n;
    if (lane == 0) ddt_put_node(DDT_OUT_ARGS, base, 0, -1, 0, -1, 0.0f, true, sids, K, root);
    if (lane + 1 < n)
        ddt_put_node(DDT_OUT_ARGS, base + lane + 1, lane + 1, o_par, o_dep, o_rank, o_score, true,
                     sids, K, root);
}

#define DDT_BUILD_ARG_NAMES                                                                    \
    logprobs, token_ids, root_tokens, root_default, B, L, Kin, K, n, DDT_OUT_ARGS

extern "C" __global__ void ddtree_build_small(DDT_BUILD_PARAMS) {
    ddt_build_small(DDT_BUILD_ARG_NAMES);
}

// vis[b, i, j] = 1 iff j == i or j is an ancestor of i (parents[b, i] < i).
extern "C" __global__ void ddtree_visibility(const long long* __restrict__ parents,  // [B, n]
                                             int B, int n,
                                             unsigned char* __restrict__ vis) {   // [B, n, n]
    const long long total = (long long)B * n * n;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(e % n);
        const long long bi = e / n;
        const int i = (int)(bi % n);
        const long long b = bi / n;
        const long long* pb = parents + b * n;
        int cur = i;
        while (cur > j) cur = (int)pb[cur];
        vis[e] = (cur == j) ? 1 : 0;
    }
}

// One warp per request, DDT_ACCEPT_WARPS requests per block.
// Shared: int mp[warps][n]: mp[j] = parents[j] when tokens[j] == argmax[parents[j]], else -1.
extern "C" __global__ void ddtree_accept(const long long* __restrict__ tokens,   // [B, n]
                                         const long long* __restrict__ parents,  // [B, n]
                                         const long long* __restrict__ argmax,   // [B, n]
                                         int B, int n,
                                         long long* __restrict__ accepted,  // [B, n], -1 padded
                                         long long* __restrict__ lengths,   // [B]
                                         long long* __restrict__ bonus) {   // [B]
    extern __shared__ int ddt_acc_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int b = blockIdx.x * (blockDim.x >> 5) + warp;
    if (b >= B) return;  // whole warp leaves together
    int* mp = ddt_acc_smem + warp * n;
    const long long base = (long long)b * n;
    for (int j = lane; j < n; j += 32) {
        int m = -1;
        if (j > 0) {
            const long long p = parents[base + j];
            if (tokens[base + j] == argmax[base + p]) m = (int)p;
        }
        mp[j] = m;
        accepted[base + j] = -1;
    }
    __syncwarp();
    int cur = 0, len = 1;
    if (lane == 0) accepted[base] = 0;
    while (true) {
        int found = -1;
        for (int j0 = cur + 1; j0 < n; j0 += 32) {
            const int j = j0 + lane;
            const unsigned hit = __ballot_sync(DDT_FULL_MASK, j < n && mp[j] == cur);
            if (hit) { found = j0 + __ffs(hit) - 1; break; }
        }
        if (found < 0) break;
        if (lane == 0) accepted[base + len] = found;
        ++len;
        cur = found;
    }
    if (lane == 0) {
        lengths[b] = len;
        bonus[b] = argmax[base + cur];
    }
}

// keep[b, j] = slots[b, accepted[b, j]] for j < lengths[b], else -1 (path order).
// freed[b, :] = slots of the other nodes in node order, -1 padded; nfree[b] their count.
extern "C" __global__ void ddtree_commit_scattered(const long long* __restrict__ slots,     // [B, n]
                                                   const long long* __restrict__ accepted,  // [B, n]
                                                   const long long* __restrict__ lengths,   // [B]
                                                   int B, int n,
                                                   long long* __restrict__ keep,    // [B, n]
                                                   long long* __restrict__ freed,   // [B, n]
                                                   long long* __restrict__ nfree) { // [B]
    extern __shared__ unsigned char ddt_keep_flag[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int b = blockIdx.x * (blockDim.x >> 5) + warp;
    if (b >= B) return;
    unsigned char* flag = ddt_keep_flag + warp * n;
    const long long base = (long long)b * n;
    const int len = (int)lengths[b];
    for (int j = lane; j < n; j += 32) flag[j] = 0;
    __syncwarp();
    for (int j = lane; j < n; j += 32) {
        if (j < len) {
            const int a = (int)accepted[base + j];
            flag[a] = 1;
            keep[base + j] = slots[base + a];
        } else {
            keep[base + j] = -1;
        }
    }
    __syncwarp();
    int count = 0;
    for (int j0 = 0; j0 < n; j0 += 32) {
        const int j = j0 + lane;
        const bool f = j < n && !flag[j];
        const unsigned m = __ballot_sync(DDT_FULL_MASK, f);
        if (f) freed[base + count + __popc(m & ((1u << lane) - 1u))] = slots[base + j];
        count += __popc(m);
    }
    for (int j = count + lane; j < n; j += 32) freed[base + j] = -1;
    if (lane == 0) nfree[b] = count;
}

// In-place compaction: row dest_start[b] + j <- row slots[b, accepted[b, j]], j < lengths[b],
// for every plane. kv is viewed as [planes, S, W] 32-bit words. One block per (request,
// plane); each column tile of all accepted rows is read fully before any of it is written,
// so overlapping sources and destinations of one request are safe.
#define DDT_COMPACT_REGS 4
extern "C" __global__ void ddtree_commit_compact(unsigned int* __restrict__ kv,
                                                 long long plane_stride, int W,
                                                 const long long* __restrict__ slots,     // [B, n]
                                                 const long long* __restrict__ accepted,  // [B, n]
                                                 const long long* __restrict__ lengths,   // [B]
                                                 const long long* __restrict__ dest_start,// [B]
                                                 int n) {
    extern __shared__ long long ddt_src_rows[];
    const int b = blockIdx.x;
    unsigned int* plane = kv + (long long)blockIdx.y * plane_stride;
    const long long base = (long long)b * n;
    const int len = (int)lengths[b];
    const long long dst0 = dest_start[b];
    for (int j = threadIdx.x; j < len; j += blockDim.x)
        ddt_src_rows[j] = slots[base + accepted[base + j]];
    __syncthreads();
    const int per_tile = blockDim.x * DDT_COMPACT_REGS;
    // columns per tile; a root path has at most L + 1 <= 33 rows, far below per_tile
    int tc = len > 0 ? per_tile / len : W;
    if (tc < 1) tc = 1;
    if (tc > W) tc = W;
    for (int c0 = 0; c0 < W; c0 += tc) {
        const int cols = (W - c0 < tc) ? (W - c0) : tc;
        const int items = cols * len;
        unsigned int v[DDT_COMPACT_REGS];
#pragma unroll
        for (int q = 0; q < DDT_COMPACT_REGS; ++q) {
            const int e = threadIdx.x + q * blockDim.x;
            if (e < items) {
                const int j = e / cols, c = e - j * cols;
                v[q] = plane[ddt_src_rows[j] * W + c0 + c];
            }
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < DDT_COMPACT_REGS; ++q) {
            const int e = threadIdx.x + q * blockDim.x;
            if (e < items) {
                const int j = e / cols, c = e - j * cols;
                plane[(dst0 + j) * W + c0 + c] = v[q];
            }
        }
        __syncthreads();
    }
}
