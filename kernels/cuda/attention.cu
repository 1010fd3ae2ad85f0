// Causal attention over the paged bf16 KV cache, on tensor cores.
//
// Each layer's keys and values live in a pool of blocks of KV_BLOCK
// positions, [block][kv_head][KV_BLOCK][dim]; a sequence owns a list of
// blocks (its block table).
//
// The arithmetic of one query row at position p and one head, the same in
// every batch, for prefill and decode, cached or cold:
// - its positions 0..p in chunks of ATTN_CHUNK by absolute position; each
//   chunk reduced from scratch in sub-tiles of KV_BLOCK positions, in
//   order: scores q·k by mma over the head dimension, a running max and
//   rescaling (an online softmax), P rounded to bf16, l += Σ P (each
//   thread's columns in order, the quad's four sums at the chunk's end in
//   a fixed tree) and acc += P·V by mma over the positions;
// - the chunks' (m, l, acc) folded left to right (attn_fold, with explicit
//   roundings so no compiler contraction differs between the kernels that
//   fold), and the output acc / l rounded to bf16.
// Positions past a row's own are masked: their P is exactly 0 and their
// V is a finite value or zero-filled, so a sub-tile with nothing of a row
// leaves that row's state bit for bit as it was. A decode row computes
// exactly what the same row computes inside a prefill tile.
//
// A block takes one tile (up to 64 / group consecutive rows of one
// sequence) and one KV head: the 64 "M-rows" (row, query head of the
// group) of mma's A operand share every K/V sub-tile, staged once in
// shared memory (cp.async, double-buffered where shared memory allows) for
// all of the group's query heads. Blocks along z split a tile's chunks
// (chunk c to block c mod splits) when tiles alone would leave the GPU
// idle; each chunk's result then goes to `partial` and attention_merge
// folds them in order. With one split the block folds as it goes: the
// same fold, the same bits.

// The host's `AttnParams` (cuda.rs), field for field.
struct AttnParams {
    const bf16* q;          // rows × heads × dim
    const bf16* kpool;
    const bf16* vpool;
    bf16* out;              // rows × heads × dim
    float* partial;         // rows × heads × chunk_cap × (dim + 2): m, l, acc
    const int* tiles;       // per tile: first row, rows
    const int* row_pos;     // per row: its position; < 0 for a padding row
    const int* row_table;   // per row: where its block table starts in `tables`
    const int* tables;
    int heads;
    int kv_heads;
    int dim;
    int splits;
    int chunk_cap;
    float scale_log2;       // softmax scale · log2(e)
};
static_assert(sizeof(AttnParams) == 96, "AttnParams differs from the host's");

#define ATTN_THREADS 128
#define ATTN_M 64  // M-rows a block: 4 warps of 16
// K/V sub-tiles in flight: 2 where a block may take 112 KiB of shared
// memory, else 1 (the host defines it); the arithmetic is the same.
#ifndef ATTN_KV_STAGES
#define ATTN_KV_STAGES 2
#endif

// Folds a chunk's (m, l) into the running (M, L); `wa` and `wb` weigh the
// running accumulator and the chunk's.
__device__ __forceinline__ void attn_fold(float& M, float& L, float m, float l, float& wa,
                                          float& wb) {
    const float m2 = fmaxf(M, m);
    wa = exp2f(M - m2);
    wb = exp2f(m - m2);
    L = __fadd_rn(__fmul_rn(L, wa), __fmul_rn(l, wb));
    M = m2;
}

__device__ __forceinline__ float attn_mix(float acc, float wa, float a, float wb) {
    return __fadd_rn(__fmul_rn(acc, wa), __fmul_rn(a, wb));
}

// 16-byte chunk `c` of row `r` in a tile of D-wide bf16 rows; rows of 8
// chunks or more are XOR-swizzled so ldmatrix's eight rows hit distinct banks.
template <int D>
__device__ __forceinline__ int attn_at(int r, int c) {
    return r * D + (((D / 8) >= 8 ? (c ^ (r & 7)) : c) << 3);
}

