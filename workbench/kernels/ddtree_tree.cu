// DDTree tree kernels: best-first tree build, visibility, greedy accept, KV commit.
//
// ddtree_build      one thread block per request; the request's [L, K] log-probs
//                   are staged in shared memory, thread 0 runs the best-first heap
//                   (float64 scores, order (-score, rank path)) in shared memory,
//                   then all threads write the nodes out. Bit-exact with
//                   workbench.ddtree.reference.build_tree, ties included.
// ddtree_build_warp / ddtree_build_small  faster variants of ddtree_build (same output).
// ddtree_visibility one thread per (request, i, j): j is i or an ancestor of i.
// ddtree_accept     one warp per request: greedy longest matching root path.
// ddtree_commit_scattered  keep slots (accepted path order) and free slots.
// ddtree_commit_compact    move accepted KV rows to contiguous slots, in place.
//
// Integer tensors are int64 ("long long"); no includes (NVRTC and nvcc).

#define DDT_FULL_MASK 0xffffffffu

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

// Entry order "a comes out before b": higher score, then smaller rank path. Entries
// are packed as parent << 16 | rank.
__device__ __forceinline__ bool ddt_hk_before(double sa, int ka, double sb, int kb,
                                              const int* npar, const int* nrank, const int* ndep) {
    if (sa != sb) return sa > sb;
    return ddt_path_less(ka >> 16, ka & 0xffff, kb >> 16, kb & 0xffff, npar, nrank, ndep);
}

// Binary heap run by one thread; the entry being sifted stays in registers (hole sifting).
// Shared memory layout (dynamic), for K = min(budget, K_in), n nodes, cap = n heap slots:
//   double hs[cap] | float lps[L*K] | int hk[cap] | int npar[n] | int nrank[n] | int ndep[n]
extern "C" __global__ void ddtree_build(const float* __restrict__ logprobs,     // [B, L, Kin]
                                        const long long* __restrict__ token_ids,  // [B, L, Kin]
                                        const long long* __restrict__ root_tokens,  // [B] or null
                                        long long root_default,
                                        int L, int Kin, int K, int n,
                                        long long* __restrict__ out_tokens,   // [B, n]
                                        long long* __restrict__ out_parents,  // [B, n]
                                        long long* __restrict__ out_depths,   // [B, n]
                                        long long* __restrict__ out_ranks,    // [B, n]
                                        float* __restrict__ out_scores) {     // [B, n]
    extern __shared__ double ddt_smem[];
    const int b = blockIdx.x;
    const int cap = n;
    double* hs = ddt_smem;
    float* lps = reinterpret_cast<float*>(hs + cap);
    int* hk = reinterpret_cast<int*>(lps + L * K);
    int* npar = hk + cap;
    int* nrank = npar + n;
    int* ndep = nrank + n;

    const float* lpb = logprobs + (long long)b * L * Kin;
    for (int e = threadIdx.x; e < L * K; e += blockDim.x) {
        const int d = e / K, r = e - d * K;
        lps[e] = lpb[(long long)d * Kin + r];
    }
    __syncthreads();

    if (threadIdx.x == 0) {
        npar[0] = -1; nrank[0] = -1; ndep[0] = 0;
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

    const long long* idb = token_ids + (long long)b * L * Kin;
    const long long root = root_tokens ? root_tokens[b] : root_default;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const long long o = (long long)b * n + i;
        if (i == 0) {
            out_tokens[o] = root; out_parents[o] = -1; out_depths[o] = 0;
            out_ranks[o] = -1; out_scores[o] = 0.0f;
        } else {
            const int d = ndep[i], r = nrank[i];
            out_tokens[o] = idb[(long long)(d - 1) * Kin + r];
            out_parents[o] = npar[i]; out_depths[o] = d; out_ranks[o] = r;
        }
    }
}

