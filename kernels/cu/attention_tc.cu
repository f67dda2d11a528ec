// Causal self-attention on tensor cores (FlashAttention-2 style), bf16 and f16 storage, head
// sizes 64 and 128. Same layouts, semantics and CPU references as attention.cu, whose scalar
// kernels stay the f32 path and the default (`AttentionKernel::Scalar` on the host):
// CPU references: executor::model::attention::{grouped_attention_forward,
// grouped_attention_backward} (GPT-2 attention is the case KV = NH).
//
// Layouts: qkv (B, T, W) rows [q (NH HS) | k (KV HS) | v (KV HS)], W = (NH + 2 KV) HS; query head
// h reads key/value head h / (NH / KV); out (B, T, NH HS); lse and delta (B, NH, T) f32; dqkv
// (B, T, W) written, not accumulated; scale passed in by the host. delta = rowsum(dout * out)
// comes from attention.cu's attention_backward_preprocess.
//
// Work split (no atomics; deterministic):
// * forward: a block of ATTENTION_TC_QUERY_BLOCK queries (4 warps of 16 rows), walking key tiles
//   of 64 up to its last query; online softmax in f32 (running max and sum per row; a row's sum
//   is kept as 4 partial sums, one per thread of its quad, added at the end).
// * dk/dv: a block of KEYS keys (warps of 16 key rows), walking, for each query head of its
//   key/value head's group in order, query tiles of QTILE from its first key on; P^T and dS^T
//   are recomputed from lse and delta (S^T = K Q^T computed directly, so no transposes).
// * dq: a block of ATTENTION_TC_QUERY_BLOCK queries, walking key tiles up to its last query.
// Causal: key tiles after a warp's last query are skipped; partly masked tiles mask per element.
// Products are mma.sync m16n8k16 with f32 accumulators; P and dS are rounded to the storage type
// before their products (as FlashAttention does): that rounding, not the accumulation, sets the
// error against the CPU (kernels.rs's check explains the tolerance).
//
// Fragments of mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} (PTX ISA, "Matrix Fragments
// for mma.m16n8k16 with floating point type"); lane = threadIdx.x % 32, g = lane >> 2 (group),
// t = lane & 3 (thread in group). Each .b32 register holds two 16-bit elements, the one of the
// smaller column (A) or row (B) index in the low half:
//   A (16 x 16, row-major, 4 regs): a0 = (row g,   cols 2t, 2t+1)   a1 = (row g+8, cols 2t, 2t+1)
//                                   a2 = (row g,   cols 2t+8, 2t+9) a3 = (row g+8, cols 2t+8, 2t+9)
//   B (16 x 8, "col", 2 regs):      b0 = (rows 2t, 2t+1,   col g)   b1 = (rows 2t+8, 2t+9, col g)
//   C, D (16 x 8 f32, 4 regs):      c0, c1 = (row g, cols 2t, 2t+1) c2, c3 = (row g+8, cols 2t, 2t+1)
// Two adjacent C tiles (columns 16k..16k+7 and 16k+8..16k+15) rounded to 16 bits pairwise are
// exactly the A fragment of columns 16k..16k+15 ({c0,c1} {c2,c3} of the first, then of the
// second): P and dS go from one product's accumulators into the next product's A operand
// without shared memory. A B operand (k, n) = M[n][k] of a row-major tile M is one 32-bit load
// (k pairs adjacent in a row); B (k, n) = M[k][n] packs two 16-bit loads from two rows.
//
// ptxas through NVRTC 13 (-Xptxas -v, 2026-11-26; no spills anywhere), registers per thread and
// static shared memory, sm_90 (sm_80): forward hs64 143 (127), 18 KiB; hs128 171 (168), 34 KiB;
// dk/dv hs64 174 (165), 36.5 KiB; hs128 238 (226), 34.3 KiB; dq hs64 171 (179), 18 KiB; hs128
// 216 (212), 17 KiB. The CUBIN is about 2.9 MB with -lineinfo.
//
// Shared tiles are rows of HS + ATTENTION_TC_PAD 16-bit elements (the pad spreads the 8 rows a
// fragment load touches over distinct banks; a row is 144 or 272 bytes, so 16-byte chunks of a
// row stay 16-byte aligned). Tiles come in by 16-byte cp.async copies where the rows are
// 16-byte aligned, else by 16-bit loads (tc_load_rows); fragments straight from global memory
// (tc_global_a) are 16-bit loads.

