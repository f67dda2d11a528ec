// RMSNorm over the channels of each row (Llama, Qwen2, Mistral), forward and backward.
// CPU references: executor::model::rmsnorm::{rmsnorm_forward, rmsnorm_backward}.
//
// As transformers computes it: the row is widened to f32, rstd = 1 / sqrt(mean(x^2) + eps) in
// f32, the normalised row x * rstd is rounded to the storage type, then multiplied by the
// weight (so in f32 storage it is exactly w * (x * rstd), the CPU's order). One warp per row.
// The backward kernel writes dinp (accumulated) and, per block of RMSNORM_BACKWARD_ROWS rows,
// a partial dweight in f32 scratch (ceil(N / 32), C), summed over the block's rows in row
// order; add_partials (reduce.cu) then adds the partials onto dweight in block order. The CPU
// sums in chunks of the same 32 rows in the same order.

#define RMSNORM_THREADS 256
#define RMSNORM_BACKWARD_ROWS 32

// out = weight * (inp * rstd); rstd (rows) written. One warp per row.
template <typename T>
__device__ void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int rows, int channels,
                                float eps) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    const long long base = (long long)row * channels;
    float s = 0.0f;
    for (int c = lane; c < channels; c += 32) {
        const float x = to_float(inp[base + c]);
        s += x * x;
    }
    const float r = 1.0f / sqrtf(warp_sum(s) / channels + eps);
    for (int c = lane; c < channels; c += 32) {
        const float normed = to_float(from_float<T>(to_float(inp[base + c]) * r));
        out[base + c] = from_float<T>(to_float(weight[c]) * normed);
    }
    if (lane == 0) rstd[row] = r;
}

// dinp += d rmsnorm / d inp; partials[block] = sum over the block's rows of dout * inp * rstd.
// With n = x * rstd and g = dout * w: dinp += rstd * (g - n * mean(g * n)).
template <typename T>
__device__ void rmsnorm_backward(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                 const float* rstd, int rows, int channels) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int first = blockIdx.x * RMSNORM_BACKWARD_ROWS;
    const int last = min(first + RMSNORM_BACKWARD_ROWS, rows);
    for (int row = first + warp; row < last; row += warps) {
        const long long base = (long long)row * channels;
        const float s = rstd[row];
        float gn = 0.0f;
        for (int c = lane; c < channels; c += 32) {
            const float n = to_float(inp[base + c]) * s;
            gn += to_float(dout[base + c]) * to_float(weight[c]) * n;
        }
        const float gn_mean = warp_sum(gn) / channels;
        for (int c = lane; c < channels; c += 32) {
            const float n = to_float(inp[base + c]) * s;
            const float g = to_float(dout[base + c]) * to_float(weight[c]);
            dinp[base + c] = from_float<T>(to_float(dinp[base + c]) + s * (g - n * gn_mean));
        }
    }
    float* partial = partials + (long long)blockIdx.x * channels;
    for (int c = threadIdx.x; c < channels; c += blockDim.x) {
        float pw = 0.0f;
        for (int row = first; row < last; row++) {
            const long long i = (long long)row * channels + c;
            pw += to_float(dout[i]) * (to_float(inp[i]) * rstd[row]);
        }
        partial[c] = pw;
    }
}

extern "C" __global__ void rmsnorm_forward_f32(float* out, float* rstd, const float* inp, const float* weight, int rows, int channels, float eps) { rmsnorm_forward(out, rstd, inp, weight, rows, channels, eps); }
extern "C" __global__ void rmsnorm_forward_bf16(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int rows, int channels, float eps) { rmsnorm_forward(out, rstd, inp, weight, rows, channels, eps); }
extern "C" __global__ void rmsnorm_forward_f16(f16* out, float* rstd, const f16* inp, const f16* weight, int rows, int channels, float eps) { rmsnorm_forward(out, rstd, inp, weight, rows, channels, eps); }

extern "C" __global__ void rmsnorm_backward_f32(float* dinp, float* partials, const float* dout, const float* inp, const float* weight, const float* rstd, int rows, int channels) { rmsnorm_backward(dinp, partials, dout, inp, weight, rstd, rows, channels); }
extern "C" __global__ void rmsnorm_backward_bf16(bf16* dinp, float* partials, const bf16* dout, const bf16* inp, const bf16* weight, const float* rstd, int rows, int channels) { rmsnorm_backward(dinp, partials, dout, inp, weight, rstd, rows, channels); }
extern "C" __global__ void rmsnorm_backward_f16(f16* dinp, float* partials, const f16* dout, const f16* inp, const f16* weight, const float* rstd, int rows, int channels) { rmsnorm_backward(dinp, partials, dout, inp, weight, rstd, rows, channels); }
