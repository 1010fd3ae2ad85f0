// Element-wise and row-wise kernels over bf16 activations (each result
// rounded once): embedding rows, bias, residual add, SwiGLU, row gather,
// and the greedy argmax of f32 logits (or bf16 activations).

extern "C" __global__ void embed(const bf16* __restrict__ table,
                                 const int* __restrict__ tokens,
                                 bf16* __restrict__ x,
                                 int rows, int hidden) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * hidden) {
        return;
    }
    const size_t r = idx / hidden, c = idx % hidden;
    x[idx] = table[(size_t)tokens[r] * hidden + c];
}

extern "C" __global__ void add_bias(bf16* __restrict__ y,
                                    const float* __restrict__ bias,
                                    int rows, int width) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < (size_t)rows * width) {
        y[idx] = f32_to_bf16(bf16_to_f32(y[idx]) + bias[idx % width]);
    }
}

extern "C" __global__ void add(bf16* __restrict__ x, const bf16* __restrict__ y, int n) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < (size_t)n) {
        x[idx] = f32_to_bf16(bf16_to_f32(x[idx]) + bf16_to_f32(y[idx]));
    }
}

// gate <- silu(gate) * up
extern "C" __global__ void silu_mul(bf16* __restrict__ gate, const bf16* __restrict__ up, int n) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < (size_t)n) {
        const float g = bf16_to_f32(gate[idx]);
        gate[idx] = f32_to_bf16(g / (1.0f + expf(-g)) * bf16_to_f32(up[idx]));
    }
}

extern "C" __global__ void gather_rows(const bf16* __restrict__ x,
                                       const int* __restrict__ rows,
                                       bf16* __restrict__ y,
                                       int n, int width) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < (size_t)n * width) {
        y[idx] = x[(size_t)rows[idx / width] * width + idx % width];
    }
}

// One block of 1,024 threads per row (a decode step's rows are few and long:
// more loads in flight): the index of the largest value, ties
// to the lowest index, as the host's sampling::argmax; 0xffffffff when the
// row holds a NaN or an infinity (the forward pass went wrong). Each thread
// scans its strided indices in increasing order keeping the first maximum;
// a fixed tree then prefers the larger value, and the lower index between
// equal ones.

#define ARGMAX_THREADS 1024

__device__ __forceinline__ float argmax_value(const float* x, size_t i) { return x[i]; }
__device__ __forceinline__ float argmax_value(const bf16* x, size_t i) { return bf16_to_f32(x[i]); }

template <class T>
__device__ __forceinline__ void argmax_row(const T* __restrict__ x, unsigned int* __restrict__ out,
                                           int width) {
    __shared__ float best_v[ARGMAX_THREADS];
    __shared__ unsigned int best_i[ARGMAX_THREADS];
    __shared__ int bad[ARGMAX_THREADS];
    const T* xr = x + (size_t)blockIdx.x * width;
    float bv = NEG_INF;
    unsigned int bi = 0xffffffffu;
    int nonfinite = 0;
    for (int i = threadIdx.x; i < width; i += ARGMAX_THREADS) {
        const float v = argmax_value(xr, i);
        // False for NaN and for infinities.
        nonfinite |= !(fabsf(v) <= 3.402823466e38f);
        if (v > bv) {
            bv = v;
            bi = (unsigned int)i;
        }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    bad[threadIdx.x] = nonfinite;
    __syncthreads();
    for (int stride = ARGMAX_THREADS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            const float v2 = best_v[threadIdx.x + stride];
            const unsigned int i2 = best_i[threadIdx.x + stride];
            if (v2 > best_v[threadIdx.x] || (v2 == best_v[threadIdx.x] && i2 < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = v2;
                best_i[threadIdx.x] = i2;
            }
            bad[threadIdx.x] |= bad[threadIdx.x + stride];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = bad[0] ? 0xffffffffu : (best_i[0] == 0xffffffffu ? 0u : best_i[0]);
    }
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_f32(const float* __restrict__ x, unsigned int* __restrict__ out,
                                      int width) {
    argmax_row(x, out, width);
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_bf16(const bf16* __restrict__ x, unsigned int* __restrict__ out,
                                       int width) {
    argmax_row(x, out, width);
}
