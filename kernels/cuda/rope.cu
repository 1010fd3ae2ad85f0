// Rotary embedding, "rotate half" layout, in place: for each row, head and
// i < half, (x[i], x[i + half]) turns by the angle of (pos[row], i), read
// from the table built once on the host (cos and sin, positions x half).

extern "C" __global__ void rope(float* __restrict__ x,
                                const float* __restrict__ cos_t,
                                const float* __restrict__ sin_t,
                                const int* __restrict__ pos,
                                int rows, int heads, int half) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * heads * half) {
        return;
    }
    const int i = idx % half;
    const int h = (idx / half) % heads;
    const int r = idx / (half * heads);
    float* head = x + (size_t)r * heads * 2 * half + (size_t)h * 2 * half;
    const float c = cos_t[(size_t)pos[r] * half + i];
    const float s = sin_t[(size_t)pos[r] * half + i];
    const float x0 = head[i];
    const float x1 = head[i + half];
    head[i] = x0 * c - x1 * s;
    head[i + half] = x1 * c + x0 * s;
}
