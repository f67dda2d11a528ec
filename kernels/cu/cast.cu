// Conversions between f32 and the 16-bit storage types, round to nearest even.
// CPU reference: half::slice::HalfFloatSliceExt::{convert_from_f32_slice, convert_to_f32_slice}
// (the `half` crate also rounds to nearest even).

#define CAST_THREADS 256

template <typename From, typename To>
__device__ void cast(To* out, const From* inp, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_float<To>(to_float(inp[i]));
}

extern "C" __global__ void cast_f32_to_bf16(bf16* out, const float* inp, long long n) { cast(out, inp, n); }
extern "C" __global__ void cast_f32_to_f16(f16* out, const float* inp, long long n) { cast(out, inp, n); }
extern "C" __global__ void cast_bf16_to_f32(float* out, const bf16* inp, long long n) { cast(out, inp, n); }
extern "C" __global__ void cast_f16_to_f32(float* out, const f16* inp, long long n) { cast(out, inp, n); }