// Warp-parallel variant of ddtree_build (same arguments, same output, bit for bit).
// The frontier lives in shared memory, slot s owned by lane s % 32 (at most 32 slots per
// lane, capacity n - 1 <= 1024); each lane caches the best of its own slots, and every pop
// is a warp butterfly reduction over the 32 cached bests under the total order
// (higher score, then smaller rank path). Only the lane that lost the popped entry rescans.
// Entry fields are packed: parent << 16 | depth << 10 | rank (parent <= 1024, depth <= 32,
// rank < 1024).
// Shared layout: double es[cap] | float lps[L*K] | int ep[cap] | int npar[n] | int nrank[n] | int ndep[n]
__device__ __forceinline__ bool ddt_entry_before(double sa, int pka, bool oka, double sb, int pkb,
                                                 bool okb, const int* npar, const int* nrank,
                                                 const int* ndep) {
    if (!oka) return false;
    if (!okb) return true;
    if (sa != sb) return sa > sb;
    return ddt_path_less(pka >> 16, pka & 1023, pkb >> 16, pkb & 1023, npar, nrank, ndep);
}

extern "C" __global__ void ddtree_build_warp(const float* __restrict__ logprobs,     // [B, L, Kin]
                                             const long long* __restrict__ token_ids,  // [B, L, Kin]
                                             const long long* __restrict__ root_tokens,  // [B] or null
                                             long long root_default,
                                             int L, int Kin, int K, int n,
                                             long long* __restrict__ out_tokens,   // [B, n]
                                             long long* __restrict__ out_parents,  // [B, n]
                                             long long* __restrict__ out_depths,   // [B, n]
                                             long long* __restrict__ out_ranks,    // [B, n]
                                             float* __restrict__ out_scores) {     // [B, n]
    extern __shared__ double ddt_wsmem[];
    const int b = blockIdx.x;
    const int cap = n - 1;  // frontier size never exceeds the number of pops
    double* es = ddt_wsmem;
    float* lps = reinterpret_cast<float*>(es + cap);
    int* ep = reinterpret_cast<int*>(lps + L * K);
    int* npar = ep + cap;
    int* nrank = npar + n;
    int* ndep = nrank + n;

    const float* lpb = logprobs + (long long)b * L * Kin;
    for (int e = threadIdx.x; e < L * K; e += blockDim.x) {
        const int d = e / K, r = e - d * K;
        lps[e] = lpb[(long long)d * Kin + r];
    }
    if (threadIdx.x == 0) { npar[0] = -1; nrank[0] = -1; ndep[0] = 0; }
    __syncthreads();

    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int e_lane = 0;  // slots owned by this lane: lane + 32 k < cap
        if (lane < cap) e_lane = (cap - 1 - lane) / 32 + 1;
        const unsigned full = e_lane >= 32 ? 0xffffffffu : ((1u << e_lane) - 1u);
        unsigned valid = 0;
        double best_s = 0.0;
        int best_pk = 0, best_slot = -1;
        bool best_ok = false;
        if (lane == 0) {
            es[0] = (double)lps[0];
            ep[0] = (0 << 16) | (1 << 10) | 0;
            valid = 1u;
            best_s = es[0]; best_pk = ep[0]; best_slot = 0; best_ok = true;
        }
        __syncwarp();
        for (int i = 1; i < n; ++i) {
            double rs = best_s;
            int rpk = best_pk, rslot = best_slot;
            bool rok = best_ok;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                const double os = __shfl_xor_sync(DDT_FULL_MASK, rs, off);
                const int opk = __shfl_xor_sync(DDT_FULL_MASK, rpk, off);
                const int oslot = __shfl_xor_sync(DDT_FULL_MASK, rslot, off);
                const bool ook = __shfl_xor_sync(DDT_FULL_MASK, (int)rok, off) != 0;
                if (ddt_entry_before(os, opk, ook, rs, rpk, rok, npar, nrank, ndep)) {
                    rs = os; rpk = opk; rslot = oslot; rok = ook;
                }
            }
            const int parent = rpk >> 16, d = (rpk >> 10) & 63, r = rpk & 1023;
            if (lane == 0) {
                npar[i] = parent; nrank[i] = r; ndep[i] = d;
                out_scores[(long long)b * n + i] = (float)rs;
            }
            if (i == n - 1) break;
            const int owner = rslot & 31, k_own = rslot >> 5;
            if (lane == owner) {
                if (r + 1 < K) {
                    es[rslot] = (rs - (double)lps[(d - 1) * K + r]) + (double)lps[(d - 1) * K + r + 1];
                    ep[rslot] = (parent << 16) | (d << 10) | (r + 1);
                } else {
                    valid &= ~(1u << k_own);
                }
            }
            int child_lane = -1;
            double cs = 0.0;
            int cpk = 0, cslot = -1;
            if (d < L) {
                const unsigned has_free = __ballot_sync(DDT_FULL_MASK, (valid & full) != full);
                child_lane = __ffs(has_free) - 1;  // a free slot always exists (size <= cap)
                if (lane == child_lane) {
                    const int k2 = __ffs(~valid & full) - 1;
                    cslot = lane + 32 * k2;
                    cs = rs + (double)lps[d * K];
                    cpk = (i << 16) | ((d + 1) << 10) | 0;
                    es[cslot] = cs; ep[cslot] = cpk;
                    valid |= 1u << k2;
                }
            }
            __syncwarp();  // node i and the new entries are visible to every lane
            if (lane == owner) {
                best_ok = false;
                unsigned m = valid;
                while (m) {
                    const int k = __ffs(m) - 1;
                    m &= m - 1;
                    const int slot = lane + 32 * k;
                    const double s = es[slot];
                    const int pk = ep[slot];
                    if (ddt_entry_before(s, pk, true, best_s, best_pk, best_ok, npar, nrank, ndep)) {
                        best_s = s; best_pk = pk; best_slot = slot; best_ok = true;
                    }
                }
            } else if (lane == child_lane) {
                if (ddt_entry_before(cs, cpk, true, best_s, best_pk, best_ok, npar, nrank, ndep)) {
                    best_s = cs; best_pk = cpk; best_slot = cslot; best_ok = true;
                }
            }
            __syncwarp();
        }
    }
    __syncthreads();

    const long long* idb = token_ids + (long long)b * L * Kin;
    const long long root = root_tokens ? root_tokens[b] : root_default;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const long long o = (long long)b * n + i;
        if (i == 0) {
            out_tokens[o] = root; out_parents[o] = -1; out_depths[o] = 0;
            out_ranks[o] = -1; out_scores[o] = 0.0f;
        } else {
            const int d = ndep[i], r = nrank[i];
            out_tokens[o] = idb[(long long)(d - 1) * Kin + r];
            out_parents[o] = npar[i]; out_depths[o] = d; out_ranks[o] = r;
        }
    }
}

