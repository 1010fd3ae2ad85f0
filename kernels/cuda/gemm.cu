// y = x Wᵀ on tensor cores: x is rows × k (bf16 activations), W is out × k
// (bf16 weights, a row per output), y rows × out.
//
// The weight is mma's A operand (16 outputs a fragment) and the
// activations its B operand (8 rows a fragment), so one decode row fills
// a fragment's 8-wide side and wastes no weight bandwidth. A block
// computes 128 outputs × 128 rows with 8 warps (2 × 4, each 64 outputs ×
// 32 rows), staging k in slices of 64 through shared memory with cp.async,
// 3 or 4 stages deep; fragments come by ldmatrix from XOR-swizzled rows
// (no bank conflicts) into mma.sync m16n8k16 with f32 accumulators. The
// tile is Hopper's size: each k-slice brings 32 KiB through L2 for 2.1
// MFLOP, and the warps' fragments read 16 FLOP per shared-memory byte
// (writes counted), where the 64 × 64 tile of 32 × 32 warps read 10.7.
//
// Invariance: k is cut into `splits` ranges fixed by the weight's shape
// (the host's `gemm_splits`, never the batch); each output's sum over a
// range is one accumulator's chain of mma steps over k = 0, 16, 32, ...
// in order, and the ranges' sums are added in order, range 0 first. A
// block either sums every range itself (`in_block`: a prefill, whose
// tiles fill the GPU) or one range, blockIdx.z, into `partial`, added by
// gemm_reduce in the same order (a decode step, whose few tiles would
// leave multiprocessors idle). Both give the same bits, whatever the
// number of rows, the tile a row falls in or how many blocks launch. Rows
// past the batch are zero-filled and their fragments skipped. Never
// atomics.
//
// Epilogues (applied once, to the final sum, then rounded once):
//   EPI_BF16      y = bf16(acc + bias)
//   EPI_F32       y = acc + bias (f32; the logits)
//   EPI_RESIDUAL  y = bf16(y + acc + bias), in place: the residual stream
//   EPI_SWIGLU    W is [gate; up]; y[r][j] = bf16(silu(gate_j + b) · (up_j + b))
// A weight of several segments (q, k and v) is one fused product; each
// segment brings its own rows and bias.

#define GEMM_BM 128
#define GEMM_BN 128
#define GEMM_BK 64
// 4 stages where a block may take 128 KiB of shared memory, else 3 (the
// host defines it); the arithmetic is the same at every depth.
#ifndef GEMM_STAGES
#define GEMM_STAGES 4
#endif
#define GEMM_THREADS 256
// One operand's k-slice: BM (= BN) rows of BK.
#define GEMM_TILE (GEMM_BM * GEMM_BK)
// 16-byte chunks a thread copies of each operand's slice.
#define GEMM_CHUNKS (GEMM_TILE / 8 / GEMM_THREADS)

#define EPI_BF16 0
#define EPI_F32 1
#define EPI_RESIDUAL 2
#define EPI_SWIGLU 3

// The host's `GemmParams` (cuda.rs), field for field.
struct GemmParams {
    const bf16* w[3];       // the weight's row segments, laid end to end
    const float* bias[3];   // each segment's bias, or null
    const bf16* x;          // rows × k
    void* y;                // rows × ldy: bf16, or f32 for EPI_F32
    float* partial;         // splits × rows × out, when splits > 1
    int seg_end[3];         // fused rows up to each segment's end
    int rows;
    int k;
    int out;                // fused weight rows (SwiGLU: gate and up)
    int ldy;
    int epilogue;
    int splits;
    int in_block;           // 1: a block adds every range itself
};
static_assert(sizeof(GemmParams) == 112, "GemmParams differs from the host's");

// 16-byte chunk `c` (of 8 per 64-wide row) of row `r`, swizzled.
__device__ __forceinline__ int gemm_swizzle(int r, int c) {
    return r * GEMM_BK + ((c ^ (r & 7)) << 3);
}

// The weight row behind fused row `row`, and (through `bias`) its bias
// or null. Selected, not indexed: a parameter array indexed at run time
// would be copied to local memory.
__device__ __forceinline__ const bf16* gemm_row(const GemmParams& p, int row, const float** bias) {
    if (row < p.seg_end[0]) {
        *bias = p.bias[0] != nullptr ? p.bias[0] + row : nullptr;
        return p.w[0] + (size_t)row * p.k;
    }
    if (row < p.seg_end[1]) {
        const int r = row - p.seg_end[0];
        *bias = p.bias[1] != nullptr ? p.bias[1] + r : nullptr;
        return p.w[1] + (size_t)r * p.k;
    }
    const int r = row - p.seg_end[1];
    *bias = p.bias[2] != nullptr ? p.bias[2] + r : nullptr;
    return p.w[2] + (size_t)r * p.k;
}

