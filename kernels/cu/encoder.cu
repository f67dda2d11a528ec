// Token + position embedding, forward and backward.
// CPU reference: executor::model::encoder::{encoder_forward, encoder_backward}.
//
// The backward pass is deterministic and sums in the CPU's order: the host groups the rows of
// the batch by token (ascending row order inside each group, see
// executor::cuda::encoder_buckets), and one thread per (token, channel) adds that token's rows
// one after another onto dwte.

#define ENCODER_THREADS 256

// out[row, c] = wte[tokens[row], c] + wpe[row % seq_len, c]; one thread per element.
template <typename T>
__device__ void encoder_forward(T* out, const unsigned int* tokens, const T* wte, const T* wpe,
                                int rows, int seq_len, int channels) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)rows * channels) return;
    const int row = (int)(idx / channels), c = (int)(idx % channels);
    const int t = row % seq_len;
    const long long token = tokens[row];
    out[idx] = from_float<T>(to_float(wte[token * channels + c]) + to_float(wpe[(long long)t * channels + c]));
}

// dwpe[t, c] += sum over b of dout[b * seq_len + t, c], b ascending; one thread per (t, c).
template <typename T>
__device__ void encoder_backward_wpe(T* dwpe, const T* dout, int batch, int seq_len, int channels) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)seq_len * channels) return;
    float acc = to_float(dwpe[idx]);
    for (int b = 0; b < batch; b++) acc += to_float(dout[(long long)b * seq_len * channels + idx]);
    dwpe[idx] = from_float<T>(acc);
}

// dwte[bucket_token[k], c] += dout[row, c] for the rows of bucket k in the order listed.
// grid (ceil(channels / ENCODER_THREADS), buckets); bucket k's rows are
// bucket_rows[bucket_start[k] .. bucket_start[k + 1]].
template <typename T>
__device__ void encoder_backward_wte(T* dwte, const T* dout, const unsigned int* bucket_token,
                                     const int* bucket_start, const int* bucket_rows, int channels) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int k = blockIdx.y;
    if (c >= channels) return;
    const long long dst = (long long)bucket_token[k] * channels + c;
    float acc = to_float(dwte[dst]);
    for (int i = bucket_start[k]; i < bucket_start[k + 1]; i++)
        acc += to_float(dout[(long long)bucket_rows[i] * channels + c]);
    dwte[dst] = from_float<T>(acc);
}

extern "C" __global__ void encoder_forward_f32(float* out, const unsigned int* tokens, const float* wte, const float* wpe, int rows, int seq_len, int channels) { encoder_forward(out, tokens, wte, wpe, rows, seq_len, channels); }
extern "C" __global__ void encoder_forward_bf16(bf16* out, const unsigned int* tokens, const bf16* wte, const bf16* wpe, int rows, int seq_len, int channels) { encoder_forward(out, tokens, wte, wpe, rows, seq_len, channels); }
extern "C" __global__ void encoder_forward_f16(f16* out, const unsigned int* tokens, const f16* wte, const f16* wpe, int rows, int seq_len, int channels) { encoder_forward(out, tokens, wte, wpe, rows, seq_len, channels); }

extern "C" __global__ void encoder_backward_wpe_f32(float* dwpe, const float* dout, int batch, int seq_len, int channels) { encoder_backward_wpe(dwpe, dout, batch, seq_len, channels); }
extern "C" __global__ void encoder_backward_wpe_bf16(bf16* dwpe, const bf16* dout, int batch, int seq_len, int channels) { encoder_backward_wpe(dwpe, dout, batch, seq_len, channels); }
extern "C" __global__ void encoder_backward_wpe_f16(f16* dwpe, const f16* dout, int batch, int seq_len, int channels) { encoder_backward_wpe(dwpe, dout, batch, seq_len, channels); }

extern "C" __global__ void encoder_backward_wte_f32(float* dwte, const float* dout, const unsigned int* bucket_token, const int* bucket_start, const int* bucket_rows, int channels) { encoder_backward_wte(dwte, dout, bucket_token, bucket_start, bucket_rows, channels); }
extern "C" __global__ void encoder_backward_wte_bf16(bf16* dwte, const bf16* dout, const unsigned int* bucket_token, const int* bucket_start, const int* bucket_rows, int channels) { encoder_backward_wte(dwte, dout, bucket_token, bucket_start, bucket_rows, channels); }
extern "C" __global__ void encoder_backward_wte_f16(f16* dwte, const f16* dout, const unsigned int* bucket_token, const int* bucket_start, const int* bucket_rows, int channels) { encoder_backward_wte(dwte, dout, bucket_token, bucket_start, bucket_rows, channels); }
