// RMSNorm of one chunk of `width` values per block: x · rsqrt(mean(x²) +
// eps) · weight, bf16 in and out, f32 inside. Each of the 256 threads sums
// the squares of its strided elements in order, then a fixed shared-memory
// tree adds the 256 partial sums: the order depends on `width` alone.

#define NORM_THREADS 256

extern "C" __global__ void __launch_bounds__(NORM_THREADS) rms_norm(const bf16* __restrict__ x,
                                                                   const float* __restrict__ weight,
                                                                   bf16* __restrict__ y,
                                                                   int width, float eps) {
    __shared__ float part[NORM_THREADS];
    const bf16* xr = x + (size_t)blockIdx.x * width;
    bf16* yr = y + (size_t)blockIdx.x * width;
    float s = 0.0f;
    for (int i = threadIdx.x; i < width; i += NORM_THREADS) {
        const float v = bf16_to_f32(xr[i]);
        s = fmaf(v, v, s);
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int stride = NORM_THREADS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            part[threadIdx.x] += part[threadIdx.x + stride];
        }
        __syncthreads();
    }
    const float scale = 1.0f / sqrtf(part[0] / (float)width + eps);
    for (int i = threadIdx.x; i < width; i += NORM_THREADS) {
        yr[i] = f32_to_bf16((bf16_to_f32(xr[i]) * scale) * weight[i]);
    }
}