#define ATTENTION_TC_QUERY_BLOCK 64
#define ATTENTION_TC_KEY_TILE 64
#define ATTENTION_TC_PAD 8

// d += a * b on tensor cores, f32 accumulators.
template <typename T>
__device__ __forceinline__ void tc_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);
template <>
__device__ __forceinline__ void tc_mma<bf16>(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void tc_mma<f16>(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two f32 rounded to the storage type, `lo` in the low half (cvt puts its first source high).
template <typename T> __device__ __forceinline__ unsigned tc_pack(float lo, float hi);
template <> __device__ __forceinline__ unsigned tc_pack<bf16>(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> __device__ __forceinline__ unsigned tc_pack<f16>(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Elements (row, col) and (row, col + 1) of a shared tile with rows of STRIDE (col even).
template <int STRIDE>
__device__ __forceinline__ unsigned tc_pair_in_row(const dsplan_u16* tile, int row, int col) {
    return *reinterpret_cast<const unsigned*>(tile + row * STRIDE + col);
}
// Elements (row, col) and (row + 1, col) of a shared tile.
template <int STRIDE>
__device__ __forceinline__ unsigned tc_pair_in_column(const dsplan_u16* tile, int row, int col) {
    return (unsigned)tile[row * STRIDE + col] | ((unsigned)tile[(row + 1) * STRIDE + col] << 16);
}
// Elements (row, col) and (row, col + 1) of a global row-major matrix with rows of `width`;
// zero past the last row.
__device__ __forceinline__ unsigned tc_global_pair(const dsplan_u16* base, long long width, int row, int col,
                                                   int seq_len) {
    if (row >= seq_len) return 0u;
    const dsplan_u16* p = base + (long long)row * width + col;
    return (unsigned)p[0] | ((unsigned)p[1] << 16);
}

// ROWS rows of HS elements from global (rows `first`.., `width` apart; zero past seq_len) into
// a shared tile, every thread of the block taking part; the tile is complete in this thread's
// part when it returns (the caller's __syncthreads() completes it for the block).
//
// When the rows start 16-byte aligned (the base address and the row width; GPT-2's and the
// Llama family's activations always do), each thread copies 16-byte chunks with cp.async
// (sm_80+): every copy of the tile is in flight at once, where 16-bit loads waited for each
// other one by one (the first H100 profile, 2026-11-27: the three kernels spent most of their
// 82 ms per step in those loads). Otherwise, 16-bit loads.
template <int ROWS, int HS>
__device__ __forceinline__ void tc_load_rows(dsplan_u16* tile, const dsplan_u16* base, long long width, int first,
                                             int seq_len) {
    constexpr int STRIDE = HS + ATTENTION_TC_PAD, CHUNKS = HS / 8;  // 8 elements are 16 bytes
    const unsigned long long address = reinterpret_cast<unsigned long long>(base);
    if (((address | (unsigned long long)width * 2ull) & 15ull) == 0ull) {
        for (int e = threadIdx.x; e < ROWS * CHUNKS; e += blockDim.x) {
            const int r = e / CHUNKS, d = (e % CHUNKS) * 8, row = first + r;
            dsplan_u16* dst = tile + r * STRIDE + d;
            if (row < seq_len) {
                const unsigned shared = (unsigned)__cvta_generic_to_shared(dst);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared),
                             "l"(base + (long long)row * width + d)
                             : "memory");
            } else {
                *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
            }
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }
    for (int e = threadIdx.x; e < ROWS * HS; e += blockDim.x) {
        const int r = e / HS, d = e % HS, row = first + r;
        tile[r * STRIDE + d] = row < seq_len ? base[(long long)row * width + d] : (dsplan_u16)0;
    }
}

// The A fragments (HS / 16 steps of k) of 16 rows from `first` of a global matrix.
template <int HS>
__device__ __forceinline__ void tc_global_a(unsigned (&a)[HS / 16][4], const dsplan_u16* base, long long width,
                                            int first, int seq_len) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        const int c = kk * 16 + 2 * t;
        a[kk][0] = tc_global_pair(base, width, first + g, c, seq_len);
        a[kk][1] = tc_global_pair(base, width, first + g + 8, c, seq_len);
        a[kk][2] = tc_global_pair(base, width, first + g, c + 8, seq_len);
        a[kk][3] = tc_global_pair(base, width, first + g + 8, c + 8, seq_len);
    }
}

// The A fragment of k-step kk from C tiles 2kk and 2kk+1 (see the header).
template <typename T, int N>
__device__ __forceinline__ void tc_c_to_a(unsigned (&a)[4], const float (&c)[N][4], int kk) {
    a[0] = tc_pack<T>(c[2 * kk][0], c[2 * kk][1]);
    a[1] = tc_pack<T>(c[2 * kk][2], c[2 * kk][3]);
    a[2] = tc_pack<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = tc_pack<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// out = softmax(q k^T * scale + causal mask) v; lse = logsumexp of each row's scaled scores.
// grid (ceil(T / ATTENTION_TC_QUERY_BLOCK), NH, B), block 4 warps.
template <typename T, int HS>
__device__ void attention_tc_forward(T* out, float* lse, const T* qkv, int seq_len, int n_head, int kv_heads,
                                     float scale) {
    constexpr int KEYS = ATTENTION_TC_KEY_TILE, STRIDE = HS + ATTENTION_TC_PAD;
    __shared__ __align__(16) dsplan_u16 ks[KEYS * STRIDE];
    __shared__ __align__(16) dsplan_u16 vs[KEYS * STRIDE];
    const int QW = n_head * HS, W = (n_head + 2 * kv_heads) * HS;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (n_head / kv_heads);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int q0 = blockIdx.x * ATTENTION_TC_QUERY_BLOCK, qw = q0 + warp * 16;
    const int rows_of[2] = {qw + g, qw + g + 8};
    const dsplan_u16* rows = reinterpret_cast<const dsplan_u16*>(qkv) + (long long)b * seq_len * W;
    const dsplan_u16* kbase = rows + QW + kvh * HS;
    const dsplan_u16* vbase = kbase + kv_heads * HS;
    unsigned qf[HS / 16][4];
    tc_global_a<HS>(qf, rows + h * HS, W, qw, seq_len);
    float o[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {DSPLAN_NEG_INF, DSPLAN_NEG_INF}, l[2] = {0.0f, 0.0f};
    const int last_query = min(q0 + ATTENTION_TC_QUERY_BLOCK, seq_len) - 1;
    const int warp_last = min(qw + 15, seq_len - 1);
    for (int k0 = 0; k0 <= last_query; k0 += KEYS) {
        __syncthreads();
        tc_load_rows<KEYS, HS>(ks, kbase, W, k0, seq_len);
        tc_load_rows<KEYS, HS>(vs, vbase, W, k0, seq_len);
        __syncthreads();
        if (k0 > warp_last) continue;  // every key after this warp's queries
        float s[KEYS / 8][4];
#pragma unroll
        for (int j = 0; j < KEYS / 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HS / 16; kk++) {
                const int c = kk * 16 + 2 * t;
                tc_mma<T>(s[j], qf[kk], tc_pair_in_row<STRIDE>(ks, j * 8 + g, c),
                          tc_pair_in_row<STRIDE>(ks, j * 8 + g, c + 8));
            }
        }
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < KEYS / 8; j++) {
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int key = k0 + j * 8 + 2 * t + (c & 1);
                const float v = key <= rows_of[c >> 1] ? s[j][c] * scale : DSPLAN_NEG_INF;
                s[j][c] = v;
                mx[c >> 1] = fmaxf(mx[c >> 1], v);
            }
        }
        float base[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(DSPLAN_FULL_MASK, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(DSPLAN_FULL_MASK, mx[r], 2));
            base[r] = mx[r] == DSPLAN_NEG_INF ? 0.0f : mx[r];
            const float correction = expf(m[r] - base[r]);  // 0 while m is -inf
            l[r] *= correction;
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                o[n][2 * r] *= correction;
                o[n][2 * r + 1] *= correction;
            }
            m[r] = mx[r];
        }
#pragma unroll
        for (int j = 0; j < KEYS / 8; j++) {
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float p = expf(s[j][c] - base[c >> 1]);
                s[j][c] = p;
                l[c >> 1] += p;
            }
        }
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; kk++) {
            unsigned pa[4];
            tc_c_to_a<T>(pa, s, kk);
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                const int key = kk * 16 + 2 * t, d = n * 8 + g;
                tc_mma<T>(o[n], pa, tc_pair_in_column<STRIDE>(vs, key, d),
                          tc_pair_in_column<STRIDE>(vs, key + 8, d));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(DSPLAN_FULL_MASK, l[r], 1);
        l[r] += __shfl_xor_sync(DSPLAN_FULL_MASK, l[r], 2);
        const int row = rows_of[r];
        if (row >= seq_len) continue;
        const float inv = 1.0f / l[r];
        T* y = out + ((long long)b * seq_len + row) * QW + h * HS;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            y[n * 8 + 2 * t] = from_float<T>(o[n][2 * r] * inv);
            y[n * 8 + 2 * t + 1] = from_float<T>(o[n][2 * r + 1] * inv);
        }
        if (t == 0) lse[((long long)b * n_head + h) * seq_len + row] = m[r] + logf(l[r]);
    }
}

