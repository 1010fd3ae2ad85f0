// Shared by every statebench CUDA kernel set; prepended to each source
// before NVRTC compiles it (NVRTC ships no CUDA headers we rely on).
//
// Weights are bf16, stored as their 16 bits; activations, norms, RoPE
// tables and the KV cache are f32. bf16 widens to f32 exactly.

#define KV_BLOCK 16

// -infinity, without math.h.
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf16_to_f32(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}
