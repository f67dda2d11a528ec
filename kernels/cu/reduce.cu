// Deterministic column sums in two steps, used for bias gradients and LayerNorm's
// weight/bias gradients.
// CPU references: executor::model::matmul::add_column_sums (column_partials then
// add_partials), and the last loop of executor::model::layernorm::layernorm_backward
// (add_partials over layernorm_backward's partials).
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