// dk, dv of WARPS * 16 key rows of key/value head blockIdx.y (16 per warp), summed over the
// group's query heads in order, each over query tiles of QTILE from the block's first key.
// grid (ceil(T / (WARPS * 16)), KV, B), block WARPS warps.
template <typename T, int HS, int WARPS, int QTILE>
__device__ void attention_tc_backward_dkdv(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                           const float* delta, int seq_len, int n_head, int kv_heads, float scale) {
    constexpr int KEYS = WARPS * 16, STRIDE = HS + ATTENTION_TC_PAD;
    __shared__ __align__(16) dsplan_u16 ks[KEYS * STRIDE];
    __shared__ __align__(16) dsplan_u16 vs[KEYS * STRIDE];
    __shared__ __align__(16) dsplan_u16 qs[QTILE * STRIDE];
    __shared__ __align__(16) dsplan_u16 dos[QTILE * STRIDE];
    __shared__ float lse_t[QTILE];
    __shared__ float delta_t[QTILE];
    const int QW = n_head * HS, W = (n_head + 2 * kv_heads) * HS;
    const int b = blockIdx.z, kvh = blockIdx.y, group = n_head / kv_heads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int k0 = blockIdx.x * KEYS, kw = k0 + warp * 16;
    const int keys_of[2] = {kw + g, kw + g + 8};
    const dsplan_u16* rows = reinterpret_cast<const dsplan_u16*>(qkv) + (long long)b * seq_len * W;
    const dsplan_u16* kbase = rows + QW + kvh * HS;
    const dsplan_u16* vbase = kbase + kv_heads * HS;
    tc_load_rows<KEYS, HS>(ks, kbase, W, k0, seq_len);
    tc_load_rows<KEYS, HS>(vs, vbase, W, k0, seq_len);
    const int kr = warp * 16 + g;  // this thread's first key row in ks / vs
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
        dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
        dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
    }
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        const dsplan_u16* qbase = rows + h * HS;
        const dsplan_u16* dbase = reinterpret_cast<const dsplan_u16*>(dout) + (long long)b * seq_len * QW + h * HS;
        const float* lse_bh = lse + ((long long)b * n_head + h) * seq_len;
        const float* delta_bh = delta + ((long long)b * n_head + h) * seq_len;
        for (int q0 = k0; q0 < seq_len; q0 += QTILE) {
            __syncthreads();
            tc_load_rows<QTILE, HS>(qs, qbase, W, q0, seq_len);
            tc_load_rows<QTILE, HS>(dos, dbase, QW, q0, seq_len);
            for (int i = threadIdx.x; i < QTILE; i += blockDim.x) {
                const int query = q0 + i;
                lse_t[i] = query < seq_len ? lse_bh[query] : 0.0f;
                delta_t[i] = query < seq_len ? delta_bh[query] : 0.0f;
            }
            __syncthreads();
            if (kw >= seq_len || q0 + QTILE - 1 < kw) continue;  // no key of this warp, or all masked
            // S^T = K Q^T and dP^T = V dO^T: rows are this warp's keys, columns the tile's queries.
            float st[QTILE / 8][4], dpt[QTILE / 8][4];
#pragma unroll
            for (int j = 0; j < QTILE / 8; j++) {
                st[j][0] = st[j][1] = st[j][2] = st[j][3] = 0.0f;
                dpt[j][0] = dpt[j][1] = dpt[j][2] = dpt[j][3] = 0.0f;
            }
#pragma unroll
            for (int kk = 0; kk < HS / 16; kk++) {
                const int c = kk * 16 + 2 * t;
                const unsigned ka[4] = {tc_pair_in_row<STRIDE>(ks, kr, c), tc_pair_in_row<STRIDE>(ks, kr + 8, c),
                                        tc_pair_in_row<STRIDE>(ks, kr, c + 8),
                                        tc_pair_in_row<STRIDE>(ks, kr + 8, c + 8)};
                const unsigned va[4] = {tc_pair_in_row<STRIDE>(vs, kr, c), tc_pair_in_row<STRIDE>(vs, kr + 8, c),
                                        tc_pair_in_row<STRIDE>(vs, kr, c + 8),
                                        tc_pair_in_row<STRIDE>(vs, kr + 8, c + 8)};
#pragma unroll
                for (int j = 0; j < QTILE / 8; j++) {
                    const int qn = j * 8 + g;
                    tc_mma<T>(st[j], ka, tc_pair_in_row<STRIDE>(qs, qn, c), tc_pair_in_row<STRIDE>(qs, qn, c + 8));
                    tc_mma<T>(dpt[j], va, tc_pair_in_row<STRIDE>(dos, qn, c),
                              tc_pair_in_row<STRIDE>(dos, qn, c + 8));
                }
            }
            // P^T from lse, dS^T = P^T (dP^T - delta) (scale applied to dk at the end).
#pragma unroll
            for (int j = 0; j < QTILE / 8; j++) {
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int i = j * 8 + 2 * t + (c & 1), query = q0 + i;
                    const bool visible = query >= keys_of[c >> 1] && query < seq_len;
                    const float p = visible ? expf(st[j][c] * scale - lse_t[i]) : 0.0f;
                    st[j][c] = p;
                    dpt[j][c] = p * (dpt[j][c] - delta_t[i]);
                }
            }
            // dV += P^T dO, dK += dS^T Q: k runs over the tile's queries.