// Small-budget variant (n - 1 <= 32, so K <= 32): the frontier is a sorted list held in
// one warp's registers, lane j holding the j-th entry in pop order. A pop takes lane 0's
// entry; the sibling and the first child are placed by two ballots and the list is
// re-gathered with one shuffle, so a pop costs a handful of shuffles instead of a
// shared-memory heap walk. The request's token ids are staged in shared memory with the
// log-probs. Same arguments and output as ddtree_build, bit for bit.
// Shared layout: long long sids[L*K] | float lps[L*K] | int npar[n] | int nrank[n] | int ndep[n]
__device__ __forceinline__ bool ddt_pk_before(double sa, int pka, double sb, int pkb,
                                              const int* npar, const int* nrank, const int* ndep) {
    if (sa != sb) return sa > sb;
    return ddt_path_less(pka >> 16, pka & 1023, pkb >> 16, pkb & 1023, npar, nrank, ndep);
}

extern "C" __global__ void ddtree_build_small(const float* __restrict__ logprobs,     // [B, L, Kin]
                                              const long long* __restrict__ token_ids,  // [B, L, Kin]
                                              const long long* __restrict__ root_tokens,  // [B] or null
                                              long long root_default,
                                              int L, int Kin, int K, int n,
                                              long long* __restrict__ out_tokens,   // [B, n]
                                              long long* __restrict__ out_parents,  // [B, n]
                                              long long* __restrict__ out_depths,   // [B, n]
                                              long long* __restrict__ out_ranks,    // [B, n]
                                              float* __restrict__ out_scores) {     // [B, n]
    extern __shared__ long long ddt_small_smem[];
    const int b = blockIdx.x;
    long long* sids = ddt_small_smem;
    float* lps = reinterpret_cast<float*>(sids + L * K);
    int* npar = reinterpret_cast<int*>(lps + L * K);
    int* nrank = npar + n;
    int* ndep = nrank + n;

    const float* lpb = logprobs + (long long)b * L * Kin;
    const long long* idb = token_ids + (long long)b * L * Kin;
    for (int e = threadIdx.x; e < L * K; e += blockDim.x) {
        const int d = e / K, r = e - d * K;
        lps[e] = lpb[(long long)d * Kin + r];
        sids[e] = idb[(long long)d * Kin + r];
    }
    const long long root = root_tokens ? root_tokens[b] : root_default;
    if (threadIdx.x == 0) { npar[0] = -1; nrank[0] = -1; ndep[0] = 0; }
    __syncthreads();

    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        double es = (double)lps[0];
        int epk = (0 << 16) | (1 << 10) | 0;
        int m = 1;  // frontier size; lanes >= m hold stale values
        for (int i = 1; i < n; ++i) {
            const double s = __shfl_sync(DDT_FULL_MASK, es, 0);
            const int pk = __shfl_sync(DDT_FULL_MASK, epk, 0);
            const int parent = pk >> 16, d = (pk >> 10) & 63, r = pk & 1023;
            if (lane == 0) {
                npar[i] = parent; nrank[i] = r; ndep[i] = d;
                out_scores[(long long)b * n + i] = (float)s;
            }
            if (i == n - 1) break;
            const bool hs = r + 1 < K, hc = d < L;
            const double ss = hs ? (s - (double)lps[(d - 1) * K + r]) + (double)lps[(d - 1) * K + r + 1] : 0.0;
            const int spk = (parent << 16) | (d << 10) | (r + 1);
            const double cs = hc ? s + (double)lps[d * K] : 0.0;
            const int cpk = (i << 16) | ((d + 1) << 10) | 0;
            __syncwarp();  // node i visible to every lane (rank-path comparisons)
            // list without its head: lane l sees entry l + 1
            const double rs = __shfl_down_sync(DDT_FULL_MASK, es, 1);
            const int rpk = __shfl_down_sync(DDT_FULL_MASK, epk, 1);
            const bool rv = lane + 1 < m;
            const unsigned bs = __ballot_sync(DDT_FULL_MASK,
                rv && hs && ddt_pk_before(rs, rpk, ss, spk, npar, nrank, ndep));
            const unsigned bc = __ballot_sync(DDT_FULL_MASK,
                rv && hc && ddt_pk_before(rs, rpk, cs, cpk, npar, nrank, ndep));
            const int c_s = __popc(bs), c_c = __popc(bc);
            int ps = -1, pc = -1;
            if (hs && hc) {
                if (ddt_pk_before(ss, spk, cs, cpk, npar, nrank, ndep)) { ps = c_s; pc = c_c + 1; }
                else { pc = c_c; ps = c_s + 1; }
            } else if (hs) {
                ps = c_s;
            } else if (hc) {
                pc = c_c;
            }
            const int src = lane - ((ps >= 0 && ps < lane) ? 1 : 0) - ((pc >= 0 && pc < lane) ? 1 : 0);
            const int src_lane = src + 1 < 31 ? src + 1 : 31;
            const double gs = __shfl_sync(DDT_FULL_MASK, es, src_lane);
            const int gpk = __shfl_sync(DDT_FULL_MASK, epk, src_lane);
            if (lane == ps) { es = ss; epk = spk; }
            else if (lane == pc) { es = cs; epk = cpk; }
            else { es = gs; epk = gpk; }
            m = m - 1 + (hs ? 1 : 0) + (hc ? 1 : 0);
            __syncwarp();
        }
    }
    __syncthreads();

    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const long long o = (long long)b * n + i;
        if (i == 0) {
            out_tokens[o] = root; out_parents[o] = -1; out_depths[o] = 0;
            out_ranks[o] = -1; out_scores[o] = 0.0f;
        } else {
            const int d = ndep[i], r = nrank[i];
            out_tokens[o] = sids[(d - 1) * K + r];
            out_parents[o] = npar[i]; out_depths[o] = d; out_ranks[o] = r;
        }
    }
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
