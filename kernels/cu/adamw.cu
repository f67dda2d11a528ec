// Multi-tensor fused Adam/AdamW: one launch updates every segment of a flat parameter buffer
// (segments differ in whether weight decay applies), updates the f32 master weights and both
// moments, and writes the 16-bit working copy in the same pass.
// CPU reference: executor::optim::adam::adam_step (same arithmetic order; the per-step scalars
// are computed on the host exactly as the CPU computes them, in f64 rounded to f32).
//
// The gradients are multiplied by grad_scale first (1 / loss_scale times the clip coefficient);
// the CPU clips with executor::optim::clip::scale_grads, the same f32 multiplication.

#define ADAMW_THREADS 256
#define ADAMW_BLOCKS_PER_SEGMENT 128

// Per-step scalars; layout shared with the Rust side (executor::cuda::adamw::AdamScalars).
struct AdamScalars {
    float decay_factor;          // 1 - lr * wd for decoupled decay, else 1
    float l2;                    // wd for L2 mode, else 0
    float m_weight;              // 1 - beta1
    float beta2;
    float one_minus_beta2;
    float neg_step_size;         // -lr / bias_correction1
    float bias_correction2_sqrt;
    float eps;
    float grad_scale;
    int small_weight;            // 1: m + w (g - m); 0: g - (g - m)(1 - w), as torch's lerp
};

// A contiguous range of the flat buffers; decay 0 exempts it from weight decay.
struct AdamSegment {
    long long offset;
    long long len;
    int decay;
    int reserved;
};

// grid (ADAMW_BLOCKS_PER_SEGMENT, segments); params_out may be null (f32 training).
template <typename G, typename P>
__device__ void adamw(float* master, P* params_out, const G* grads, float* exp_avg, float* exp_avg_sq,
                      const AdamSegment* segments, AdamScalars s) {
    const AdamSegment seg = segments[blockIdx.y];
    const float decay_factor = seg.decay ? s.decay_factor : 1.0f;
    const float l2 = seg.decay ? s.l2 : 0.0f;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < seg.len; j += stride) {
        const long long i = seg.offset + j;
        float p = master[i];
        const float g = to_float(grads[i]) * s.grad_scale + l2 * p;
        p *= decay_factor;
        float m = exp_avg[i];
        m = s.small_weight ? m + s.m_weight * (g - m) : g - (g - m) * (1.0f - s.m_weight);
        const float v = exp_avg_sq[i] * s.beta2 + s.one_minus_beta2 * g * g;
        const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
        p += s.neg_step_size * m / denom;
        master[i] = p;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        if (params_out != nullptr) params_out[i] = from_float<P>(p);
    }
}

extern "C" __global__ void adamw_f32(float* master, float* params_out, const float* grads, float* exp_avg, float* exp_avg_sq, const AdamSegment* segments, AdamScalars s) { adamw(master, params_out, grads, exp_avg, exp_avg_sq, segments, s); }
extern "C" __global__ void adamw_bf16(float* master, bf16* params_out, const bf16* grads, float* exp_avg, float* exp_avg_sq, const AdamSegment* segments, AdamScalars s) { adamw(master, params_out, grads, exp_avg, exp_avg_sq, segments, s); }
extern "C" __global__ void adamw_f16(float* master, f16* params_out, const f16* grads, float* exp_avg, float* exp_avg_sq, const AdamSegment* segments, AdamScalars s) { adamw(master, params_out, grads, exp_avg, exp_avg_sq, segments, s); }
