// The attention's inputs, one row a block, one head a warp at a time:
// Qwen3's RMSNorm of each query and key head, the rotary embedding
// ("rotate half": (x[i], x[i + half]) turns by the angle of (pos, i), read
// from the table built once on the host), the query written out and the
// key and value written into the paged cache at the row's slot. Each value
// is read once and rounded once, when written.
//
// The same kernel serves the separate operations: RoPE in place (no keys),
// and the cache write of given keys and values (no queries, no rotation).

// The host's `RopeParams` (cuda.rs), field for field.
struct RopeParams {
    const bf16* q_src;     // rows × q_ld, heads × dim from its first column
    bf16* q_dst;           // rows × heads × dim (may be q_src, with q_ld = heads × dim)
    const bf16* k_src;     // rows × kv_ld
    const bf16* v_src;     // rows × kv_ld
    bf16* kpool;           // [block][kv_head][KV_BLOCK][dim]
    bf16* vpool;
    const float* q_norm;   // dim, or null: no norm
    const float* k_norm;
    const float* cos_t;    // positions × dim / 2, or null: no rotation
    const float* sin_t;
    const int* pos;        // per row; < 0 for a padding row
    const int* slots;      // per row: block · KV_BLOCK + offset
    int rows;
    int q_ld;
    int kv_ld;
    int heads;             // query heads (0: none)
    int kv_heads;          // key/value heads (0: none)
    int dim;
    int rotate_k;
    float eps;
};
static_assert(sizeof(RopeParams) == 128, "RopeParams differs from the host's");

#define ROPE_THREADS 128
#define ROPE_MAX_DIM 256

extern "C" __global__ void __launch_bounds__(ROPE_THREADS) rope_kv(const RopeParams p) {
    __shared__ float buf[ROPE_THREADS / 32][ROPE_MAX_DIM];
    const int row = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int pos = p.pos[row];
    const int half = p.dim / 2;
    float* b = buf[warp];
    for (int hh = warp; hh < p.heads + p.kv_heads; hh += ROPE_THREADS / 32) {
        const bool is_q = hh < p.heads;
        const int kh = hh - p.heads;
        const bf16* src = is_q ? p.q_src + (size_t)row * p.q_ld + (size_t)hh * p.dim
                               : p.k_src + (size_t)row * p.kv_ld + (size_t)kh * p.dim;
        const float* norm = is_q ? p.q_norm : p.k_norm;
        const bool rotate = p.cos_t != nullptr && (is_q || p.rotate_k);
        bf16* dst;
        if (is_q) {
            dst = p.q_dst + ((size_t)row * p.heads + hh) * p.dim;
        } else {
            const int slot = pos < 0 ? -1 : p.slots[row];
            if (slot < 0) continue;
            const size_t at =
                (((size_t)(slot / KV_BLOCK) * p.kv_heads + kh) * KV_BLOCK + slot % KV_BLOCK) * p.dim;
            dst = p.kpool + at;
            const bf16* vsrc = p.v_src + (size_t)row * p.kv_ld + (size_t)kh * p.dim;
            for (int i = lane; i < p.dim; i += 32) {
                p.vpool[at + i] = vsrc[i];
            }
        }
        if (pos < 0) {
            for (int i = lane; i < p.dim; i += 32) dst[i] = 0;
            continue;
        }
        float ss = 0.0f;
        for (int i = lane; i < p.dim; i += 32) {
            const float x = bf16_to_f32(src[i]);
            b[i] = x;
            ss = fmaf(x, x, ss);
        }
        if (norm != nullptr) {
            // Lane sums in a fixed tree; every lane gets the same bits.
            for (int o = 16; o > 0; o >>= 1) {
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
            }
            const float scale = 1.0f / sqrtf(ss / (float)p.dim + p.eps);
            for (int i = lane; i < p.dim; i += 32) {
                b[i] = (b[i] * scale) * norm[i];
            }
        }
        __syncwarp();
        if (rotate) {
            const float* c = p.cos_t + (size_t)pos * half;
            const float* s = p.sin_t + (size_t)pos * half;
            for (int i = lane; i < half; i += 32) {
                const float x0 = b[i], x1 = b[i + half];
                dst[i] = f32_to_bf16(x0 * c[i] - x1 * s[i]);
                dst[i + half] = f32_to_bf16(x1 * c[i] + x0 * s[i]);
            }
        } else {
            for (int i = lane; i < p.dim; i += 32) dst[i] = f32_to_bf16(b[i]);
        }
        __syncwarp();
    }
}