template <int D>
__device__ __forceinline__ void attention_tile(const AttnParams& p) {
    constexpr int CPR = D / 8;                    // 16-byte chunks per row
    constexpr int STAGES = ATTN_KV_STAGES;
    constexpr int NF = D / 8;                     // accumulator fragments
    extern __shared__ __align__(16) bf16 attn_smem[];
    bf16* const q_s = attn_smem;                           // ATTN_M × D
    bf16* const k_s = attn_smem + ATTN_M * D;              // STAGES × KV_BLOCK × D
    bf16* const v_s = k_s + STAGES * KV_BLOCK * D;
    // The running fold over chunks, each thread's own accumulator values
    // (NF × 4 of them, [value][thread]): kept here, not in registers, which
    // hold the chunk's own accumulator.
    float* const o_s = (float*)(v_s + STAGES * KV_BLOCK * D);

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t = lane % 4;
    const int tile = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int group = p.heads / p.kv_heads;
    const int row0 = p.tiles[2 * tile], nrows = p.tiles[2 * tile + 1];
    const int p_first = p.row_pos[row0];
    if (p_first < 0) {
        // A padding row: zeros (the merge writes them when chunks are split).
        if (p.splits == 1) {
            for (int i = tid; i < group * D; i += ATTN_THREADS) {
                p.out[((size_t)row0 * p.heads + kvh * group) * D + i] = 0;
            }
        }
        return;
    }
    const int m_used = nrows * group;
    // The tile's rows are consecutive positions of one sequence.
    const int p_max = p_first + nrows - 1;
    const int* table = p.tables + p.row_table[row0];
    const int n_chunks = p_max / ATTN_CHUNK + 1;

    for (int i = tid; i < ATTN_M * CPR; i += ATTN_THREADS) {
        const int m = i / CPR, c = i % CPR;
        const bool ok = m < m_used;
        const size_t src =
            ok ? ((size_t)(row0 + m / group) * p.heads + kvh * group + m % group) * D + c * 8 : 0;
        cp_async_16_zfill(q_s + attn_at<D>(m, c), p.q + src, ok ? 16 : 0);
    }
    cp_async_commit();

    // Sub-tile `sub` of chunk `c` into stage `st`; positions past p_max
    // are zero-filled (their V must be finite: P · V with P = 0).
    auto load = [&](int c, int sub, int st) {
        const int first = c * ATTN_CHUNK + sub * KV_BLOCK;
        const size_t base =
            ((size_t)table[first / KV_BLOCK] * p.kv_heads + kvh) * (size_t)(KV_BLOCK * D);
        for (int i = tid; i < KV_BLOCK * CPR; i += ATTN_THREADS) {
            const int r = i / CPR, ch = i % CPR;
            const int bytes = first + r <= p_max ? 16 : 0;
            const size_t at = base + (size_t)r * D + ch * 8;
            cp_async_16_zfill(k_s + st * KV_BLOCK * D + attn_at<D>(r, ch), p.kpool + at, bytes);
            cp_async_16_zfill(v_s + st * KV_BLOCK * D + attn_at<D>(r, ch), p.vpool + at, bytes);
        }
    };
    auto subs_of = [&](int c) { return min(ATTN_CHUNK / KV_BLOCK, (p_max - c * ATTN_CHUNK) / KV_BLOCK + 1); };

    // This warp's M-rows 16·warp + g and + 8: their positions and whether
    // they exist.
    const bool active = warp * 16 < m_used;
    int rpos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int m = warp * 16 + g + 8 * h;
        rpos[h] = m < m_used ? p_first + m / group : -1;
    }

    // The running fold over chunks (one split) and each chunk's own state.
    float M[2] = {NEG_INF, NEG_INF}, L[2] = {0.0f, 0.0f};
    float acc[NF][4];
    if (p.splits == 1) {
        for (int i = 0; i < NF * 4; ++i) o_s[i * ATTN_THREADS + tid] = 0.0f;
    }

    int item = 0;  // sub-tiles loaded so far, for the stage
    if (split < n_chunks) load(split, 0, 0);
    cp_async_commit();
    for (int c = split; c < n_chunks; c += p.splits) {
        float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
#pragma unroll
        for (int f = 0; f < NF; ++f)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[f][e] = 0.0f;
        const int subs = subs_of(c);
        for (int sub = 0; sub < subs; ++sub, ++item) {
            const int st = STAGES == 2 ? item & 1 : 0;
            const int next_c = sub + 1 < subs ? c : c + p.splits;
            const int next_sub = sub + 1 < subs ? sub + 1 : 0;
            const bool has_next = next_c < n_chunks;
            if (STAGES == 2 && has_next) load(next_c, next_sub, (item + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
            __syncthreads();
            if (active) {
                const bf16* ks = k_s + st * KV_BLOCK * D;
                const bf16* vs = v_s + st * KV_BLOCK * D;
                // Scores: 16 M-rows × 64 positions.
                float s[8][4];
#pragma unroll
                for (int f = 0; f < 8; ++f)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[f][e] = 0.0f;
                // Not unrolled: the loads of every slice at once would
                // need more registers than the scores and accumulators leave.
#pragma unroll 1
                for (int kk = 0; kk < D / 16; ++kk) {
                    unsigned int a[4];
                    ldmatrix_x4(a, q_s + attn_at<D>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
                    for (int np = 0; np < 4; ++np) {
                        unsigned int r[4];
                        ldmatrix_x4(r, ks + attn_at<D>(np * 16 + ((lane >> 4) << 3) + (lane & 7),
                                                       kk * 2 + ((lane >> 3) & 1)));
                        const unsigned int b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                        mma_bf16_16x8x16(s[np * 2], a, b0, s[np * 2]);
                        mma_bf16_16x8x16(s[np * 2 + 1], a, b1, s[np * 2 + 1]);
                    }
                }
                // Mask, then the online softmax of each of the two rows.
                const int first = c * ATTN_CHUNK + sub * KV_BLOCK;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float mx = NEG_INF;
#pragma unroll
                    for (int f = 0; f < 8; ++f)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int pos = first + f * 8 + 2 * t + e;
                            float& x = s[f][2 * h + e];
                            x = pos <= rpos[h] ? x * p.scale_log2 : NEG_INF;
                            mx = fmaxf(mx, x);
                        }
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float m_new = fmaxf(m[h], mx);
                    const float corr = m_new == NEG_INF ? 1.0f : exp2f(m[h] - m_new);
                    float sum = 0.0f;
#pragma unroll
                    for (int f = 0; f < 8; ++f)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            float& x = s[f][2 * h + e];
                            x = x == NEG_INF ? 0.0f : bf16_to_f32(f32_to_bf16(exp2f(x - m_new)));
                            sum = sum + x;
                        }
                    l[h] = l[h] * corr + sum;
                    m[h] = m_new;
#pragma unroll
                    for (int f = 0; f < NF; ++f) {
                        acc[f][2 * h] *= corr;
                        acc[f][2 * h + 1] *= corr;
                    }
                }
                // acc += P · V, 16 positions at a time.
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    const unsigned int a[4] = {
                        pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                        pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                        pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                        pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]),
                    };
#pragma unroll
                    for (int dp = 0; dp < D / 16; ++dp) {
                        unsigned int r[4];
                        ldmatrix_x4_trans(r, vs + attn_at<D>(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7),
                                                             dp * 2 + (lane >> 4)));
                        const unsigned int b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                        mma_bf16_16x8x16(acc[dp * 2], a, b0, acc[dp * 2]);
                        mma_bf16_16x8x16(acc[dp * 2 + 1], a, b1, acc[dp * 2 + 1]);
                    }
                }
            }
            __syncthreads();
            if (STAGES == 1 && has_next) {
                load(next_c, next_sub, 0);
                cp_async_commit();
            }
        }
        if (!active) continue;
        // The chunk's l: the quad's four column sums, in a fixed tree.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l[h] = l[h] + __shfl_xor_sync(0xffffffffu, l[h], 1);
            l[h] = l[h] + __shfl_xor_sync(0xffffffffu, l[h], 2);
        }
        if (p.splits == 1) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // Only chunks holding some of the row's positions, as a
                // decode row sees them.
                if (c * ATTN_CHUNK > rpos[h]) continue;
                float wa, wb;
                attn_fold(M[h], L[h], m[h], l[h], wa, wb);
