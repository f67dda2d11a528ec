// LayerNorm over the channels of each row, forward and backward, and the forward fused with
// the residual add that precedes it in a transformer block.
// CPU references: executor::model::layernorm::{layernorm_forward, layernorm_backward},
// executor::model::residual::residual_forward.
//
// One warp per row. The backward kernel (16-byte loads for 16-bit rows of whole chunks, else
// 16-bit loads) writes dinp and, per block of
// LAYERNORM_BACKWARD_ROWS rows, a partial (dweight, dbias) into f32 scratch, summed over the
// block's rows in row order; add_partials (reduce.cu) then adds the partials onto dweight and
// dbias in block order. The CPU sums in chunks of the same 32 rows in the same order.

#define LAYERNORM_THREADS 256
#define LAYERNORM_BACKWARD_ROWS 32

// Normalises the row `x` (already in memory) into `y`; writes mean and rstd when non-null.
template <typename T>
__device__ __forceinline__ void normalise_row(T* y, float* mean, float* rstd, const T* x, const T* weight,
                                              const T* bias, int row, int channels, float eps) {
    const int lane = threadIdx.x & 31;
    float s = 0.0f;
    for (int c = lane; c < channels; c += 32) s += to_float(x[c]);
    const float m = warp_sum(s) / channels;
    float v = 0.0f;
    for (int c = lane; c < channels; c += 32) {
        const float d = to_float(x[c]) - m;
        v += d * d;
    }
    const float r = 1.0f / sqrtf(warp_sum(v) / channels + eps);
    for (int c = lane; c < channels; c += 32)
        y[c] = from_float<T>((to_float(x[c]) - m) * r * to_float(weight[c]) + to_float(bias[c]));
    if (lane == 0) {
        if (mean != nullptr) mean[row] = m;
        if (rstd != nullptr) rstd[row] = r;
    }
}

// out = layernorm(inp); mean, rstd (rows) written when non-null.
template <typename T>
__device__ void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                                  int rows, int channels, float eps) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const long long base = (long long)row * channels;
    normalise_row(out + base, mean, rstd, inp + base, weight, bias, row, channels, eps);
}

// residual = a + b; out = layernorm(residual), in one pass over the row.
template <typename T>
__device__ void residual_layernorm_forward(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                           const T* weight, const T* bias, int rows, int channels, float eps) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    const long long base = (long long)row * channels;
    for (int c = lane; c < channels; c += 32)
        residual[base + c] = from_float<T>(to_float(a[base + c]) + to_float(b[base + c]));
    __syncwarp();
    normalise_row(out + base, mean, rstd, residual + base, weight, bias, row, channels, eps);
}

// Chunks of 8 channels (16 bytes of a 16-bit type) a lane of the vectorised backward holds:
// rows of up to 32 * 8 * 4 = 1024 channels (GPT-2 124M's 768, gpt2-medium's 1024).
#define LAYERNORM_BACKWARD_LANE_CHUNKS 4

// 8 consecutive 16-bit values of type T from 16-byte aligned `p`, as f32.
template <typename T>
__device__ __forceinline__ void load8(float (&v)[8], const T* p) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = to_float(T{(dsplan_u16)(words[i] & 0xffffu)});
        v[2 * i + 1] = to_float(T{(dsplan_u16)(words[i] >> 16)});
    }
}

// 8 f32 rounded to the 16-bit type T, stored at 16-byte aligned `p`.
template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&v)[8]) {
    unsigned words[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        words[i] = (unsigned)from_float<T>(v[2 * i]).bits | ((unsigned)from_float<T>(v[2 * i + 1]).bits << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
}

// Whether the vectorised backward applies (to a 16-bit type): rows a whole number of 16-byte chunks
// and at most LAYERNORM_BACKWARD_LANE_CHUNKS per lane, every row 16-byte aligned.
template <typename T>
__device__ __forceinline__ bool layernorm_backward_vectorised(const T* dinp, const T* dout, const T* inp,
                                                              const T* weight, int channels) {
    const unsigned long long addresses =
        reinterpret_cast<unsigned long long>(dinp) | reinterpret_cast<unsigned long long>(dout) |
        reinterpret_cast<unsigned long long>(inp) | reinterpret_cast<unsigned long long>(weight);
    return channels % 8 == 0 && channels <= 32 * 8 * LAYERNORM_BACKWARD_LANE_CHUNKS && (addresses & 15ull) == 0;
}

// layernorm_backward's work on rows first..last with 16-byte loads and stores: a warp per row,
// a lane holding its chunks of the row in registers between the two sums and the update; the
// partials are the same sums in the same row order as the scalar path's.
template <typename T>
__device__ void layernorm_backward_chunks(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                          const float* mean, const float* rstd, int first, int last,
                                          int channels) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int chunks = channels / 8;
    for (int row = first + warp; row < last; row += warps) {
        const long long base = (long long)row * channels;
        const float m = mean[row], s = rstd[row];
        float norm[LAYERNORM_BACKWARD_LANE_CHUNKS][8], dnorm[LAYERNORM_BACKWARD_LANE_CHUNKS][8];
        float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma unroll
        for (int k = 0; k < LAYERNORM_BACKWARD_LANE_CHUNKS; k++) {
            const int c = (lane + 32 * k) * 8;
            if (c >= channels) continue;
            float w[8];
            load8(norm[k], inp + base + c);
            load8(dnorm[k], dout + base + c);
            load8(w, weight + c);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                norm[k][i] = (norm[k][i] - m) * s;
                dnorm[k][i] *= w[i];
                dnorm_sum += dnorm[k][i];
                dnorm_norm_sum += dnorm[k][i] * norm[k][i];
            }
        }
        const float dnorm_mean = warp_sum(dnorm_sum) / channels;
        const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / channels;
#pragma unroll
        for (int k = 0; k < LAYERNORM_BACKWARD_LANE_CHUNKS; k++) {
            const int c = (lane + 32 * k) * 8;
            if (c >= channels) continue;
            float d[8];
            load8(d, dinp + base + c);
#pragma unroll
            for (int i = 0; i < 8; i++) d[i] += (dnorm[k][i] - dnorm_mean - norm[k][i] * dnorm_norm_mean) * s;
            store8(dinp + base + c, d);
        }
    }
    float* partial = partials + (long long)blockIdx.x * 2 * channels;
    for (int j = threadIdx.x; j < chunks; j += blockDim.x) {
        const int c = j * 8;
        float pw[8], pb[8];
#pragma unroll
        for (int i = 0; i < 8; i++) pw[i] = pb[i] = 0.0f;
#pragma unroll 4
        for (int row = first; row < last; row++) {
            const long long at = (long long)row * channels + c;
            float x[8], dy[8];
            load8(x, inp + at);
            load8(dy, dout + at);
            const float m = mean[row], s = rstd[row];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                pw[i] += (x[i] - m) * s * dy[i];
                pb[i] += dy[i];
            }
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            partial[c + i] = pw[i];
            partial[channels + c + i] = pb[i];
        }
    }
}

