// Element-wise and row-wise kernels: embedding rows, bias, residual add,
// SwiGLU, row gather, and the greedy argmax.

extern "C" __global__ void embed(const unsigned short* __restrict__ table,
                                 const int* __restrict__ tokens,
                                 float* __restrict__ x,
                                 int rows, int hidden) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * hidden) {
        return;
    }
    const int r = idx / hidden;
    const int c = idx % hidden;
    x[idx] = bf16_to_f32(table[(size_t)tokens[r] * hidden + c]);
}

extern "C" __global__ void add_bias(float* __restrict__ y,
                                    const float* __restrict__ bias,
                                    int rows, int width) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < rows * width) {
        y[idx] += bias[idx % width];
    }
}

extern "C" __global__ void add(float* __restrict__ x, const float* __restrict__ y, int n) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        x[idx] += y[idx];
    }
}

// gate <- silu(gate) * up
extern "C" __global__ void silu_mul(float* __restrict__ gate, const float* __restrict__ up, int n) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        const float g = gate[idx];
        gate[idx] = (g / (1.0f + expf(-g))) * up[idx];
    }
}

extern "C" __global__ void gather_rows(const float* __restrict__ x,
                                       const int* __restrict__ rows,
                                       float* __restrict__ y,
                                       int n, int width) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n * width) {
        y[idx] = x[(size_t)rows[idx / width] * width + idx % width];
    }
}

// One block of 256 threads per row: the index of the largest value, ties
// to the lowest index, as the host's sampling::argmax; 0xffffffff when the
// row holds a NaN or an infinity (the forward pass went wrong). Each thread
// scans its strided indices in increasing order keeping the first maximum;
// a fixed tree then prefers the larger value, and the lower index between
// equal ones.

#define ARGMAX_THREADS 256

extern "C" __global__ void argmax(const float* __restrict__ x,
                                  unsigned int* __restrict__ out,
                                  int width) {
    __shared__ float best_v[ARGMAX_THREADS];
    __shared__ unsigned int best_i[ARGMAX_THREADS];
    __shared__ int bad[ARGMAX_THREADS];
    const float* xr = x + (size_t)blockIdx.x * width;
    float bv = NEG_INF;
    unsigned int bi = 0xffffffffu;
    int nonfinite = 0;
    for (int i = threadIdx.x; i < width; i += ARGMAX_THREADS) {
        const float v = xr[i];
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