#pragma unroll
                for (int f = 0; f < NF; ++f) {
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; ++e) {
                        float& o = o_s[(f * 4 + e) * ATTN_THREADS + tid];
                        o = attn_mix(o, wa, acc[f][e], wb);
                    }
                }
            }
            continue;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int mrow = warp * 16 + g + 8 * h;
            if (mrow >= m_used) continue;
            const int row = row0 + mrow / group, head = kvh * group + mrow % group;
            float* part =
                p.partial + (((size_t)row * p.heads + head) * p.chunk_cap + c) * (size_t)(D + 2);
            if (t == 0) {
                part[0] = m[h];
                part[1] = l[h];
            }
#pragma unroll
            for (int f = 0; f < NF; ++f) {
                part[2 + f * 8 + 2 * t] = acc[f][2 * h];
                part[2 + f * 8 + 2 * t + 1] = acc[f][2 * h + 1];
            }
        }
    }
    cp_async_wait<0>();
    if (p.splits != 1 || !active) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int mrow = warp * 16 + g + 8 * h;
        if (mrow >= m_used) continue;
        const int row = row0 + mrow / group, head = kvh * group + mrow % group;
        bf16* o = p.out + ((size_t)row * p.heads + head) * D;
#pragma unroll
        for (int f = 0; f < NF; ++f) {
            const float o0 = o_s[(f * 4 + 2 * h) * ATTN_THREADS + tid];
            const float o1 = o_s[(f * 4 + 2 * h + 1) * ATTN_THREADS + tid];
            o[f * 8 + 2 * t] = f32_to_bf16(__fdiv_rn(o0, L[h]));
            o[f * 8 + 2 * t + 1] = f32_to_bf16(__fdiv_rn(o1, L[h]));
        }
    }
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_d16(const AttnParams p) {
    attention_tile<16>(p);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_d32(const AttnParams p) {
    attention_tile<32>(p);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_d64(const AttnParams p) {
    attention_tile<64>(p);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_d128(const AttnParams p) {
    attention_tile<128>(p);
}

// The split chunks' results, folded in order: one block per (row, head),
// one thread per dimension.
extern "C" __global__ void attention_merge(const AttnParams p) {
    const int row = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
    const int D = p.dim;
    bf16* o = p.out + ((size_t)row * p.heads + head) * D;
    const int pos = p.row_pos[row];
    if (pos < 0) {
        o[d] = 0;
        return;
    }
    const float* part = p.partial + ((size_t)row * p.heads + head) * p.chunk_cap * (size_t)(D + 2);
    float M = NEG_INF, L = 0.0f, O = 0.0f;
    for (int c = 0; c <= pos / ATTN_CHUNK; ++c) {
        const float* pc = part + (size_t)c * (D + 2);
        float wa, wb;
        attn_fold(M, L, pc[0], pc[1], wa, wb);
        O = attn_mix(O, wa, pc[2 + d], wb);
    }
    o[d] = f32_to_bf16(__fdiv_rn(O, L));
}
