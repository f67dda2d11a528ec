// Causal multi-head self-attention, flash-attention style: the T x T score matrix is never
// stored. The forward pass keeps a running max and sum per query row (online softmax) and saves
// only logsumexp per row; the backward pass recomputes the probabilities tile by tile.
// CPU references: executor::model::attention::{attention_forward, attention_backward}
// (those keep the probabilities (B, NH, T, T); the outputs and gradients must agree).
//
// Layouts: qkv (B, T, W), each row [q | k | v] with NH query heads and KV key/value heads
// (W = (NH + 2 KV) HS; KV = NH for multi-head attention, W = 3C), query head h in columns
// h*HS .. (h+1)*HS of q, and it reads key/value head h / (NH / KV) (grouped-query attention,
// Llama/Qwen2/Mistral); out (B, T, NH*HS); lse and delta (B, NH, T) f32; dqkv (B, T, W),
// written (not accumulated). scale = head_dim^-0.5, passed in by the host as the CPU rounds it.
// CPU references for grouped-query attention:
// executor::model::attention::{grouped_attention_forward, grouped_attention_backward}.
// The `_gqa_` entry points take KV; the others are the same code with KV = NH.
//
// The head size is a template parameter (64 and 128 are instantiated) so the per-thread rows
// live in registers. One thread per query row (forward, dq) or key row (dk/dv); tiles of the
// other side are staged in shared memory. Deterministic: no atomics.
// Scalar FMA arithmetic, no tensor cores: a correct baseline the tensor-core version must match.

#define ATTENTION_QUERY_BLOCK 64
#define ATTENTION_KEY_TILE 32
#define ATTENTION_PREPROCESS_THREADS 256

// out = softmax(q k^T * scale + causal mask) v; lse = logsumexp of each row's scaled scores.
// grid (ceil(T / ATTENTION_QUERY_BLOCK), NH, B), block ATTENTION_QUERY_BLOCK.
template <typename T, int HS>
__device__ void attention_forward(T* out, float* lse, const T* qkv, int seq_len, int n_head, int kv_heads,
                                  float scale) {
    __shared__ float ks[ATTENTION_KEY_TILE][HS];
    __shared__ float vs[ATTENTION_KEY_TILE][HS];
    const int QW = n_head * HS, W = (n_head + 2 * kv_heads) * HS;
    const int b = blockIdx.z, h = blockIdx.y;
    const int kvh = h / (n_head / kv_heads);
    const int q0 = blockIdx.x * blockDim.x;
    const int qi = q0 + threadIdx.x;
    const bool active = qi < seq_len;
    const T* rows = qkv + (long long)b * seq_len * W;
    const T* qbase = rows + h * HS;
    const T* kbase = rows + QW + kvh * HS;
    const T* vbase = kbase + kv_heads * HS;
    float q[HS], o[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) {
        q[d] = active ? to_float(qbase[(long long)qi * W + d]) : 0.0f;
        o[d] = 0.0f;
    }
    float m = DSPLAN_NEG_INF, l = 0.0f;
    const int last_query = min(q0 + (int)blockDim.x, seq_len) - 1;
    for (int k0 = 0; k0 <= last_query; k0 += ATTENTION_KEY_TILE) {
        __syncthreads();
        for (int e = threadIdx.x; e < ATTENTION_KEY_TILE * HS; e += blockDim.x) {
            const int j = e / HS, d = e % HS, key = k0 + j;
            float kv = 0.0f, vv = 0.0f;
            if (key < seq_len) {
                kv = to_float(kbase[(long long)key * W + d]);
                vv = to_float(vbase[(long long)key * W + d]);
            }
            ks[j][d] = kv;
            vs[j][d] = vv;
        }
        __syncthreads();
        if (!active) continue;
        const int visible = min(ATTENTION_KEY_TILE, qi - k0 + 1);
        for (int j = 0; j < visible; j++) {
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < HS; d++) dot += q[d] * ks[j][d];
            const float s = dot * scale;
            if (s > m) {
                const float correction = expf(m - s);
                l *= correction;
#pragma unroll
                for (int d = 0; d < HS; d++) o[d] *= correction;
                m = s;
            }
            const float p = expf(s - m);
            l += p;
#pragma unroll
            for (int d = 0; d < HS; d++) o[d] += p * vs[j][d];
        }
    }
    if (!active) return;
    const float inv = 1.0f / l;
    T* y = out + ((long long)b * seq_len + qi) * QW + h * HS;