#pragma unroll
            for (int kk = 0; kk < QTILE / 16; kk++) {
                unsigned pa[4], da[4];
                tc_c_to_a<T>(pa, st, kk);
                tc_c_to_a<T>(da, dpt, kk);
#pragma unroll
                for (int n = 0; n < HS / 8; n++) {
                    const int query = kk * 16 + 2 * t, d = n * 8 + g;
                    tc_mma<T>(dv[n], pa, tc_pair_in_column<STRIDE>(dos, query, d),
                              tc_pair_in_column<STRIDE>(dos, query + 8, d));
                    tc_mma<T>(dk[n], da, tc_pair_in_column<STRIDE>(qs, query, d),
                              tc_pair_in_column<STRIDE>(qs, query + 8, d));
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = keys_of[r];
        if (key >= seq_len) continue;
        T* row = dqkv + ((long long)b * seq_len + key) * W + QW + kvh * HS;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = n * 8 + 2 * t + e;
                row[d] = from_float<T>(dk[n][2 * r + e] * scale);
                row[kv_heads * HS + d] = from_float<T>(dv[n][2 * r + e]);
            }
        }
    }
}

// dq of ATTENTION_TC_QUERY_BLOCK query rows (16 per warp), walking key tiles of KEYS up to the
// block's last query. grid (ceil(T / ATTENTION_TC_QUERY_BLOCK), NH, B), block 4 warps.
template <typename T, int HS, int KEYS>
__device__ void attention_tc_backward_dq(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta,
                                         int seq_len, int n_head, int kv_heads, float scale) {
    constexpr int STRIDE = HS + ATTENTION_TC_PAD;
    __shared__ __align__(16) dsplan_u16 ks[KEYS * STRIDE];
    __shared__ __align__(16) dsplan_u16 vs[KEYS * STRIDE];
    const int QW = n_head * HS, W = (n_head + 2 * kv_heads) * HS;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (n_head / kv_heads);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int q0 = blockIdx.x * ATTENTION_TC_QUERY_BLOCK, qw = q0 + warp * 16;
    const int rows_of[2] = {qw + g, qw + g + 8};
    const dsplan_u16* rows = reinterpret_cast<const dsplan_u16*>(qkv) + (long long)b * seq_len * W;
    const dsplan_u16* kbase = rows + QW + kvh * HS;
    const dsplan_u16* vbase = kbase + kv_heads * HS;
    unsigned qf[HS / 16][4], gf[HS / 16][4];
    tc_global_a<HS>(qf, rows + h * HS, W, qw, seq_len);
    tc_global_a<HS>(gf, reinterpret_cast<const dsplan_u16*>(dout) + (long long)b * seq_len * QW + h * HS, QW, qw,
                    seq_len);
    float row_lse[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const bool in = rows_of[r] < seq_len;
        const long long stat = ((long long)b * n_head + h) * seq_len + (in ? rows_of[r] : 0);
        row_lse[r] = in ? lse[stat] : 0.0f;
        row_delta[r] = in ? delta[stat] : 0.0f;
    }
    float dq[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    const int last_query = min(q0 + ATTENTION_TC_QUERY_BLOCK, seq_len) - 1;
    const int warp_last = min(qw + 15, seq_len - 1);
    for (int k0 = 0; k0 <= last_query; k0 += KEYS) {
        __syncthreads();
        tc_load_rows<KEYS, HS>(ks, kbase, W, k0, seq_len);
        tc_load_rows<KEYS, HS>(vs, vbase, W, k0, seq_len);
        __syncthreads();
        if (k0 > warp_last) continue;
        float s[KEYS / 8][4], dp[KEYS / 8][4];
#pragma unroll
        for (int j = 0; j < KEYS / 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HS / 16; kk++) {
                const int c = kk * 16 + 2 * t;
                tc_mma<T>(s[j], qf[kk], tc_pair_in_row<STRIDE>(ks, j * 8 + g, c),
                          tc_pair_in_row<STRIDE>(ks, j * 8 + g, c + 8));
                tc_mma<T>(dp[j], gf[kk], tc_pair_in_row<STRIDE>(vs, j * 8 + g, c),
                          tc_pair_in_row<STRIDE>(vs, j * 8 + g, c + 8));
            }
        }
#pragma unroll
        for (int j = 0; j < KEYS / 8; j++) {
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int key = k0 + j * 8 + 2 * t + (c & 1), r = c >> 1;
                const bool visible = key <= rows_of[r] && rows_of[r] < seq_len;
                const float p = visible ? expf(s[j][c] * scale - row_lse[r]) : 0.0f;
                s[j][c] = p * (dp[j][c] - row_delta[r]);
            }
        }
        // dQ += dS K: k runs over the tile's keys.
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; kk++) {
            unsigned da[4];
            tc_c_to_a<T>(da, s, kk);
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                const int key = kk * 16 + 2 * t, d = n * 8 + g;
                tc_mma<T>(dq[n], da, tc_pair_in_column<STRIDE>(ks, key, d), tc_pair_in_column<STRIDE>(ks, key + 8, d));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = rows_of[r];
        if (row >= seq_len) continue;
        T* y = dqkv + ((long long)b * seq_len + row) * W + h * HS;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            y[n * 8 + 2 * t] = from_float<T>(dq[n][2 * r] * scale);
            y[n * 8 + 2 * t + 1] = from_float<T>(dq[n][2 * r + 1] * scale);
        }
    }
}

