// Paged KV cache and causal attention over it.
//
// Each layer's keys and values live in a pool of blocks of KV_BLOCK
// positions, laid out [block][kv_head][KV_BLOCK][dim]; a sequence owns a
// list of blocks (its block table). `slots[r]` is where row r's position
// goes: block * KV_BLOCK + offset.

extern "C" __global__ void kv_write(const float* __restrict__ k,
                                    const float* __restrict__ v,
                                    float* __restrict__ kpool,
                                    float* __restrict__ vpool,
                                    const int* __restrict__ slots,
                                    int rows, int kv_heads, int dim) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * kv_heads * dim) {
        return;
    }
    const int d = idx % dim;
    const int h = (idx / dim) % kv_heads;
    const int r = idx / (dim * kv_heads);
    const int slot = slots[r];
    const size_t dst = (((size_t)(slot / KV_BLOCK) * kv_heads + h) * KV_BLOCK + slot % KV_BLOCK) * dim + d;
    const size_t src = (size_t)r * kv_heads * dim + (size_t)h * dim + d;
    kpool[dst] = k[src];
    vpool[dst] = v[src];
}

// One block per (row, KV head); each warp takes query heads of that KV
// head's group in turn. A row at position p attends to positions 0..p of
// its own sequence, one position at a time, in order: the score is a lane
// sum in a fixed shuffle tree (lane 0's result broadcast, so every lane
// uses the same bits), and the running max, sum and output (an online
// softmax) update once per position. A row's result depends on its
// position and its own cache alone: the same kernel serves prefill and
// decode, in any batch.

#define ATTN_MAX_PER_LANE 8  // head dimension up to 256

extern "C" __global__ void attention(const float* __restrict__ q,
                                     const float* __restrict__ kpool,
                                     const float* __restrict__ vpool,
                                     float* __restrict__ out,
                                     const int* __restrict__ row_pos,
                                     const int* __restrict__ row_table,
                                     const int* __restrict__ tables,
                                     int heads, int kv_heads, int dim, float scale) {
    const int r = blockIdx.x;
    const int kvh = blockIdx.y;
    const int group = heads / kv_heads;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int warps = blockDim.x / 32;
    const int* table = tables + row_table[r];
    const int len = row_pos[r] + 1;
    const int per = (dim + 31) / 32;
    for (int g = warp; g < group; g += warps) {
        const int h = kvh * group + g;
        const float* qh = q + (size_t)r * heads * dim + (size_t)h * dim;
        float qv[ATTN_MAX_PER_LANE];
        float acc[ATTN_MAX_PER_LANE];
#pragma unroll
        for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
            const int d = lane + 32 * i;
            qv[i] = (i < per && d < dim) ? qh[d] : 0.0f;
            acc[i] = 0.0f;
        }
        float m = NEG_INF;
        float l = 0.0f;
        for (int t = 0; t < len; ++t) {
            const size_t base =
                (((size_t)table[t / KV_BLOCK] * kv_heads + kvh) * KV_BLOCK + t % KV_BLOCK) * dim;
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
                const int d = lane + 32 * i;
                if (i < per && d < dim) {
                    s = fmaf(qv[i], kpool[base + d], s);
                }
            }
            for (int o = 16; o > 0; o >>= 1) {
                s += __shfl_xor_sync(0xffffffffu, s, o);
            }
            s = __shfl_sync(0xffffffffu, s, 0) * scale;
            const float m_new = fmaxf(m, s);
            const float corr = expf(m - m_new);
            const float p = expf(s - m_new);
            l = l * corr + p;
#pragma unroll
            for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
                const int d = lane + 32 * i;
                if (i < per && d < dim) {
                    acc[i] = acc[i] * corr + p * vpool[base + d];
                }
            }
            m = m_new;
        }
        const float inv = 1.0f / l;
        float* oh = out + (size_t)r * heads * dim + (size_t)h * dim;
#pragma unroll
        for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
            const int d = lane + 32 * i;
            if (i < per && d < dim) {
                oh[d] = acc[i] * inv;
            }
        }
    }
}