#pragma unroll
    for (int d = 0; d < HS; d++) y[d] = from_float<T>(o[d] * inv);
    lse[((long long)b * n_head + h) * seq_len + qi] = m + logf(l);
}

// delta[b, h, t] = sum_d dout[b, t, h, d] * out[b, t, h, d] (= rowsum(P * dP)).
// One warp per (b, h, t); block ATTENTION_PREPROCESS_THREADS.
template <typename T>
__device__ void attention_backward_preprocess(float* delta, const T* dout, const T* out, int batch, int seq_len,
                                              int n_head, int head_dim) {
    const long long w = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= (long long)batch * n_head * seq_len) return;
    const int t = (int)(w % seq_len);
    const long long bh = w / seq_len;
    const int h = (int)(bh % n_head), b = (int)(bh / n_head);
    const int C = n_head * head_dim;
    const long long base = ((long long)b * seq_len + t) * C + h * head_dim;
    float acc = 0.0f;
    for (int d = lane; d < head_dim; d += 32) acc += to_float(dout[base + d]) * to_float(out[base + d]);
    acc = warp_sum(acc);
    if (lane == 0) delta[w] = acc;
}

// dk, dv for KEYS key rows per block (one thread each) of key/value head blockIdx.y, walking,
// for each query head of its group in order, the query tiles at or after the block's first
// key. grid (ceil(T / KEYS), KV, B), block KEYS.
template <typename T, int HS, int KEYS, int QTILE>
__device__ void attention_backward_dkdv(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta,
                                        int seq_len, int n_head, int kv_heads, float scale) {
    __shared__ float kt[KEYS][HS + 1];
    __shared__ float vt[KEYS][HS + 1];
    __shared__ float qt[QTILE][HS];
    __shared__ float dot_[QTILE][HS];
    __shared__ float lse_t[QTILE];
    __shared__ float delta_t[QTILE];
    const int QW = n_head * HS, W = (n_head + 2 * kv_heads) * HS;
    const int b = blockIdx.z, kvh = blockIdx.y;
    const int group = n_head / kv_heads;
    const int k0 = blockIdx.x * KEYS;
    const int key = k0 + threadIdx.x;
    const bool active = key < seq_len;
    const T* rows = qkv + (long long)b * seq_len * W;
    const T* kbase = rows + QW + kvh * HS;
    const T* vbase = kbase + kv_heads * HS;
    for (int d = 0; d < HS; d++) {
        kt[threadIdx.x][d] = active ? to_float(kbase[(long long)key * W + d]) : 0.0f;
        vt[threadIdx.x][d] = active ? to_float(vbase[(long long)key * W + d]) : 0.0f;
    }
    float dk[HS], dv[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) dk[d] = dv[d] = 0.0f;
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        const T* qbase = rows + h * HS;
        const T* dbase = dout + (long long)b * seq_len * QW + h * HS;
        const float* lse_bh = lse + ((long long)b * n_head + h) * seq_len;
        const float* delta_bh = delta + ((long long)b * n_head + h) * seq_len;
        for (int q0 = k0; q0 < seq_len; q0 += QTILE) {
            __syncthreads();
            for (int e = threadIdx.x; e < QTILE * HS; e += blockDim.x) {
                const int i = e / HS, d = e % HS, query = q0 + i;
                const bool in = query < seq_len;
                qt[i][d] = in ? to_float(qbase[(long long)query * W + d]) : 0.0f;
                dot_[i][d] = in ? to_float(dbase[(long long)query * QW + d]) : 0.0f;
            }
            for (int i = threadIdx.x; i < QTILE; i += blockDim.x) {
                const int query = q0 + i;
                lse_t[i] = query < seq_len ? lse_bh[query] : 0.0f;
                delta_t[i] = query < seq_len ? delta_bh[query] : 0.0f;
            }
            __syncthreads();
            if (!active) continue;
            for (int i = 0; i < QTILE; i++) {
                const int query = q0 + i;
                if (query >= seq_len || query < key) continue;
                float s = 0.0f, dp = 0.0f;
#pragma unroll
                for (int d = 0; d < HS; d++) {
                    s += qt[i][d] * kt[threadIdx.x][d];
                    dp += dot_[i][d] * vt[threadIdx.x][d];
                }
                const float p = expf(s * scale - lse_t[i]);
                const float ds = p * (dp - delta_t[i]) * scale;
#pragma unroll
                for (int d = 0; d < HS; d++) {
                    dv[d] += p * dot_[i][d];
                    dk[d] += ds * qt[i][d];
                }
            }
        }
    }
    if (!active) return;
    T* row = dqkv + ((long long)b * seq_len + key) * W + QW + kvh * HS;
