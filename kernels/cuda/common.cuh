// Shared by every statebench CUDA kernel set; prepended to each source
// before NVRTC compiles it (NVRTC ships no CUDA headers we rely on).
//
// Weights, activations between kernels and the KV cache are bf16, held as
// their 16 bits; every kernel computes in f32 and rounds what it writes
// once, to nearest even. Norm weights, biases and the RoPE table are f32.

typedef unsigned short bf16;

// Positions per KV-cache block, and per attention sub-tile: a sub-tile is
// one block.
#define KV_BLOCK 64
// Positions per attention chunk: a row's positions are reduced chunk by
// chunk (by absolute position), and the chunks' results folded in order.
#define ATTN_CHUNK 256

// -infinity, without math.h.
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf16_to_f32(bf16 b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

// Round to nearest even; a NaN stays a (quiet) NaN of the same sign, as
// the host's `f32_to_bf16`.
__device__ __forceinline__ bf16 f32_to_bf16(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16)((u >> 16) | 0x40u);
    }
    return (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Two bf16 in one register, the first in the low half (mma's order).
__device__ __forceinline__ unsigned int pack_bf16(float lo, float hi) {
    return (unsigned int)f32_to_bf16(lo) | ((unsigned int)f32_to_bf16(hi) << 16);
}
