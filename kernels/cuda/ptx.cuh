// Inline PTX behind device functions, for kernels on sm_80 and later: the
// warp-wide bf16 matrix multiply-accumulate (mma.sync m16n8k16), matrix
// loads from shared memory (ldmatrix, plain and transposed) and
// asynchronous global-to-shared copies (cp.async, in commit groups).
//
// On a GPU (__CUDA_ARCH__) each is one PTX instruction. On the CUDA
// emulator each is the emulator's implementation of the PTX ISA's
// definition: the same fragment layouts, lane by lane, and cp.async copies
// that happen only when their group is waited for, so a missing wait reads
// shared memory nobody wrote (0xff bytes: NaN).
//
// Fragments, lane l of a warp, g = l / 4, t = l % 4; each 32-bit register
// holds two bf16 values, the lower index in its low half:
//   a (16x16, row-major): {A[g][2t..+1], A[g+8][2t..+1], A[g][2t+8..+9], A[g+8][2t+8..+9]}
//   b (16x8, "col": B[k][n]): {B[2t..+1][g], B[2t+8..+9][g]}
//   c, d (16x8 f32): {C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]}
//   ldmatrix: lanes 8i..8i+7 give the row addresses of matrix i (16-byte
//   rows); lane l gets row l/4, columns 2(l%4) and 2(l%4)+1 of each, or
//   with .trans column l/4, rows 2(l%4) and 2(l%4)+1.

#ifdef __CUDA_ARCH__
__device__ __forceinline__ unsigned int shared_address(const void* p) {
    unsigned long long s;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(p));
    return (unsigned int)s;
}
#endif

// d = a·b + c, one warp, m16n8k16, bf16 inputs and f32 accumulators.
__device__ __forceinline__ void mma_bf16_16x8x16(float* d, const unsigned int* a,
                                                 const unsigned int* b, const float* c) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    ::emu::mma_bf16_m16n8k16(d, a, b, c, __FILE__, __LINE__);
#endif
}

// ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: `row` is this
// lane's row address in shared memory (lanes past 8·count give none that
// is read).
#ifdef __CUDA_ARCH__
#define STATEBENCH_LDMATRIX(name, count, trans, regs, outs)                                \
    __device__ __forceinline__ void name(unsigned int* r, const void* row) {              \
        asm volatile("ldmatrix.sync.aligned.m8n8.x" #count trans ".shared.b16 " regs      \
                     ", [%" #count "];\n"                                                 \
                     : outs                                                               \
                     : "r"(shared_address(row)));                                         \
    }
#define STATEBENCH_R1 "=r"(r[0])
#define STATEBENCH_R2 "=r"(r[0]), "=r"(r[1])
#define STATEBENCH_R4 "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
STATEBENCH_LDMATRIX(ldmatrix_x1, 1, "", "{%0}", STATEBENCH_R1)
STATEBENCH_LDMATRIX(ldmatrix_x2, 2, "", "{%0, %1}", STATEBENCH_R2)
STATEBENCH_LDMATRIX(ldmatrix_x4, 4, "", "{%0, %1, %2, %3}", STATEBENCH_R4)
STATEBENCH_LDMATRIX(ldmatrix_x1_trans, 1, ".trans", "{%0}", STATEBENCH_R1)
STATEBENCH_LDMATRIX(ldmatrix_x2_trans, 2, ".trans", "{%0, %1}", STATEBENCH_R2)
STATEBENCH_LDMATRIX(ldmatrix_x4_trans, 4, ".trans", "{%0, %1, %2, %3}", STATEBENCH_R4)
#else
#define STATEBENCH_LDMATRIX(name, count, trans)                                \
    __device__ __forceinline__ void name(unsigned int* r, const void* row) {  \
        ::emu::ldmatrix(r, count, trans, row, __FILE__, __LINE__);            \
    }
STATEBENCH_LDMATRIX(ldmatrix_x1, 1, false)
STATEBENCH_LDMATRIX(ldmatrix_x2, 2, false)
STATEBENCH_LDMATRIX(ldmatrix_x4, 4, false)
STATEBENCH_LDMATRIX(ldmatrix_x1_trans, 1, true)
STATEBENCH_LDMATRIX(ldmatrix_x2_trans, 2, true)
STATEBENCH_LDMATRIX(ldmatrix_x4_trans, 4, true)
#endif
#undef STATEBENCH_LDMATRIX
#undef STATEBENCH_R1
#undef STATEBENCH_R2
#undef STATEBENCH_R4

// cp.async.cg.shared.global, 16 bytes: `dst` in shared memory, `src` in
// global memory, both 16-byte aligned; done by the time a wait covers the
// group it was committed in.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst)),
                 "l"(src)
                 : "memory");
#else
    ::emu::cp_async(dst, src, 16, 16);
#endif
}

// As cp_async_16, copying the first `src_bytes` (0 or 16) of `src` and
// zero-filling the rest: a tile's rows past the data read nothing.
__device__ __forceinline__ void cp_async_16_zfill(void* dst, const void* src, int src_bytes) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
                 "l"(src), "r"(src_bytes)
                 : "memory");
#else
    ::emu::cp_async(dst, src, 16, (unsigned int)src_bytes);
#endif
}

// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    ::emu::cp_async_commit();
#endif
}

// Waits until at most `Pending` committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#else
    ::emu::cp_async_wait(Pending);
#endif
}