__device__ __forceinline__ float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// SwiGLU of feature `f` from its gate and up sums (and their biases).
__device__ __forceinline__ bf16 gemm_swiglu(const GemmParams& p, int f, float g, float u) {
    const float* bias;
    gemm_row(p, f, &bias);
    if (bias != nullptr) g = g + *bias;
    gemm_row(p, p.out / 2 + f, &bias);
    if (bias != nullptr) u = u + *bias;
    return f32_to_bf16(silu_mul(g, u));
}

// Writes the final sum `v` of output `o` (a fused row) for row `r`.
__device__ __forceinline__ void gemm_store(const GemmParams& p, int r, int o, float v) {
    const float* bias;
    gemm_row(p, o, &bias);
    if (bias != nullptr) {
        v = v + *bias;
    }
    const size_t at = (size_t)r * p.ldy + o;
    if (p.epilogue == EPI_F32) {
        ((float*)p.y)[at] = v;
    } else if (p.epilogue == EPI_RESIDUAL) {
        bf16* y = (bf16*)p.y;
        y[at] = f32_to_bf16(bf16_to_f32(y[at]) + v);
    } else {
        ((bf16*)p.y)[at] = f32_to_bf16(v);
    }
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1) gemm(const GemmParams p) {
    extern __shared__ __align__(16) bf16 gemm_smem[];
    bf16* const a_s = gemm_smem;                            // STAGES × BM × BK
    bf16* const b_s = gemm_smem + GEMM_STAGES * GEMM_TILE;  // STAGES × BN × BK
    const int tid = threadIdx.x;
    const int lane = tid % 32;
    const int warp_m = tid / 128;       // outputs warp_m·64 ..
    const int warp_n = (tid / 32) % 4;  // rows warp_n·32 ..
    const int n0 = blockIdx.x * GEMM_BN;
    const int mb = blockIdx.y;
    const bool swiglu = p.epilogue == EPI_SWIGLU;
    const int features = swiglu ? p.out / 2 : p.out;
    const int block_rows = min(GEMM_BN, p.rows - n0);

    // This thread's 16-byte chunks of each slice: tile row idx / 8, chunk
    // idx % 8. Their source rows do not change along k.
    const bf16* a_src[GEMM_CHUNKS];
    const bf16* b_src[GEMM_CHUNKS];
    bool a_ok[GEMM_CHUNKS], b_ok[GEMM_CHUNKS];
#pragma unroll
    for (int i = 0; i < GEMM_CHUNKS; ++i) {
        const int idx = tid + GEMM_THREADS * i;
        const int row = idx / 8, chunk = idx % 8;
        // SwiGLU: tile rows alternate eight gate rows and the same eight
        // up rows, so a fragment's rows g and g + 8 are one feature's pair.
        int fused;
        if (swiglu) {
            const int f = mb * (GEMM_BM / 2) + (row >> 4) * 8 + (row & 7);
            a_ok[i] = f < features;
            fused = ((row >> 3) & 1) * features + f;
        } else {
            fused = mb * GEMM_BM + row;
            a_ok[i] = fused < p.out;
        }
        const float* bias;
        a_src[i] = a_ok[i] ? gemm_row(p, fused, &bias) + chunk * 8 : p.x;
        b_ok[i] = n0 + row < p.rows;
        b_src[i] = p.x + (b_ok[i] ? (size_t)(n0 + row) * p.k + chunk * 8 : 0);
    }
    // The ranges this block adds, and the k-slices they span.
    const int k_tiles = (p.k + GEMM_BK - 1) / GEMM_BK;
    const int s_first = p.in_block ? 0 : (int)blockIdx.z;
    const int s_last = p.in_block ? p.splits : (int)blockIdx.z + 1;
    const int kt0 = s_first * k_tiles / p.splits;
    const int kt1 = s_last * k_tiles / p.splits;

    auto load = [&](int kt, int stage) {
        const int kb = kt * GEMM_BK;
#pragma unroll
        for (int i = 0; i < GEMM_CHUNKS; ++i) {
            const int idx = tid + GEMM_THREADS * i;
            const int row = idx / 8, chunk = idx % 8;
            const bool in_k = kb + chunk * 8 < p.k;
            const int at = stage * GEMM_TILE + gemm_swizzle(row, chunk);
            const bool a = a_ok[i] && in_k, b = b_ok[i] && in_k;
            cp_async_16_zfill(a_s + at, a ? a_src[i] + kb : p.x, a ? 16 : 0);
            cp_async_16_zfill(b_s + at, b ? b_src[i] + kb : p.x, b ? 16 : 0);
        }
    };

    // acc: the current range's chain; sum: the ranges before it, added.
    float acc[4][4][4], sum[4][4][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                acc[mi][ni][e] = 0.0f;
                sum[mi][ni][e] = 0.0f;
            }

    // Warp-uniform: which of this warp's 8-row fragments hold batch rows.
    const int n_frags = min(4, max(0, (block_rows - warp_n * 32 + 7) / 8));

#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; ++s) {
        if (kt0 + s < kt1) load(kt0 + s, s);
        cp_async_commit();
    }
    int range = s_first;
    int range_end = (range + 1) * k_tiles / p.splits;
    for (int kt = kt0; kt < kt1; ++kt) {
        cp_async_wait<GEMM_STAGES - 2>();
        __syncthreads();
        // Into the stage every warp finished with at the barrier above.
        const int next = kt + GEMM_STAGES - 1;
        if (next < kt1) load(next, (next - kt0) % GEMM_STAGES);
        cp_async_commit();
        if (n_frags > 0) {
            const bf16* as = a_s + ((kt - kt0) % GEMM_STAGES) * GEMM_TILE;
            const bf16* bs = b_s + ((kt - kt0) % GEMM_STAGES) * GEMM_TILE;
#pragma unroll
            for (int kk = 0; kk < GEMM_BK / 16; ++kk) {
                unsigned int a[4][4], b[4][2];
#pragma unroll
                for (int mi = 0; mi < 4; ++mi) {
                    const int row = warp_m * 64 + mi * 16 + (lane & 15);
                    ldmatrix_x4(a[mi], as + gemm_swizzle(row, kk * 2 + (lane >> 4)));
                }
#pragma unroll
                for (int nj = 0; nj < 2; ++nj) {
                    if (nj * 2 < n_frags) {
                        const int row = warp_n * 32 + nj * 16 + ((lane >> 4) << 3) + (lane & 7);
                        unsigned int r[4];
                        ldmatrix_x4(r, bs + gemm_swizzle(row, kk * 2 + ((lane >> 3) & 1)));
                        b[nj * 2][0] = r[0];
                        b[nj * 2][1] = r[1];
                        b[nj * 2 + 1][0] = r[2];
                        b[nj * 2 + 1][1] = r[3];
                    }
                }
#pragma unroll
                for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                    for (int ni = 0; ni < 4; ++ni)
                        if (ni < n_frags) mma_bf16_16x8x16(acc[mi][ni], a[mi], b[ni], acc[mi][ni]);
            }
        }
        if (kt + 1 == range_end) {
            // The range is summed: the first is the sum so far as it is
            // (a copy, as gemm_reduce takes it: 0 + x would turn -0 to +0),
            // each later one added to it; its chain starts again at zero.
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        sum[mi][ni][e] = range == s_first ? acc[mi][ni][e]
                                                          : sum[mi][ni][e] + acc[mi][ni][e];
                        acc[mi][ni][e] = 0.0f;
                    }
            ++range;
            range_end = (range + 1) * k_tiles / p.splits;
        }
    }
    cp_async_wait<0>();
    // One range of several: its sum goes to `partial` for gemm_reduce.
    const bool to_partial = !p.in_block && p.splits > 1;
    const int split = blockIdx.z;

    // Sum element e of fragment (mi, ni): tile row
    // warp_m·64 + mi·16 + g + 8·(e / 2), batch row warp_n·32 + ni·8 + 2t + e % 2.
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
            if (ni >= n_frags) continue;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int r = n0 + warp_n * 32 + ni * 8 + 2 * t + e;
                if (r >= p.rows) continue;
                const int trow = warp_m * 64 + mi * 16 + g;
                const float lo = sum[mi][ni][e], hi = sum[mi][ni][2 + e];
                if (swiglu) {
                    const int f = mb * (GEMM_BM / 2) + (trow >> 4) * 8 + (trow & 7);
                    if (f >= features) continue;
                    if (to_partial) {
                        float* part = p.partial + ((size_t)split * p.rows + r) * p.out;
                        part[f] = lo;
                        part[features + f] = hi;
                    } else {
                        ((bf16*)p.y)[(size_t)r * p.ldy + f] = gemm_swiglu(p, f, lo, hi);
                    }
                    continue;
                }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int o = mb * GEMM_BM + trow + 8 * h;
                    if (o >= p.out) continue;
                    const float v = h == 0 ? lo : hi;
                    if (to_partial) {
                        p.partial[((size_t)split * p.rows + r) * p.out + o] = v;
                    } else {
                        gemm_store(p, r, o, v);
                    }
                }
            }
        }
    }
}

// The split-K sums: one thread per output, the ranges added in order,
// then the epilogue.
extern "C" __global__ void gemm_reduce(const GemmParams p) {
    const bool swiglu = p.epilogue == EPI_SWIGLU;
    const int features = swiglu ? p.out / 2 : p.out;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)p.rows * features) {
        return;
    }
    const int r = (int)(idx / features), f = (int)(idx % features);
    const size_t stride = (size_t)p.rows * p.out;
    const float* part = p.partial + (size_t)r * p.out;
    float v = part[f];
    for (int s = 1; s < p.splits; ++s) {
        v = v + part[s * stride + f];
    }
    if (swiglu) {
        float u = part[features + f];
        for (int s = 1; s < p.splits; ++s) {
            u = u + part[s * stride + features + f];
        }
        ((bf16*)p.y)[(size_t)r * p.ldy + f] = gemm_swiglu(p, f, v, u);
    } else {
        gemm_store(p, r, f, v);
    }
}
