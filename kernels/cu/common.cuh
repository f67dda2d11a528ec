// dsplan kernel prelude: prepended to every kernel file before NVRTC compiles it.
//
// Self-contained on purpose: NVRTC ships no cuda_fp16.h / cuda_bf16.h, so the 16-bit storage
// types are plain 16-bit words converted with single PTX instructions (sm_80 and newer).
// All arithmetic happens in f32 (f64 for norms); only storage is 16-bit.

typedef unsigned short dsplan_u16;

// bfloat16 storage: the top half of an IEEE f32.
struct bf16 { dsplan_u16 bits; };
// IEEE binary16 storage.
struct f16 { dsplan_u16 bits; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) {
    return __uint_as_float(((unsigned int)x.bits) << 16);
}
__device__ __forceinline__ float to_float(f16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}

// Round-to-nearest-even conversion from f32 to the storage type.
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float x) {
    bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}
template <> __device__ __forceinline__ f16 from_float<f16>(float x) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}

// True for +-inf and NaN (exponent all ones).
__device__ __forceinline__ bool not_finite(float x) {
    return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

#define DSPLAN_NEG_INF __int_as_float(0xff800000)
#define DSPLAN_FULL_MASK 0xffffffffu

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(DSPLAN_FULL_MASK, v, offset);
    return v;
}
__device__ __forceinline__ double warp_sum_f64(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(DSPLAN_FULL_MASK, v, offset);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(DSPLAN_FULL_MASK, v, offset));
    return v;
}

// Sum over the whole block, returned to every thread. Deterministic for a fixed block size.
// Every thread of the block must call it (it synchronises).
__device__ float block_sum(float v) {
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = (threadIdx.x < warps) ? scratch[threadIdx.x] : 0.0f;
    if (warp == 0) v = warp_sum(v);
    if (threadIdx.x == 0) scratch[0] = v;
    __syncthreads();
    const float total = scratch[0];
    __syncthreads();
    return total;
}

__device__ double block_sum_f64(double v) {
    __shared__ double scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = warp_sum_f64(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = (threadIdx.x < warps) ? scratch[threadIdx.x] : 0.0;
    if (warp == 0) v = warp_sum_f64(v);
    if (threadIdx.x == 0) scratch[0] = v;
    __syncthreads();
    const double total = scratch[0];
    __syncthreads();
    return total;
}

__device__ float block_max(float v) {
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = (threadIdx.x < warps) ? scratch[threadIdx.x] : DSPLAN_NEG_INF;
    if (warp == 0) v = warp_max(v);
    if (threadIdx.x == 0) scratch[0] = v;
    __syncthreads();
    const float total = scratch[0];
    __syncthreads();
    return total;
}
