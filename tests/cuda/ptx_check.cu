// Standalone kernels over the inline-PTX wrappers (kernels/cuda/ptx.cuh),
// checked against plain host arithmetic by tests/cuda_emulator.rs.

// Every ldmatrix variant of one warp over a 32 x 8 bf16 matrix (four 8 x 8
// matrices, one above the other): lane l writes its 14 registers to
// out[l * 14 ..]: x1, x2, x4, x1.trans, x2.trans, x4.trans.
extern "C" __global__ void ldmatrix_probe(const unsigned short* __restrict__ m,
                                          unsigned int* __restrict__ out) {
    __shared__ __align__(16) unsigned short tile[32][8];
    const int lane = threadIdx.x;
    cp_async_16(&tile[lane][0], m + lane * 8);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    unsigned int r[14];
    ldmatrix_x1(r, &tile[lane][0]);
    ldmatrix_x2(r + 1, &tile[lane][0]);
    ldmatrix_x4(r + 3, &tile[lane][0]);
    ldmatrix_x1_trans(r + 7, &tile[lane][0]);
    ldmatrix_x2_trans(r + 8, &tile[lane][0]);
    ldmatrix_x4_trans(r + 10, &tile[lane][0]);
    for (int i = 0; i < 14; ++i) {
        out[lane * 14 + i] = r[i];
    }
}

// c = a·bᵀ and c2 = a·bt for a (m x k), b (n x k) and bt (k x n), bf16, with
// m, n, k multiples of 16, 8 and 16. One warp per 16 x 8 tile of c; the K
// loop stages 16-wide slices through shared memory with cp.async, two
// stages deep; fragments come through ldmatrix (b as stored, bt
// transposed) and go into mma.sync.
extern "C" __global__ void mma_gemm(const unsigned short* __restrict__ a,
                                    const unsigned short* __restrict__ b,
                                    const unsigned short* __restrict__ bt,
                                    float* __restrict__ c, float* __restrict__ c2,
                                    int m, int n, int k) {
    __shared__ __align__(16) unsigned short as[2][16][16];
    __shared__ __align__(16) unsigned short bs[2][8][16];
    __shared__ __align__(16) unsigned short bts[2][16][8];
    const int lane = threadIdx.x;
    const int n0 = blockIdx.x * 8, m0 = blockIdx.y * 16;
    const int slices = k / 16;
    // Slice s into stage s % 2: a, 16 rows of two 16-byte halves (one per
    // lane); b, 8 rows of two halves (lanes 0-15); bt, 16 rows of one
    // (lanes 16-31).
    auto stage = [&](int s) {
        const int st = s % 2, k0 = s * 16;
        const int ar = lane / 2, ah = lane % 2;
        cp_async_16(&as[st][ar][ah * 8], a + (size_t)(m0 + ar) * k + k0 + ah * 8);
        if (lane < 16) {
            const int br = lane / 2, bh = lane % 2;
            cp_async_16(&bs[st][br][bh * 8], b + (size_t)(n0 + br) * k + k0 + bh * 8);
        } else {
            const int tr = lane - 16;
            cp_async_16(&bts[st][tr][0], bt + (size_t)(k0 + tr) * n + n0);
        }
        cp_async_commit();
    };
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float acc2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    stage(0);
    for (int s = 0; s < slices; ++s) {
        if (s + 1 < slices) {
            stage(s + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int st = s % 2;
        // a: matrix i = lane / 8 is rows (i % 2) * 8.., columns (i / 2) * 8..
        const int i = lane / 8;
        unsigned int fa[4], fb[2], fbt[2];
        ldmatrix_x4(fa, &as[st][(i % 2) * 8 + lane % 8][(i / 2) * 8]);
        ldmatrix_x2(fb, &bs[st][lane % 8][((lane / 8) % 2) * 8]);
        ldmatrix_x2_trans(fbt, &bts[st][lane % 16][0]);
        mma_bf16_16x8x16(acc, fa, fb, acc);
        mma_bf16_16x8x16(acc2, fa, fbt, acc2);
        __syncthreads();
    }
    const int g = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
        const size_t at = (size_t)(m0 + g + 8 * h) * n + n0 + 2 * t;
        c[at] = acc[2 * h];
        c[at + 1] = acc[2 * h + 1];
        c2[at] = acc2[2 * h];
        c2[at + 1] = acc2[2 * h + 1];
    }
}
