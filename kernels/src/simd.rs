//! Hand-written x86 dot products for block formats whose stock kernel is
//! scalar. Each keeps one fixed summation order per dot product (block by
//! block, in order), so batching and threading never change its result.

use candle_core::quantized::k_quants::{BlockQ5_0, BlockQ8_0, GgmlType};

/// Byte layout of a Q5_0 block (the same as the ggml format).
#[repr(C)]
struct RawQ5_0 {
    d: half::f16,
    qh: [u8; 4],
    qs: [u8; 16],
}

/// Byte layout of a Q8_0 block.
#[repr(C)]
struct RawQ8_0 {
    d: half::f16,
    qs: [i8; 32],
}

const _: () = assert!(std::mem::size_of::<RawQ5_0>() == std::mem::size_of::<BlockQ5_0>());
const _: () = assert!(std::mem::size_of::<RawQ8_0>() == std::mem::size_of::<BlockQ8_0>());

/// Q5_0 · Q8_0 over `n` elements: AVX2 when the CPU has it, else the stock kernel.
pub fn vec_dot_q5_0_q8_0(n: usize, xs: &[BlockQ5_0], ys: &[BlockQ8_0]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2() {
            let nb = n / 32;
            assert!(xs.len() >= nb && ys.len() >= nb);
            // SAFETY: the raw structs mirror the block layouts (sizes checked
            // at compile time, both `repr(C)`), lengths were checked above and
            // the CPU supports AVX2 and FMA.
            unsafe {
                let x = std::slice::from_raw_parts(xs.as_ptr() as *const RawQ5_0, nb);
                let y = std::slice::from_raw_parts(ys.as_ptr() as *const RawQ8_0, nb);
                return avx2::q5_0_q8_0(x, y);
            }
        }
    }
    BlockQ5_0::vec_dot(n, xs, ys)
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{RawQ5_0, RawQ8_0};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(x: __m256) -> f32 {
        let hi = _mm256_extractf128_ps(x, 1);
        let lo = _mm256_castps256_ps128(x);
        let s = _mm_add_ps(hi, lo);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// 32 bytes, each 0xFF where the corresponding bit of `qh` is set.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bytes_from_bits(qh: [u8; 4]) -> __m256i {
        let x = u32::from_le_bytes(qh) as i32;
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0x0000000000000000,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf);
        let mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        let bytes = _mm256_or_si256(bytes, mask);
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn q5_0_q8_0(x: &[RawQ5_0], y: &[RawQ8_0]) -> f32 {
        let low = _mm256_set1_epi8(0x0F);
        let high = _mm256_set1_epi8(0xF0u8 as i8);
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        for (bx, by) in x.iter().zip(y) {
            let d = _mm256_set1_ps(bx.d.to_f32() * by.d.to_f32());
            // Low nibbles are elements 0..16, high nibbles 16..32.
            let tmp = _mm_loadu_si128(bx.qs.as_ptr() as *const __m128i);
            let nib =
                _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
            let nib = _mm256_and_si256(nib, low);
            // Where the fifth bit is clear, the value is q - 16: set the high nibble.
            let hi = _mm256_andnot_si256(bytes_from_bits(bx.qh), high);
            let qx = _mm256_or_si256(nib, hi);
            let qy = _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i);
            let ax = _mm256_sign_epi8(qx, qx);
            let sy = _mm256_sign_epi8(qy, qx);
            let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), acc);
        }
        hsum(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q5_0_matches_stock_kernel_closely() {
        let n = 896;
        let w: Vec<f32> = (0..n)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 13) % 29) as f32 / 14.0 - 1.0)
            .collect();
        let mut bw: Vec<BlockQ5_0> = (0..n / 32).map(|_| BlockQ5_0::zeros()).collect();
        let mut bx: Vec<BlockQ8_0> = (0..n / 32).map(|_| BlockQ8_0::zeros()).collect();
        BlockQ5_0::from_float(&w, &mut bw);
        BlockQ8_0::from_float(&x, &mut bx);
        let stock = BlockQ5_0::vec_dot(n, &bw, &bx);
        let ours = vec_dot_q5_0_q8_0(n, &bw, &bx);
        assert!(
            (stock - ours).abs() <= 1e-3 * stock.abs().max(1.0),
            "{stock} vs {ours}"
        );
    }
}