// dinp += d layernorm / d inp; partials[block] = (sum of norm * dout, sum of dout) over the
// block's rows, each `channels` wide. 16-bit rows of whole 16-byte chunks take the vectorised
// path (the first H100 profile, 2026-11-27: the 16-bit loads below cost 0.62 ms a launch on
// GPT-2's 16,384 x 768 rows, ten times the bytes' time).
template <typename T>
__device__ void layernorm_backward(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                   const float* mean, const float* rstd, int rows, int channels) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int first = blockIdx.x * LAYERNORM_BACKWARD_ROWS;
    const int last = min(first + LAYERNORM_BACKWARD_ROWS, rows);
    if constexpr (sizeof(T) == 2) {
        if (layernorm_backward_vectorised(dinp, dout, inp, weight, channels)) {
            layernorm_backward_chunks(dinp, partials, dout, inp, weight, mean, rstd, first, last, channels);
            return;
        }
    }
    for (int row = first + warp; row < last; row += warps) {
        const long long base = (long long)row * channels;
        const float m = mean[row], s = rstd[row];
        float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
        for (int c = lane; c < channels; c += 32) {
            const float norm = (to_float(inp[base + c]) - m) * s;
            const float dnorm = to_float(dout[base + c]) * to_float(weight[c]);
            dnorm_sum += dnorm;
            dnorm_norm_sum += dnorm * norm;
        }
        const float dnorm_mean = warp_sum(dnorm_sum) / channels;
        const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / channels;
        for (int c = lane; c < channels; c += 32) {
            const float norm = (to_float(inp[base + c]) - m) * s;
            const float dnorm = to_float(dout[base + c]) * to_float(weight[c]);
            const float grad = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
            dinp[base + c] = from_float<T>(to_float(dinp[base + c]) + grad);
        }
    }
    float* partial = partials + (long long)blockIdx.x * 2 * channels;
    for (int c = threadIdx.x; c < channels; c += blockDim.x) {
        float pw = 0.0f, pb = 0.0f;
        for (int row = first; row < last; row++) {
            const long long i = (long long)row * channels + c;
            const float dy = to_float(dout[i]);
            pw += (to_float(inp[i]) - mean[row]) * rstd[row] * dy;
            pb += dy;
        }
        partial[c] = pw;
        partial[channels + c] = pb;
    }
}

extern "C" __global__ void layernorm_forward_f32(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, int rows, int channels, float eps) { layernorm_forward(out, mean, rstd, inp, weight, bias, rows, channels, eps); }
extern "C" __global__ void layernorm_forward_bf16(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias, int rows, int channels, float eps) { layernorm_forward(out, mean, rstd, inp, weight, bias, rows, channels, eps); }
extern "C" __global__ void layernorm_forward_f16(f16* out, float* mean, float* rstd, const f16* inp, const f16* weight, const f16* bias, int rows, int channels, float eps) { layernorm_forward(out, mean, rstd, inp, weight, bias, rows, channels, eps); }

extern "C" __global__ void residual_layernorm_forward_f32(float* residual, float* out, float* mean, float* rstd, const float* a, const float* b, const float* weight, const float* bias, int rows, int channels, float eps) { residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias, rows, channels, eps); }
extern "C" __global__ void residual_layernorm_forward_bf16(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b, const bf16* weight, const bf16* bias, int rows, int channels, float eps) { residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias, rows, channels, eps); }
extern "C" __global__ void residual_layernorm_forward_f16(f16* residual, f16* out, float* mean, float* rstd, const f16* a, const f16* b, const f16* weight, const f16* bias, int rows, int channels, float eps) { residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias, rows, channels, eps); }

extern "C" __global__ void layernorm_backward_f32(float* dinp, float* partials, const float* dout, const float* inp, const float* weight, const float* mean, const float* rstd, int rows, int channels) { layernorm_backward(dinp, partials, dout, inp, weight, mean, rstd, rows, channels); }
extern "C" __global__ void layernorm_backward_bf16(bf16* dinp, float* partials, const bf16* dout, const bf16* inp, const bf16* weight, const float* mean, const float* rstd, int rows, int channels) { layernorm_backward(dinp, partials, dout, inp, weight, mean, rstd, rows, channels); }
extern "C" __global__ void layernorm_backward_f16(f16* dinp, float* partials, const f16* dout, const f16* inp, const f16* weight, const float* mean, const float* rstd, int rows, int channels) { layernorm_backward(dinp, partials, dout, inp, weight, mean, rstd, rows, channels); }
