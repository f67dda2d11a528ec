// Fused softmax + cross-entropy + gradient: one pass reads the logits row, a second writes its
// gradient in place. No probability tensor is stored.
// CPU reference: executor::model::classifier::crossentropy_forward_backward.
//
// One block per row. Pass 1 keeps, per thread, a running max and a running sum of
// exp(x - max) (rescaled when the max grows), then combines them across the block.

#define CLASSIFIER_THREADS 512

// logits (rows, vocab) with rows `stride` elements apart (stride >= vocab: the device pads each
// row to a multiple of 64 elements so that cuBLASLt's leading dimension is 16-byte aligned):
// logits on entry, dloss * (softmax - onehot(target)) on return, zeros for rows whose target is
// negative (no target); losses (rows): logsumexp - logit[target], or 0. Only the `vocab` real
// columns of a row are read or written: the padding after them is never touched.
template <typename T>
__device__ void fused_classifier(T* logits, float* losses, const int* targets, float dloss, int rows, int vocab, int stride) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    T* x = logits + (long long)row * stride;
    const int target = targets[row];
    if (target < 0) {
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) x[i] = from_float<T>(0.0f);
        if (threadIdx.x == 0) losses[row] = 0.0f;
        return;
    }
    float m = DSPLAN_NEG_INF, s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = to_float(x[i]);
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    const float row_max = block_max(m);
    const float total = block_sum(m == DSPLAN_NEG_INF ? 0.0f : s * expf(m - row_max));
    // All threads have read the row (block_sum synchronises) before anyone overwrites it.
    const float target_logit = to_float(x[target]);
    __syncthreads();
    if (threadIdx.x == 0) losses[row] = row_max + logf(total) - target_logit;
    const float scale = (1.0f / total) * dloss;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float g = expf(to_float(x[i]) - row_max) * scale;
        if (i == target) g -= dloss;
        x[i] = from_float<T>(g);
    }
}

extern "C" __global__ void fused_classifier_f32(float* logits, float* losses, const int* targets, float dloss, int rows, int vocab, int stride) { fused_classifier(logits, losses, targets, dloss, rows, vocab, stride); }
extern "C" __global__ void fused_classifier_bf16(bf16* logits, float* losses, const int* targets, float dloss, int rows, int vocab, int stride) { fused_classifier(logits, losses, targets, dloss, rows, vocab, stride); }
extern "C" __global__ void fused_classifier_f16(f16* logits, float* losses, const int* targets, float dloss, int rows, int vocab, int stride) { fused_classifier(logits, losses, targets, dloss, rows, vocab, stride); }