// Entry points. dk/dv: <T, HS, WARPS, QTILE> = 4 warps (64 keys) and 64-query tiles at hs 64,
// 2 warps (32 keys) and 32-query tiles at hs 128 (shared tiles under the 48 KiB static limit).
// dq: key tiles of 64 at hs 64, 32 at hs 128 (registers).
extern "C" __global__ void attention_tc_forward_hs64_bf16(bf16* out, float* lse, const bf16* qkv, int seq_len, int n_head, float scale) { attention_tc_forward<bf16, 64>(out, lse, qkv, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_forward_hs64_f16(f16* out, float* lse, const f16* qkv, int seq_len, int n_head, float scale) { attention_tc_forward<f16, 64>(out, lse, qkv, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_forward_hs128_bf16(bf16* out, float* lse, const bf16* qkv, int seq_len, int n_head, float scale) { attention_tc_forward<bf16, 128>(out, lse, qkv, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_forward_hs128_f16(f16* out, float* lse, const f16* qkv, int seq_len, int n_head, float scale) { attention_tc_forward<f16, 128>(out, lse, qkv, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_backward_dkdv_hs64_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_tc_backward_dkdv<bf16, 64, 4, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_backward_dkdv_hs64_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_tc_backward_dkdv<f16, 64, 4, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_backward_dkdv_hs128_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_tc_backward_dkdv<bf16, 128, 2, 32>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_backward_dkdv_hs128_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_tc_backward_dkdv<f16, 128, 2, 32>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_backward_dq_hs64_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_tc_backward_dq<bf16, 64, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_backward_dq_hs64_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_tc_backward_dq<f16, 64, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_backward_dq_hs128_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_tc_backward_dq<bf16, 128, 32>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_backward_dq_hs128_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_tc_backward_dq<f16, 128, 32>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_tc_forward_gqa_hs64_bf16(bf16* out, float* lse, const bf16* qkv, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_forward<bf16, 64>(out, lse, qkv, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_tc_forward_gqa_hs64_f16(f16* out, float* lse, const f16* qkv, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_forward<f16, 64>(out, lse, qkv, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_tc_forward_gqa_hs128_bf16(bf16* out, float* lse, const bf16* qkv, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_forward<bf16, 128>(out, lse, qkv, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_tc_forward_gqa_hs128_f16(f16* out, float* lse, const f16* qkv, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_forward<f16, 128>(out, lse, qkv, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_tc_backward_dkdv_gqa_hs64_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_backward_dkdv<bf16, 64, 4, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_tc_backward_dkdv_gqa_hs64_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_backward_dkdv<f16, 64, 4, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_tc_backward_dkdv_gqa_hs128_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_backward_dkdv<bf16, 128, 2, 32>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_tc_backward_dkdv_gqa_hs128_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_backward_dkdv<f16, 128, 2, 32>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_tc_backward_dq_gqa_hs64_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_backward_dq<bf16, 64, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_tc_backward_dq_gqa_hs64_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_backward_dq<f16, 64, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_tc_backward_dq_gqa_hs128_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_backward_dq<bf16, 128, 32>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_tc_backward_dq_gqa_hs128_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_tc_backward_dq<f16, 128, 32>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
