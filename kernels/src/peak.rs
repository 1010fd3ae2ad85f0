//! What this host can do at most, measured rather than looked up: the rate
//! of the int8 dot-product instruction the matrix products are built on,
//! and the rate at which the threads stream memory. `statebench bench`
//! states its prefill as a fraction of the first and its batch-1 decode as
//! a fraction of the second, so a host's figures can be read against its
//! own ceilings.

use std::time::Instant;

use rayon::prelude::*;

/// A measured rate, and how it was counted.
#[derive(Debug, Clone)]
pub struct Rate {
    /// Operations (multiply-accumulates, or bytes) a second, all threads.
    pub per_sec: f64,
    /// The instruction or access pattern, the threads and the repetitions.
    pub how: String,
}

/// Multiply-accumulates a second of the int8 dot-product instruction the
/// widest family in force here offers (512-bit `vpdpbusd` where the CPU has
/// AVX-512 VNNI, AMX or not; `vpmaddubsw` + `vpmaddwd` + `vpaddd` on AVX2;
/// `sdot` or `smull` + `sadalp` on NEON), twelve independent accumulators a
/// thread, on every thread of the current rayon pool at once; the best of
/// three runs. `None` for the scalar family, which has no such instruction.
pub fn int8_dot() -> Option<Rate> {
    let (name, macs_per_op) = dot_instruction()?;
    const OPS: usize = 1 << 24;
    let threads = rayon::current_num_threads();
    let best = (0..3)
        .map(|_| {
            let start = Instant::now();
            rayon::broadcast(|_| {
                // SAFETY: `dot_instruction` said the CPU has the instructions.
                unsafe { dot_loop(OPS / 12) }
            });
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    Some(Rate {
        per_sec: (threads * (OPS / 12) * 12 * macs_per_op) as f64 / best,
        how: format!(
            "{name}, {macs_per_op} MACs each, 12 independent chains on each of {threads} threads, best of 3"
        ),
    })
}

/// Bytes a second the threads of the current rayon pool read from a
/// 512 MiB buffer (far past any cache), each its own contiguous part,
/// summing it and prefetching as the kernels do (either way); the best of
/// six passes.
pub fn stream_read() -> Rate {
    const BYTES: usize = 512 << 20;
    // On the pages the weights are held on (`crate::alloc`).
    let words: Vec<u64> =
        crate::alloc::huge_pages(|| (0..BYTES / 8).into_par_iter().map(|i| i as u64).collect());
    let threads = rayon::current_num_threads();
    let part = words.len().div_ceil(threads);
    // Passes alternate the two ways the kernels prefetch: the host's read
    // is the better of them.
    let best = (0..6)
        .map(|pass| {
            #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
            let far = pass % 2 == 1;
            let start = Instant::now();
            let sum: u64 = words
                .par_chunks(part)
                .map(|c| {
                    // A 64-byte line at a time, eight lanes so the sum
                    // vectorises; lines asked for ahead as the kernels ask
                    // for weights, since the hardware prefetcher alone keeps
                    // too few loads in flight.
                    let mut lanes = [0u64; 8];
                    for w in c.chunks_exact(8) {
                        #[cfg(target_arch = "x86_64")]
                        if far {
                            crate::cpu::prefetch_far(w.as_ptr() as *const [u64; 8]);
                        } else {
                            crate::cpu::prefetch_ahead(w.as_ptr() as *const [u64; 8]);
                        }
                        for (l, v) in lanes.iter_mut().zip(w) {
                            *l = l.wrapping_add(*v);
                        }
                    }
                    lanes.iter().fold(0u64, |a, b| a.wrapping_add(*b))
                })
                .reduce(|| 0, u64::wrapping_add);
            std::hint::black_box(sum);
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    Rate {
        per_sec: BYTES as f64 / best,
        how: format!(
            "{threads} threads summing 512 MiB, prefetching ahead as each weight layout's kernels do, best of 6"
        ),
    }
}

/// The instruction [`dot_loop`] times and the multiply-accumulates one
/// performs.
fn dot_instruction() -> Option<(&'static str, usize)> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::cpu::{simd_level, Simd};
        return match simd_level() {
            Simd::Vnni => Some(("512-bit vpdpbusd", 64)),
            Simd::Avx2 => Some(("256-bit vpmaddubsw + vpmaddwd + vpaddd", 32)),
            Simd::None => None,
        };
    }
    #[cfg(target_arch = "aarch64")]
    {
        if crate::cpu::dotprod() {
            return Some(("128-bit sdot", 16));
        }
        if crate::cpu::neon() {
            return Some(("smull + sadalp", 8));
        }
    }
    #[allow(unreachable_code)]
    None
}

/// `n` rounds of twelve independent dot-product steps.
///
/// # Safety
/// The CPU has the instructions [`dot_instruction`] names.
#[cfg(target_arch = "x86_64")]
unsafe fn dot_loop(n: usize) {
    use crate::cpu::{simd_level, Simd};
    match simd_level() {
        Simd::Vnni => vnni_loop(n),
        Simd::Avx2 => avx2_loop(n),
        Simd::None => {}
    }
}

/// `n` rounds of `step` on each of twelve independent accumulators.
#[inline(always)]
fn chains<T: Copy>(n: usize, zero: T, mut step: impl FnMut(&mut T)) {
    let mut acc = [zero; 12];
    for _ in 0..n {
        for c in acc.iter_mut() {
            step(c);
        }
    }
    std::hint::black_box(acc);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_loop(n: usize) {
    use std::arch::x86_64::*;
    let a = std::hint::black_box(_mm512_set1_epi8(3));
    let b = std::hint::black_box(_mm512_set1_epi8(-2));
    chains(n, _mm512_setzero_si512(), |c| {
        *c = _mm512_dpbusd_epi32(*c, a, b);
    });
}

/// [`crate::cpu::wide_dot_gain`]: twelve independent chains of 512-bit
/// `vpdpbusd`, then of 256-bit ones, on this thread, the best of three
/// short runs of each, interleaved.
#[cfg(target_arch = "x86_64")]
pub(crate) fn wide_dot_gain() -> Option<f64> {
    use crate::cpu::{simd_level, Simd};
    if simd_level() != Simd::Vnni {
        return None;
    }
    const ROUNDS: usize = 1 << 16;
    let time = |f: unsafe fn(usize)| {
        let start = Instant::now();
        // SAFETY: the VNNI level implies AVX-512F, BW, VL and VNNI.
        unsafe { f(ROUNDS) };
        start.elapsed().as_secs_f64()
    };
    let (mut wide, mut narrow) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..3 {
        wide = wide.min(time(vnni_loop));
        narrow = narrow.min(time(vnni_loop_256));
    }
    // Twice the MACs an instruction: the gain is the narrow loop's time
    // over half the wide one's.
    Some(2.0 * narrow / wide)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vl")]
unsafe fn vnni_loop_256(n: usize) {
    use std::arch::x86_64::*;
    let a = std::hint::black_box(_mm256_set1_epi8(3));
    let b = std::hint::black_box(_mm256_set1_epi8(-2));
    chains(n, _mm256_setzero_si256(), |c| {
        *c = _mm256_dpbusd_epi32(*c, a, b);
    });
}

/// The kernels' AVX2 step, written out so that the products of loop-invariant
/// operands are not hoisted out of the loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_loop(n: usize) {
    use std::arch::x86_64::*;
    let a = std::hint::black_box(_mm256_set1_epi8(3));
    let b = std::hint::black_box(_mm256_set1_epi8(-2));
    let ones = _mm256_set1_epi16(1);
    chains(n, _mm256_setzero_si256(), |c| {
        std::arch::asm!(
            "vpmaddubsw {t}, {a}, {b}",
            "vpmaddwd {t}, {t}, {ones}",
            "vpaddd {c}, {c}, {t}",
            c = inout(ymm_reg) *c,
            t = out(ymm_reg) _,
            a = in(ymm_reg) a,
            b = in(ymm_reg) b,
            ones = in(ymm_reg) ones,
            options(pure, nomem, nostack, preserves_flags),
        );
    });
}

/// `sdot`, or the plain step written out so that the product of
/// loop-invariant operands is not hoisted out of the loop.
#[cfg(target_arch = "aarch64")]
unsafe fn dot_loop(n: usize) {
    use std::arch::aarch64::*;
    let a = std::hint::black_box(vdupq_n_s8(3));
    let b = std::hint::black_box(vdupq_n_s8(-2));
    if crate::cpu::dotprod() {
        sdot_loop(n, a, b);
    } else {
        chains(n, vdupq_n_s32(0), |c| {
            std::arch::asm!(
                "smull {t:v}.8h, {a:v}.8b, {b:v}.8b",
                "sadalp {c:v}.4s, {t:v}.8h",
                c = inout(vreg) *c,
                t = out(vreg) _,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
        });
    }
}

#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "dotprod")]
unsafe fn sdot_loop(n: usize, a: std::arch::aarch64::int8x16_t, b: std::arch::aarch64::int8x16_t) {
    chains(n, std::arch::aarch64::vdupq_n_s32(0), |c| {
        std::arch::asm!(
            "sdot {c:v}.4s, {a:v}.16b, {b:v}.16b",
            c = inout(vreg) *c,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    });
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn dot_loop(_n: usize) {}
