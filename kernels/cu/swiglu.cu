// The SwiGLU activation of the Llama MLP: h = silu(gate) * up, silu(x) = x * sigmoid(x), on
// [gate | up] rows (each I wide, the two projections side by side), forward and backward.
// CPU references: executor::model::swiglu::{swiglu_forward, swiglu_backward}.
//
// One thread per element of (N, I); f32 arithmetic, as the CPU: forward g / (1 + exp(-g)) * u;
// backward with s = sigmoid(g): dgate = dh * u * s * (1 + g (1 - s)), dup = dh * g * s
// (written, not accumulated).

#define SWIGLU_THREADS 256

template <typename T>
__device__ void swiglu_forward(T* out, const T* gate_up, int rows, int inner) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * inner) return;
    const long long row = i / inner;
    const int k = (int)(i % inner);
    const T* r = gate_up + row * 2 * inner;
    const float g = to_float(r[k]), u = to_float(r[inner + k]);
    out[i] = from_float<T>(g / (1.0f + expf(-g)) * u);
}

template <typename T>
__device__ void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int rows, int inner) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * inner) return;
    const long long row = i / inner;
    const int k = (int)(i % inner);
    const long long at = row * 2 * inner + k;
    const float g = to_float(gate_up[at]), u = to_float(gate_up[at + inner]), d = to_float(dout[i]);
    const float s = 1.0f / (1.0f + expf(-g));
    dgate_up[at + inner] = from_float<T>(d * g * s);
    dgate_up[at] = from_float<T>(d * u * s * (1.0f + g * (1.0f - s)));
}

extern "C" __global__ void swiglu_forward_f32(float* out, const float* gate_up, int rows, int inner) { swiglu_forward(out, gate_up, rows, inner); }
extern "C" __global__ void swiglu_forward_bf16(bf16* out, const bf16* gate_up, int rows, int inner) { swiglu_forward(out, gate_up, rows, inner); }
extern "C" __global__ void swiglu_forward_f16(f16* out, const f16* gate_up, int rows, int inner) { swiglu_forward(out, gate_up, rows, inner); }

extern "C" __global__ void swiglu_backward_f32(float* dgate_up, const float* dout, const float* gate_up, int rows, int inner) { swiglu_backward(dgate_up, dout, gate_up, rows, inner); }
extern "C" __global__ void swiglu_backward_bf16(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int rows, int inner) { swiglu_backward(dgate_up, dout, gate_up, rows, inner); }
extern "C" __global__ void swiglu_backward_f16(f16* dgate_up, const f16* dout, const f16* gate_up, int rows, int inner) { swiglu_backward(dgate_up, dout, gate_up, rows, inner); }