#pragma unroll
    for (int d = 0; d < HS; d++) {
        row[d] = from_float<T>(dk[d]);
        row[kv_heads * HS + d] = from_float<T>(dv[d]);
    }
}

// dq for one query row per thread, walking the key tiles up to the block's last query.
// grid (ceil(T / ATTENTION_QUERY_BLOCK), NH, B), block ATTENTION_QUERY_BLOCK.
template <typename T, int HS>
__device__ void attention_backward_dq(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta,
                                      int seq_len, int n_head, int kv_heads, float scale) {
    __shared__ float ks[ATTENTION_KEY_TILE][HS];
    __shared__ float vs[ATTENTION_KEY_TILE][HS];
    const int QW = n_head * HS, W = (n_head + 2 * kv_heads) * HS;
    const int b = blockIdx.z, h = blockIdx.y;
    const int kvh = h / (n_head / kv_heads);
    const int q0 = blockIdx.x * blockDim.x;
    const int qi = q0 + threadIdx.x;
    const bool active = qi < seq_len;
    const T* rows = qkv + (long long)b * seq_len * W;
    const T* qbase = rows + h * HS;
    const T* kbase = rows + QW + kvh * HS;
    const T* vbase = kbase + kv_heads * HS;
    const T* dy = dout + ((long long)b * seq_len + (active ? qi : 0)) * QW + h * HS;
    float q[HS], g[HS], dq[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) {
        q[d] = active ? to_float(qbase[(long long)qi * W + d]) : 0.0f;
        g[d] = active ? to_float(dy[d]) : 0.0f;
        dq[d] = 0.0f;
    }
    const long long stat = ((long long)b * n_head + h) * seq_len + (active ? qi : 0);
    const float row_lse = lse[stat], row_delta = delta[stat];
    const int last_query = min(q0 + (int)blockDim.x, seq_len) - 1;
    for (int k0 = 0; k0 <= last_query; k0 += ATTENTION_KEY_TILE) {
        __syncthreads();
        for (int e = threadIdx.x; e < ATTENTION_KEY_TILE * HS; e += blockDim.x) {
            const int j = e / HS, d = e % HS, key = k0 + j;
            float kv = 0.0f, vv = 0.0f;
            if (key < seq_len) {
                kv = to_float(kbase[(long long)key * W + d]);
                vv = to_float(vbase[(long long)key * W + d]);
            }
            ks[j][d] = kv;
            vs[j][d] = vv;
        }
        __syncthreads();
        if (!active) continue;
        const int visible = min(ATTENTION_KEY_TILE, qi - k0 + 1);
        for (int j = 0; j < visible; j++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < HS; d++) {
                s += q[d] * ks[j][d];
                dp += g[d] * vs[j][d];
            }
            const float p = expf(s * scale - row_lse);
            const float ds = p * (dp - row_delta) * scale;
#pragma unroll
            for (int d = 0; d < HS; d++) dq[d] += ds * ks[j][d];
        }
    }
    if (!active) return;
    T* row = dqkv + ((long long)b * seq_len + qi) * W + h * HS;
#pragma unroll
    for (int d = 0; d < HS; d++) row[d] = from_float<T>(dq[d]);
}

