// Rotary position embeddings applied in place to the q and k heads of [q | k | v] rows,
// transformers' rotate-half layout: dimension i of a head pairs with i + hs/2, and the pair
// (a, b) at position t becomes (a cos - b sin, b cos + a sin); backward turns by the opposite
// angle (the transpose of the rotation).
// CPU references: executor::model::rope::{rope_forward, rope_backward}.
//
// The angles come in as the host's table (executor::model::rope::RopeTable): cos and sin
// (T, hs/2) in f32, computed from inv_freq with rope_theta and any rope_scaling (llama3,
// linear, dynamic) already applied. One thread per (row, head, pair); row r is at position
// r % T. Arithmetic in f32, one rounding to the storage type per output.

#define ROPE_THREADS 256

// rows (N, width): the first heads * 2 * half columns of each row are heads of 2 * half.
// sign = +1 turns forward, -1 backward.
template <typename T>
__device__ void rope_rotate(T* rows, const float* cos_t, const float* sin_t, int n_rows, int width, int heads,
                            int half, int seq_len, float sign) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per_row = (long long)heads * half;
    if (i >= (long long)n_rows * per_row) return;
    const long long row = i / per_row;
    const int rest = (int)(i % per_row);
    const int head = rest / half, k = rest % half;
    const int t = (int)(row % seq_len);
    const float c = cos_t[(long long)t * half + k], s = sign * sin_t[(long long)t * half + k];
    T* a = rows + row * width + (long long)head * 2 * half + k;
    T* b = a + half;
    const float x = to_float(*a), y = to_float(*b);
    *a = from_float<T>(x * c - y * s);
    *b = from_float<T>(y * c + x * s);
}

extern "C" __global__ void rope_forward_f32(float* rows, const float* cos_t, const float* sin_t, int n_rows, int width, int heads, int half, int seq_len) { rope_rotate(rows, cos_t, sin_t, n_rows, width, heads, half, seq_len, 1.0f); }
extern "C" __global__ void rope_forward_bf16(bf16* rows, const float* cos_t, const float* sin_t, int n_rows, int width, int heads, int half, int seq_len) { rope_rotate(rows, cos_t, sin_t, n_rows, width, heads, half, seq_len, 1.0f); }
extern "C" __global__ void rope_forward_f16(f16* rows, const float* cos_t, const float* sin_t, int n_rows, int width, int heads, int half, int seq_len) { rope_rotate(rows, cos_t, sin_t, n_rows, width, heads, half, seq_len, 1.0f); }

extern "C" __global__ void rope_backward_f32(float* rows, const float* cos_t, const float* sin_t, int n_rows, int width, int heads, int half, int seq_len) { rope_rotate(rows, cos_t, sin_t, n_rows, width, heads, half, seq_len, -1.0f); }
extern "C" __global__ void rope_backward_bf16(bf16* rows, const float* cos_t, const float* sin_t, int n_rows, int width, int heads, int half, int seq_len) { rope_rotate(rows, cos_t, sin_t, n_rows, width, heads, half, seq_len, -1.0f); }
extern "C" __global__ void rope_backward_f16(f16* rows, const float* cos_t, const float* sin_t, int n_rows, int width, int heads, int half, int seq_len) { rope_rotate(rows, cos_t, sin_t, n_rows, width, heads, half, seq_len, -1.0f); }
