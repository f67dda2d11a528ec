// LayerNorm over the channels of each row, forward and backward, and the forward fused with
// the residual add that precedes it in a transformer block.
// CPU references: executor::model::layernorm::{layernorm_forward, layernorm_backward},
// executor::model::residual::residual_forward.
//
// One warp per row. The backward kernel writes dinp and, per block of
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

// dinp += d layernorm / d inp; partials[block] = (sum of norm * dout, sum of dout) over the
// block's rows, each `channels` wide.
template <typename T>
__device__ void layernorm_backward(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                   const float* mean, const float* rstd, int rows, int channels) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int first = blockIdx.x * LAYERNORM_BACKWARD_ROWS;
    const int last = min(first + LAYERNORM_BACKWARD_ROWS, rows);
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