extern "C" __global__ void attention_forward_hs64_f32(float* out, float* lse, const float* qkv, int seq_len, int n_head, float scale) { attention_forward<float, 64>(out, lse, qkv, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_forward_hs64_bf16(bf16* out, float* lse, const bf16* qkv, int seq_len, int n_head, float scale) { attention_forward<bf16, 64>(out, lse, qkv, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_forward_hs64_f16(f16* out, float* lse, const f16* qkv, int seq_len, int n_head, float scale) { attention_forward<f16, 64>(out, lse, qkv, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dkdv_hs64_f32(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dkdv<float, 64, 64, 16>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dkdv_hs64_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dkdv<bf16, 64, 64, 16>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dkdv_hs64_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dkdv<f16, 64, 64, 16>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dq_hs64_f32(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dq<float, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dq_hs64_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dq<bf16, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dq_hs64_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dq<f16, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_forward_hs128_f32(float* out, float* lse, const float* qkv, int seq_len, int n_head, float scale) { attention_forward<float, 128>(out, lse, qkv, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_forward_hs128_bf16(bf16* out, float* lse, const bf16* qkv, int seq_len, int n_head, float scale) { attention_forward<bf16, 128>(out, lse, qkv, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_forward_hs128_f16(f16* out, float* lse, const f16* qkv, int seq_len, int n_head, float scale) { attention_forward<f16, 128>(out, lse, qkv, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dkdv_hs128_f32(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dkdv<float, 128, 32, 8>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dkdv_hs128_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dkdv<bf16, 128, 32, 8>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dkdv_hs128_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dkdv<f16, 128, 32, 8>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dq_hs128_f32(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dq<float, 128>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dq_hs128_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dq<bf16, 128>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_dq_hs128_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, float scale) { attention_backward_dq<f16, 128>(dqkv, dout, qkv, lse, delta, seq_len, n_head, n_head, scale); }
extern "C" __global__ void attention_backward_preprocess_f32(float* delta, const float* dout, const float* out, int batch, int seq_len, int n_head, int head_dim) { attention_backward_preprocess(delta, dout, out, batch, seq_len, n_head, head_dim); }
extern "C" __global__ void attention_backward_preprocess_bf16(float* delta, const bf16* dout, const bf16* out, int batch, int seq_len, int n_head, int head_dim) { attention_backward_preprocess(delta, dout, out, batch, seq_len, n_head, head_dim); }
extern "C" __global__ void attention_backward_preprocess_f16(float* delta, const f16* dout, const f16* out, int batch, int seq_len, int n_head, int head_dim) { attention_backward_preprocess(delta, dout, out, batch, seq_len, n_head, head_dim); }
extern "C" __global__ void attention_forward_gqa_hs64_f32(float* out, float* lse, const float* qkv, int seq_len, int n_head, int kv_heads, float scale) { attention_forward<float, 64>(out, lse, qkv, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_forward_gqa_hs64_bf16(bf16* out, float* lse, const bf16* qkv, int seq_len, int n_head, int kv_heads, float scale) { attention_forward<bf16, 64>(out, lse, qkv, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_forward_gqa_hs64_f16(f16* out, float* lse, const f16* qkv, int seq_len, int n_head, int kv_heads, float scale) { attention_forward<f16, 64>(out, lse, qkv, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dkdv_gqa_hs64_f32(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dkdv<float, 64, 64, 16>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dkdv_gqa_hs64_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dkdv<bf16, 64, 64, 16>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dkdv_gqa_hs64_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dkdv<f16, 64, 64, 16>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dq_gqa_hs64_f32(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dq<float, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dq_gqa_hs64_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dq<bf16, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dq_gqa_hs64_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dq<f16, 64>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_forward_gqa_hs128_f32(float* out, float* lse, const float* qkv, int seq_len, int n_head, int kv_heads, float scale) { attention_forward<float, 128>(out, lse, qkv, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_forward_gqa_hs128_bf16(bf16* out, float* lse, const bf16* qkv, int seq_len, int n_head, int kv_heads, float scale) { attention_forward<bf16, 128>(out, lse, qkv, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_forward_gqa_hs128_f16(f16* out, float* lse, const f16* qkv, int seq_len, int n_head, int kv_heads, float scale) { attention_forward<f16, 128>(out, lse, qkv, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dkdv_gqa_hs128_f32(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dkdv<float, 128, 32, 8>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dkdv_gqa_hs128_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dkdv<bf16, 128, 32, 8>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dkdv_gqa_hs128_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dkdv<f16, 128, 32, 8>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dq_gqa_hs128_f32(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dq<float, 128>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dq_gqa_hs128_bf16(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dq<bf16, 128>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
extern "C" __global__ void attention_backward_dq_gqa_hs128_f16(f16* dqkv, const f16* dout, const f16* qkv, const float* lse, const float* delta, int seq_len, int n_head, int kv_heads, float scale) { attention_backward_dq<f16, 128>(dqkv, dout, qkv, lse, delta, seq_len, n_head, kv_heads, scale); }
