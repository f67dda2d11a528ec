// Loss-scale unscaling, the inf/NaN check and the squared L2 norm, in one pass over the
// gradients; then a one-block sum of the per-block partials.
// CPU references: executor::optim::clip::sum_of_squares (the norm), with unscaling as
// `g * (1 / loss_scale)` in f32 before it (DeepSpeed's fp16 optimizer divides by the scale
// folded into the clip coefficient; the result agrees to rounding).
//
// The grid is fixed (NORM_BLOCKS blocks, grid-stride), so the summation order, and so the
// result, does not depend on the device. Squares are summed in f64 as on the CPU.

#define NORM_THREADS 512
#define NORM_BLOCKS 1024

// grads *= inv_scale (skipped when inv_scale == 1); partials[block] = sum of squares of the
// (unscaled, stored) gradients of this block's stride; *found_inf = 1 when any is inf or NaN.
template <typename T>
__device__ void unscale_norm_partials(T* grads, long long n, float inv_scale, double* partials, int* found_inf) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    double acc = 0.0;
    bool bad = false;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float g = to_float(grads[i]);
        if (inv_scale != 1.0f) {
            const T stored = from_float<T>(g * inv_scale);
            grads[i] = stored;
            g = to_float(stored);
        }
        bad = bad || not_finite(g);
        acc += (double)g * (double)g;
    }
    if (bad) *found_inf = 1;
    const double block_total = block_sum_f64(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = block_total;
}

// out[0] = sum of partials[0 .. count); one block.
extern "C" __global__ void sum_partials_f64(double* out, const double* partials, int count) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
    const double total = block_sum_f64(acc);
    if (threadIdx.x == 0) out[0] = total;
}

extern "C" __global__ void unscale_norm_partials_f32(float* grads, long long n, float inv_scale, double* partials, int* found_inf) { unscale_norm_partials(grads, n, inv_scale, partials, found_inf); }
extern "C" __global__ void unscale_norm_partials_bf16(bf16* grads, long long n, float inv_scale, double* partials, int* found_inf) { unscale_norm_partials(grads, n, inv_scale, partials, found_inf); }
extern "C" __global__ void unscale_norm_partials_f16(f16* grads, long long n, float inv_scale, double* partials, int* found_inf) { unscale_norm_partials(grads, n, inv_scale, partials, found_inf); }
