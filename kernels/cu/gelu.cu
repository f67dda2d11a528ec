// GELU (tanh approximation, Hugging Face gelu_new) and the bias add that precedes it.
// CPU references: executor::model::gelu::{gelu_forward, gelu_backward_inplace}; the bias add
// is the one in executor::model::matmul::matmul_forward.
//
// Same formula as the CPU: 0.5 * (1 + tanh(u)) computed as sigmoid(2u), one expf.

#define GELU_THREADS 256
#define GELU_SQRT_2_OVER_PI 0.7978846f
#define GELU_CUBIC 0.044715f

__device__ __forceinline__ float half_one_plus_tanh(float x) {
    const float u = GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    return 1.0f / (1.0f + expf(-2.0f * u));
}

// out = gelu(inp), element-wise.
template <typename T>
__device__ void gelu_forward(T* out, const T* inp, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = to_float(inp[i]);
    out[i] = from_float<T>(x * half_one_plus_tanh(x));
}

// pre[row, c] += bias[c] (pre holds the GEMM output without bias); out = gelu(pre).
// `pre` is kept for the backward pass.
template <typename T>
__device__ void bias_gelu_forward(T* pre, T* out, const T* bias, int rows, int width) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * width) return;
    const T stored = from_float<T>(to_float(pre[i]) + to_float(bias[i % width]));
    pre[i] = stored;
    const float x = to_float(stored);
    out[i] = from_float<T>(x * half_one_plus_tanh(x));
}

// d = gelu'(inp) * d, in place.
template <typename T>
__device__ void gelu_backward_inplace(T* d, const T* inp, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = to_float(inp[i]);
    const float s = half_one_plus_tanh(x);
    const float du = GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * x * x);
    d[i] = from_float<T>(to_float(d[i]) * (s + x * 2.0f * s * (1.0f - s) * du));
}

extern "C" __global__ void gelu_forward_f32(float* out, const float* inp, long long n) { gelu_forward(out, inp, n); }
extern "C" __global__ void gelu_forward_bf16(bf16* out, const bf16* inp, long long n) { gelu_forward(out, inp, n); }
extern "C" __global__ void gelu_forward_f16(f16* out, const f16* inp, long long n) { gelu_forward(out, inp, n); }

extern "C" __global__ void bias_gelu_forward_f32(float* pre, float* out, const float* bias, int rows, int width) { bias_gelu_forward(pre, out, bias, rows, width); }
extern "C" __global__ void bias_gelu_forward_bf16(bf16* pre, bf16* out, const bf16* bias, int rows, int width) { bias_gelu_forward(pre, out, bias, rows, width); }
extern "C" __global__ void bias_gelu_forward_f16(f16* pre, f16* out, const f16* bias, int rows, int width) { bias_gelu_forward(pre, out, bias, rows, width); }

extern "C" __global__ void gelu_backward_inplace_f32(float* d, const float* inp, long long n) { gelu_backward_inplace(d, inp, n); }
extern "C" __global__ void gelu_backward_inplace_bf16(bf16* d, const bf16* inp, long long n) { gelu_backward_inplace(d, inp, n); }
extern "C" __global__ void gelu_backward_inplace_f16(f16* d, const f16* inp, long long n) { gelu_backward_inplace(d, inp, n); }
