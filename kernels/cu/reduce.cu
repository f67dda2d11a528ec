// Deterministic column sums in two steps, used for bias gradients and LayerNorm's
// weight/bias gradients; and the element-wise accumulation of a reduced gradient bucket into a
// rank's gradient partition (accumulate).
// CPU references: executor::model::matmul::add_column_sums (column_partials then
// add_partials), and the last loop of executor::model::layernorm::layernorm_backward
// (add_partials over layernorm_backward's partials); executor::model::residual::accumulate
// (accumulate).
//
// column_partials sums chunks of COLUMN_PARTIAL_ROWS rows (the CPU's BIAS_ROWS_PER_CHUNK) in
// row order into f32 partials; add_partials adds the partials onto the accumulator in chunk
// order. The order of additions is the CPU's.

#define REDUCE_THREADS 256
#define COLUMN_PARTIAL_ROWS 64

// partials[chunk, c] = sum of rows[chunk * COLUMN_PARTIAL_ROWS + i, c], i ascending.
// grid (ceil(width / REDUCE_THREADS), ceil(rows / COLUMN_PARTIAL_ROWS)).
template <typename T>
__device__ void column_partials(float* partials, const T* data, int rows, int width) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    const int first = blockIdx.y * COLUMN_PARTIAL_ROWS;
    const int last = min(first + COLUMN_PARTIAL_ROWS, rows);
    float acc = 0.0f;
    for (int row = first; row < last; row++) acc += to_float(data[(long long)row * width + c]);
    partials[(long long)blockIdx.y * width + c] = acc;
}

// acc[c] += partials[k * stride + c] for k = 0, 1, ..., chunks - 1, in that order.
// grid ceil(width / REDUCE_THREADS).
template <typename T>
__device__ void add_partials(T* acc, const float* partials, int chunks, int width, long long stride) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    float total = to_float(acc[c]);
    for (int k = 0; k < chunks; k++) total += partials[(long long)k * stride + c];
    acc[c] = from_float<T>(total);
}

extern "C" __global__ void column_partials_f32(float* partials, const float* data, int rows, int width) { column_partials(partials, data, rows, width); }
extern "C" __global__ void column_partials_bf16(float* partials, const bf16* data, int rows, int width) { column_partials(partials, data, rows, width); }
extern "C" __global__ void column_partials_f16(float* partials, const f16* data, int rows, int width) { column_partials(partials, data, rows, width); }

extern "C" __global__ void add_partials_f32(float* acc, const float* partials, int chunks, int width, long long stride) { add_partials(acc, partials, chunks, width, stride); }
extern "C" __global__ void add_partials_bf16(bf16* acc, const float* partials, int chunks, int width, long long stride) { add_partials(acc, partials, chunks, width, stride); }
extern "C" __global__ void add_partials_f16(f16* acc, const float* partials, int chunks, int width, long long stride) { add_partials(acc, partials, chunks, width, stride); }

// dst[i] += src[i], i < n, added in f32 and stored in T. grid ceil(n / REDUCE_THREADS).
template <typename T>
__device__ void accumulate(T* dst, const T* src, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    dst[i] = from_float<T>(to_float(dst[i]) + to_float(src[i]));
}

extern "C" __global__ void accumulate_f32(float* dst, const float* src, long long n) { accumulate(dst, src, n); }
extern "C" __global__ void accumulate_bf16(bf16* dst, const bf16* src, long long n) { accumulate(dst, src, n); }
extern "C" __global__ void accumulate_f16(f16* dst, const f16* src, long long n) { accumulate(dst, src, n); }
