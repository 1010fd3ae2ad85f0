// y[r, o] = sum_k x[r, k] * w[o, k]: x is rows x k (f32), w is out x k
// (bf16), y is rows x out (f32).
//
// A block computes a fixed tile of TILE_R rows by TILE_O outputs, staging
// TILE_K columns of x and w in shared memory at a time. Each output element
// is one thread's sum over k = 0, 1, ..., k_dim - 1 in order, one fma per
// k, into one f32 accumulator: its bits depend on k_dim alone, never on how
// many rows the batch has, which tile a row falls in, or how many tiles
// launch. No split-K, no atomics.

#define TILE_O 64
#define TILE_R 16
#define TILE_K 32
#define GEMM_THREADS 256

extern "C" __global__ void gemm_bf16(const float* __restrict__ x,
                                     const unsigned short* __restrict__ w,
                                     float* __restrict__ y,
                                     int rows, int k_dim, int out_dim) {
    __shared__ float xs[TILE_R][TILE_K + 1];
    __shared__ float ws[TILE_O][TILE_K + 1];
    const int tid = threadIdx.x;
    // Row tiles vary fastest, so blocks that read the same weight tile run
    // together and share it through L2.
    const int r0 = blockIdx.x * TILE_R;
    const int o0 = blockIdx.y * TILE_O;
    const int lo = tid % TILE_O;  // this thread's output
    const int lr = tid / TILE_O;  // and its rows lr, lr + 4, lr + 8, lr + 12
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < k_dim; k0 += TILE_K) {
        for (int i = tid; i < TILE_O * TILE_K; i += GEMM_THREADS) {
            const int oo = i / TILE_K, kk = i % TILE_K;
            const int o = o0 + oo, k = k0 + kk;
            ws[oo][kk] = (o < out_dim && k < k_dim) ? bf16_to_f32(w[(size_t)o * k_dim + k]) : 0.0f;
        }
        for (int i = tid; i < TILE_R * TILE_K; i += GEMM_THREADS) {
            const int rr = i / TILE_K, kk = i % TILE_K;
            const int r = r0 + rr, k = k0 + kk;
            xs[rr][kk] = (r < rows && k < k_dim) ? x[(size_t)r * k_dim + k] : 0.0f;
        }
        __syncthreads();
        const int kn = min(TILE_K, k_dim - k0);
        for (int kk = 0; kk < kn; ++kk) {
            const float wv = ws[lo][kk];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc[j] = fmaf(xs[lr + 4 * j][kk], wv, acc[j]);
            }
        }
        __syncthreads();
    }
    const int o = o0 + lo;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int r = r0 + lr + 4 * j;
        if (r < rows && o < out_dim) {
            y[(size_t)r * out_dim + o] = acc[j];
        }
    }
}
