//! Q4_0, Q5_0, Q4_K and Q6_K weights kept at their file's bits.
//!
//! Each format is stored eight rows interleaved, in exactly as many bytes as
//! the GGUF file holds, and widened one group of eight rows at a time (into a
//! per-thread scratch that stays in cache) to the layouts the kernels of
//! [`crate::q8`] and [`crate::kq`] read: [`Q8x8`] for Q4_0 and Q5_0, [`K8`]
//! for Q4_K and Q6_K. Widening is exact integer work (the same values, scales
//! and offsets the kernels always read), so the arithmetic — and every
//! result — is that of the widened layouts, while a decode step streams only
//! the file's bytes from memory.
//!
//! Nibbles are stored so that one 32-byte load widens to two kernel
//! registers: byte `32 j + 4 k + e` holds row `k`'s column `4 j + e` in its
//! low nibble and column `16 + 4 j + e` in its high nibble (`j < 4`), which
//! are the kernel's registers `j` and `j + 4`.

use std::cell::RefCell;

use candle_core::quantized::k_quants::{BlockQ4K, BlockQ4_0, BlockQ5_0, BlockQ6K};
use half::f16;

use crate::kq::K8;
use crate::q8::{interleave, slot, Packed, Q8x8};

/// Weight groups the kernels read through their widened form.
pub trait Stored: Sized + Copy + Sync {
    /// The kernels' layout.
    type Wide: Packed + Copy;
    /// Columns of one stored element.
    const COLS: usize;
    /// Calls `f` with one group's stored elements widened.
    fn with_wide<R>(w: &[Self], f: impl FnOnce(&[Self::Wide]) -> R) -> R;
}

/// Weights already in the kernels' layout.
macro_rules! wide {
    ($t:ty, $empty:expr, $scratch:ident) => {
        impl Wide for $t {
            const EMPTY: Self = $empty;
            fn scratch() -> &'static std::thread::LocalKey<RefCell<Vec<Self>>> {
                &$scratch
            }
        }
        impl Stored for $t {
            type Wide = $t;
            const COLS: usize = 32;
            fn with_wide<R>(w: &[Self], f: impl FnOnce(&[Self]) -> R) -> R {
                f(w)
            }
        }
    };
}
wide!(Q8x8, EMPTY_Q8, Q8_SCRATCH);
wide!(K8, EMPTY_K, K_SCRATCH);

/// A stored element at the file's bits and how it widens.
pub trait Widen: Copy {
    /// The kernels' layout.
    type Wide: Wide;
    /// Kernel blocks of 32 columns per element.
    const BLOCKS: usize;
    /// Widens into `out` (`BLOCKS` blocks) one element at a time.
    fn widen_scalar(&self, out: &mut [Self::Wide]);
    /// The same bytes as [`Widen::widen_scalar`], in registers.
    ///
    /// # Safety
    /// The CPU has AVX2; `out` holds `BLOCKS` blocks.
    #[cfg(target_arch = "x86_64")]
    unsafe fn widen_avx2(&self, out: &mut [Self::Wide]);
}

/// A layout the kernels read.
pub trait Wide: Packed + Copy + 'static {
    /// A zero block (scratch fill).
    const EMPTY: Self;
    /// This thread's scratch for widened groups.
    fn scratch() -> &'static std::thread::LocalKey<RefCell<Vec<Self>>>;
}

thread_local! {
    static Q8_SCRATCH: RefCell<Vec<Q8x8>> = const { RefCell::new(Vec::new()) };
    static K_SCRATCH: RefCell<Vec<K8>> = const { RefCell::new(Vec::new()) };
}

/// Widens `w` into `out` (`BLOCKS` wide blocks per element).
fn widen_all<T: Widen>(w: &[T], out: &mut [T::Wide]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::simd_level() != crate::cpu::Simd::None {
        // SAFETY: AVX2 and F16C were detected.
        return unsafe { widen_all_avx2(w, out) };
    }
    for (b, o) in w.iter().zip(out.chunks_exact_mut(T::BLOCKS)) {
        b.widen_scalar(o);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_all_avx2<T: Widen>(w: &[T], out: &mut [T::Wide]) {
    for (b, o) in w.iter().zip(out.chunks_exact_mut(T::BLOCKS)) {
        // At batch 1 these loads are the whole cost of a product: keep more
        // of them in flight than the hardware prefetcher does (the next group
        // follows this one in memory).
        crate::cpu::prefetch_ahead(b);
        b.widen_avx2(o);
    }
}

impl<T: Widen + Sync> Stored for T {
    type Wide = T::Wide;
    const COLS: usize = 32 * T::BLOCKS;
    fn with_wide<R>(w: &[Self], f: impl FnOnce(&[T::Wide]) -> R) -> R {
        T::Wide::scratch().with_borrow_mut(|s| {
            let n = w.len() * T::BLOCKS;
            if s.len() < n {
                s.resize(n, T::Wide::EMPTY);
            }
            widen_all(w, &mut s[..n]);
            f(&s[..n])
        })
    }
}

/// Q4_0: eight rows × 32 columns, 4.5 bits a weight.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Q4x8 {
    /// Scales of the eight rows.
    pub d: [f16; 8],
    /// Unsigned values (`q + 8`), nibbles as in the module docs.
    pub qs: [u8; 128],
}

/// Q5_0: eight rows × 32 columns, 5.5 bits a weight.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Q5x8 {
    /// Scales of the eight rows.
    pub d: [f16; 8],
    /// Bit `g` of byte `4 k + e` is bit 4 of row `k`, column `4 g + e`.
    pub qh: [u8; 32],
    /// Low four bits of the unsigned values (`q + 16`).
    pub qs: [u8; 128],
}

/// Q4_K: eight rows × one super-block of 256 columns, 4.5 bits a weight.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Q4Kx8 {
    /// Super-block scales of the eight rows.
    pub d: [f16; 8],
    /// Super-block minimum scales of the eight rows.
    pub dmin: [f16; 8],
    /// The file's twelve bytes of 6-bit scales and minima, byte `i` of row
    /// `k` at `[i][k]` (so one word holds a byte of all eight rows).
    pub scales: [[u8; 8]; 12],
    /// Sub-block `b` of 32 columns at `128 b`, nibbles as in the module docs.
    pub qs: [u8; 1024],
}

/// Q6_K: eight rows × one super-block of 256 columns, 6.5625 bits a weight.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Q6Kx8 {
    /// Super-block scales of the eight rows.
    pub d: [f16; 8],
    /// Scales of 16 columns, scale `i` of row `k` at `[i][k]`.
    pub scales: [[i8; 8]; 16],
    /// Low four bits of the unsigned values (`q + 32`), sub-block `b` at `128 b`.
    pub ql: [u8; 1024],
    /// High two bits: in sub-block `b`'s 64 bytes, byte `32 h + 4 k + e`
    /// holds register `4 h + i` (`i < 4`) at bits `2 i`, `2 i + 1`.
    pub qh: [u8; 512],
}

const _: () = assert!(std::mem::size_of::<Q4x8>() == 8 * std::mem::size_of::<BlockQ4_0>());
const _: () = assert!(std::mem::size_of::<Q5x8>() == 8 * std::mem::size_of::<BlockQ5_0>());
const _: () = assert!(std::mem::size_of::<Q4Kx8>() == 8 * std::mem::size_of::<BlockQ4K>());
const _: () = assert!(std::mem::size_of::<Q6Kx8>() == 8 * std::mem::size_of::<BlockQ6K>());

/// The file's byte layouts.
#[repr(C)]
struct RawQ4 {
    d: f16,
    qs: [u8; 16],
}

#[repr(C)]
struct RawQ5 {
    d: f16,
    qh: [u8; 4],
    qs: [u8; 16],
}

#[repr(C)]
struct RawQ4K {
    d: f16,
    dmin: f16,
    scales: [u8; 12],
    qs: [u8; 128],
}

#[repr(C)]
struct RawQ6K {
    ql: [u8; 128],
    qh: [u8; 64],
    scales: [i8; 16],
    d: f16,
}

const _: () = assert!(std::mem::size_of::<RawQ4>() == std::mem::size_of::<BlockQ4_0>());
const _: () = assert!(std::mem::size_of::<RawQ5>() == std::mem::size_of::<BlockQ5_0>());
const _: () = assert!(std::mem::size_of::<RawQ4K>() == std::mem::size_of::<BlockQ4K>());
const _: () = assert!(std::mem::size_of::<RawQ6K>() == std::mem::size_of::<BlockQ6K>());

/// Views ggml blocks as their byte layout.
///
/// # Safety
/// `R` has the same size as `B` and is `repr(C)` plain data (checked above).
unsafe fn raw<B, R>(xs: &[B]) -> &[R] {
    std::slice::from_raw_parts(xs.as_ptr() as *const R, xs.len())
}

/// Stores row `k`'s 32 unsigned values' low nibbles.
fn put_nibbles(qs: &mut [u8], k: usize, q: &[u8; 32]) {
    for c in 0..16 {
        qs[32 * (c / 4) + 4 * k + c % 4] = (q[c] & 0x0F) | (q[c + 16] << 4);
    }
}

/// The low nibble of row `k`, column `c`.
fn nibble(qs: &[u8], k: usize, c: usize) -> u8 {
    let b = qs[32 * ((c % 16) / 4) + 4 * k + c % 4];
    if c < 16 {
        b & 0x0F
    } else {
        b >> 4
    }
}

/// Writes row `k`'s kernel bytes (`value + 128`) from unsigned values and
/// their offset (`value = q − bias`).
fn put_wide(qs: &mut [u8; 256], k: usize, q: impl Fn(usize) -> u8, bias: u8) {
    for c in 0..32 {
        qs[slot(k, c)] = q(c).wrapping_add(128 - bias);
    }
}

/// Interleaves a row-major list of blocks eight rows at a time.
fn pack<R, P: Copy>(
    blocks: &[R],
    rows: usize,
    bpr: usize,
    empty: P,
    fill: impl Fn(&mut P, usize, &R),
) -> Vec<P> {
    assert_eq!(blocks.len(), rows * bpr, "blocks for {rows} rows of {bpr}");
    interleave(rows, bpr, empty, |p, k, j| fill(p, k, &blocks[j]))
}

/// Packs Q4_0 rows of `bpr` blocks (missing rows of the last group are zero).
pub fn pack_q4_0(xs: &[BlockQ4_0], rows: usize, bpr: usize) -> Vec<Q4x8> {
    // SAFETY: same-size `repr(C)` layouts.
    let xs: &[RawQ4] = unsafe { raw(xs) };
    let empty = Q4x8 {
        d: [f16::ZERO; 8],
        qs: [0; 128],
    };
    pack(xs, rows, bpr, empty, |p, k, b| {
        p.d[k] = b.d;
        put_nibbles(
            &mut p.qs,
            k,
            &std::array::from_fn(|c| {
                if c < 16 {
                    b.qs[c] & 0xF
                } else {
                    b.qs[c - 16] >> 4
                }
            }),
        );
    })
}

/// Packs Q5_0 rows of `bpr` blocks (missing rows of the last group are zero).
pub fn pack_q5_0(xs: &[BlockQ5_0], rows: usize, bpr: usize) -> Vec<Q5x8> {
    // SAFETY: same-size `repr(C)` layouts.
    let xs: &[RawQ5] = unsafe { raw(xs) };
    let empty = Q5x8 {
        d: [f16::ZERO; 8],
        qh: [0; 32],
        qs: [0; 128],
    };
    pack(xs, rows, bpr, empty, |p, k, b| {
        p.d[k] = b.d;
        let qh = u32::from_le_bytes(b.qh);
        let q: [u8; 32] = std::array::from_fn(|c| {
            let n = if c < 16 {
                b.qs[c] & 0xF
            } else {
                b.qs[c - 16] >> 4
            };
            n | ((((qh >> c) & 1) as u8) << 4)
        });
        put_nibbles(&mut p.qs, k, &q);
        for (c, v) in q.iter().enumerate() {
            p.qh[4 * k + c % 4] |= ((v >> 4) & 1) << (c / 4);
        }
    })
}

/// Packs Q4_K rows of `bpr` super-blocks (missing rows of the last group are zero).
pub fn pack_q4k(xs: &[BlockQ4K], rows: usize, bpr: usize) -> Vec<Q4Kx8> {
    // SAFETY: same-size `repr(C)` layouts.
    let xs: &[RawQ4K] = unsafe { raw(xs) };
    let empty = Q4Kx8 {
        d: [f16::ZERO; 8],
        dmin: [f16::ZERO; 8],
        scales: [[0; 8]; 12],
        qs: [0; 1024],
    };
    pack(xs, rows, bpr, empty, |p, k, b| {
        (p.d[k], p.dmin[k]) = (b.d, b.dmin);
        for (i, &v) in b.scales.iter().enumerate() {
            p.scales[i][k] = v;
        }
        // The file's sub-blocks 2j and 2j+1 are the low and high nibbles of
        // its 32 bytes at 32j.
        for sub in 0..8 {
            let src = &b.qs[32 * (sub / 2)..32 * (sub / 2) + 32];
            let q = std::array::from_fn(|l| (src[l] >> (4 * (sub % 2))) & 0xF);
            put_nibbles(&mut p.qs[128 * sub..128 * sub + 128], k, &q);
        }
    })
}

/// Packs Q6_K rows of `bpr` super-blocks (missing rows of the last group are zero).
pub fn pack_q6k(xs: &[BlockQ6K], rows: usize, bpr: usize) -> Vec<Q6Kx8> {
    // SAFETY: same-size `repr(C)` layouts.
    let xs: &[RawQ6K] = unsafe { raw(xs) };
    let empty = Q6Kx8 {
        d: [f16::ZERO; 8],
        scales: [[0; 8]; 16],
        ql: [0; 1024],
        qh: [0; 512],
    };
    pack(xs, rows, bpr, empty, |p, k, b| {
        p.d[k] = b.d;
        for (i, &v) in b.scales.iter().enumerate() {
            p.scales[i][k] = v;
        }
        for sub in 0..8 {
            // The file's order: halves of 128 columns, each four sub-blocks
            // drawn from the same 64 low and 32 high bytes.
            let (half, part) = (sub / 4, sub % 4);
            let ql = &b.ql[64 * half..64 * half + 64];
            let qh = &b.qh[32 * half..32 * half + 32];
            let q: [u8; 32] = std::array::from_fn(|l| {
                let lo = if part % 2 == 0 { ql[l] } else { ql[l + 32] };
                let lo = if part < 2 { lo & 0xF } else { lo >> 4 };
                lo | (((qh[l] >> (2 * part)) & 3) << 4)
            });
            put_nibbles(&mut p.ql[128 * sub..128 * sub + 128], k, &q);
            let h = &mut p.qh[64 * sub..64 * sub + 64];
            for (c, v) in q.iter().enumerate() {
                let g = c / 4;
                h[32 * (g / 4) + 4 * k + c % 4] |= (v >> 4) << (2 * (g % 4));
            }
        }
    })
}

/// Q4_K's 6-bit scales and minima of sub-block `j` for all eight rows, one
/// row per byte (ggml's `get_scale_min_k4`, eight lanes at once).
fn scale_min_k4(j: usize, q: &[[u8; 8]; 12]) -> (u64, u64) {
    const LOW6: u64 = 0x3F3F_3F3F_3F3F_3F3F;
    const LOW4: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    const TOP2: u64 = 0x0303_0303_0303_0303;
    let w = |i: usize| u64::from_le_bytes(q[i]);
    if j < 4 {
        (w(j) & LOW6, w(j + 4) & LOW6)
    } else {
        (
            (w(j + 4) & LOW4) | (((w(j - 4) >> 6) & TOP2) << 4),
            ((w(j + 4) >> 4) & LOW4) | (((w(j) >> 6) & TOP2) << 4),
        )
    }
}

/// Sub-block scales of a Q4_K group into the wide blocks: the ggml values
/// `d · sc` and `dmin · m` (exact in f32, so any order of evaluation gives
/// the same bits).
fn q4k_scales(b: &Q4Kx8, out: &mut [K8]) {
    let d = b.d.map(f16::to_f32);
    let dmin = b.dmin.map(f16::to_f32);
    for (sub, o) in out.iter_mut().enumerate() {
        let (sc, mn) = scale_min_k4(sub, &b.scales);
        let (sc, mn) = (sc.to_le_bytes(), mn.to_le_bytes());
        for k in 0..8 {
            let s = d[k] * sc[k] as f32;
            (o.s0[k], o.s1[k], o.m[k]) = (s, s, dmin[k] * mn[k] as f32);
        }
    }
}

fn q6k_scales(b: &Q6Kx8, out: &mut [K8]) {
    let d = b.d.map(f16::to_f32);
    for (sub, o) in out.iter_mut().enumerate() {
        let (s0, s1) = (&b.scales[2 * sub], &b.scales[2 * sub + 1]);
        for k in 0..8 {
            (o.s0[k], o.s1[k], o.m[k]) = (d[k] * s0[k] as f32, d[k] * s1[k] as f32, 0.0);
        }
    }
}

const EMPTY_Q8: Q8x8 = Q8x8 {
    d: [f16::ZERO; 8],
    qs: [128; 256],
};

const EMPTY_K: K8 = K8 {
    s0: [0.0; 8],
    s1: [0.0; 8],
    m: [0.0; 8],
    qs: [128; 256],
};

impl Widen for Q4x8 {
    type Wide = Q8x8;
    const BLOCKS: usize = 1;
    fn widen_scalar(&self, out: &mut [Q8x8]) {
        out[0].d = self.d;
        for k in 0..8 {
            put_wide(&mut out[0].qs, k, |c| nibble(&self.qs, k, c), 8);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn widen_avx2(&self, out: &mut [Q8x8]) {
        out[0].d = self.d;
        avx2::widen_q4(&self.qs, &mut out[0].qs, 8);
    }
}

impl Widen for Q5x8 {
    type Wide = Q8x8;
    const BLOCKS: usize = 1;
    fn widen_scalar(&self, out: &mut [Q8x8]) {
        out[0].d = self.d;
        for k in 0..8 {
            let q = |c: usize| {
                nibble(&self.qs, k, c) | (((self.qh[4 * k + c % 4] >> (c / 4)) & 1) << 4)
            };
            put_wide(&mut out[0].qs, k, q, 16);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn widen_avx2(&self, out: &mut [Q8x8]) {
        out[0].d = self.d;
        avx2::widen_q5(&self.qs, &self.qh, &mut out[0].qs);
    }
}

impl Widen for Q4Kx8 {
    type Wide = K8;
    const BLOCKS: usize = 8;
    fn widen_scalar(&self, out: &mut [K8]) {
        q4k_scales(self, out);
        for (sub, o) in out.iter_mut().enumerate() {
            let qs = &self.qs[128 * sub..128 * sub + 128];
            for k in 0..8 {
                put_wide(&mut o.qs, k, |c| nibble(qs, k, c), 0);
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn widen_avx2(&self, out: &mut [K8]) {
        avx2::q4k_scales(self, out);
        for (sub, o) in out.iter_mut().enumerate() {
            avx2::widen_q4(&self.qs[128 * sub..128 * sub + 128], &mut o.qs, 0);
        }
    }
}

impl Widen for Q6Kx8 {
    type Wide = K8;
    const BLOCKS: usize = 8;
    fn widen_scalar(&self, out: &mut [K8]) {
        q6k_scales(self, out);
        for (sub, o) in out.iter_mut().enumerate() {
            let ql = &self.ql[128 * sub..128 * sub + 128];
            let qh = &self.qh[64 * sub..64 * sub + 64];
            for k in 0..8 {
                let q = |c: usize| {
                    let g = c / 4;
                    let h = (qh[32 * (g / 4) + 4 * k + c % 4] >> (2 * (g % 4))) & 3;
                    nibble(ql, k, c) | (h << 4)
                };
                put_wide(&mut o.qs, k, q, 32);
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn widen_avx2(&self, out: &mut [K8]) {
        avx2::q6k_scales(self, out);
        for (sub, o) in out.iter_mut().enumerate() {
            let (ql, qh) = (&self.ql[128 * sub..], &self.qh[64 * sub..]);
            avx2::widen_q6(ql, qh, &mut o.qs);
        }
    }
}

/// The widening in registers: one 32-byte load of nibbles gives kernel
/// registers `j` and `j + 4`; high bits are shifted into bit 4 (and 5).
/// The 16-bit shifts move bits across byte boundaries only into positions
/// the masks clear.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// [`super::q4k_scales`] in registers.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn q4k_scales(b: &super::Q4Kx8, out: &mut [super::K8]) {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(b.d.as_ptr() as *const __m128i));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(b.dmin.as_ptr() as *const __m128i));
        let lanes = |v: u64| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)));
        for (sub, o) in out.iter_mut().enumerate() {
            let (sc, mn) = super::scale_min_k4(sub, &b.scales);
            let s = _mm256_mul_ps(d, lanes(sc));
            _mm256_storeu_ps(o.s0.as_mut_ptr(), s);
            _mm256_storeu_ps(o.s1.as_mut_ptr(), s);
            _mm256_storeu_ps(o.m.as_mut_ptr(), _mm256_mul_ps(dmin, lanes(mn)));
        }
    }

    /// [`super::q6k_scales`] in registers.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn q6k_scales(b: &super::Q6Kx8, out: &mut [super::K8]) {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(b.d.as_ptr() as *const __m128i));
        let lanes = |v: &[i8; 8]| {
            let v = _mm_loadl_epi64(v.as_ptr() as *const __m128i);
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
        };
        for (sub, o) in out.iter_mut().enumerate() {
            _mm256_storeu_ps(
                o.s0.as_mut_ptr(),
                _mm256_mul_ps(d, lanes(&b.scales[2 * sub])),
            );
            _mm256_storeu_ps(
                o.s1.as_mut_ptr(),
                _mm256_mul_ps(d, lanes(&b.scales[2 * sub + 1])),
            );
            _mm256_storeu_ps(o.m.as_mut_ptr(), _mm256_setzero_ps());
        }
    }

    /// Unsigned nibbles (`q & 15` of register `j`, `q >> 4` of `j + 4`) of
    /// one block, their high bits or'ed in by `$high`, stored with `$bias`
    /// taken off and 128 put on. Written out per `j` so every shift count is
    /// an immediate.
    macro_rules! widen {
        ($qs:expr, $out:expr, $bias:expr, |$j:ident, $lo:ident, $hi:ident| $high:block) => {{
            let m4 = _mm256_set1_epi8(0x0F);
            let shift = _mm256_set1_epi8((128u8.wrapping_sub($bias)) as i8);
            let (qs, out): (&[u8], &mut [u8; 256]) = ($qs, $out);
            assert!(qs.len() >= 128);
            widen!(@pair qs, out, m4, shift, 0, |$j, $lo, $hi| $high);
            widen!(@pair qs, out, m4, shift, 1, |$j, $lo, $hi| $high);
            widen!(@pair qs, out, m4, shift, 2, |$j, $lo, $hi| $high);
            widen!(@pair qs, out, m4, shift, 3, |$j, $lo, $hi| $high);
        }};
        (@pair $qs:ident, $out:ident, $m4:ident, $shift:ident, $jv:literal, |$j:ident, $lo:ident, $hi:ident| $high:block) => {{
            const $j: i32 = $jv;
            let nib = _mm256_loadu_si256($qs.as_ptr().add(32 * $jv) as *const __m256i);
            #[allow(unused_mut)]
            let mut $lo = _mm256_and_si256(nib, $m4);
            #[allow(unused_mut)]
            let mut $hi = _mm256_and_si256(_mm256_srli_epi16::<4>(nib), $m4);
            $high
            let o = $out.as_mut_ptr();
            _mm256_storeu_si256(o.add(32 * $jv) as *mut __m256i, _mm256_add_epi8($lo, $shift));
            _mm256_storeu_si256(o.add(32 * ($jv + 4)) as *mut __m256i, _mm256_add_epi8($hi, $shift));
        }};
    }

    /// Q4_0 and Q4_K: nibbles only.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn widen_q4(qs: &[u8], out: &mut [u8; 256], bias: u8) {
        widen!(qs, out, bias, |_J, lo, hi| {});
    }

    /// Q5_0: bit `g` of each byte of `qh` is register `g`'s bit 4. The
    /// 16-bit shifts carry bits across bytes only into positions the mask
    /// clears.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn widen_q5(qs: &[u8], qh: &[u8; 32], out: &mut [u8; 256]) {
        let hb = _mm256_loadu_si256(qh.as_ptr() as *const __m256i);
        let m = _mm256_set1_epi8(0x10);
        widen!(qs, out, 16, |J, lo, hi| {
            // Register J's bit to bit 4 (a left shift by 4 − J), register
            // J + 4's (a right shift by J).
            let (l, h) = match J {
                0 => (_mm256_slli_epi16::<4>(hb), hb),
                1 => (_mm256_slli_epi16::<3>(hb), _mm256_srli_epi16::<1>(hb)),
                2 => (_mm256_slli_epi16::<2>(hb), _mm256_srli_epi16::<2>(hb)),
                _ => (_mm256_slli_epi16::<1>(hb), _mm256_srli_epi16::<3>(hb)),
            };
            lo = _mm256_or_si256(lo, _mm256_and_si256(l, m));
            hi = _mm256_or_si256(hi, _mm256_and_si256(h, m));
        });
    }

    /// Q6_K: bits `2 J`, `2 J + 1` of the 32 bytes at `qh` (register J) and
    /// at `qh + 32` (register J + 4) are bits 4 and 5.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn widen_q6(qs: &[u8], qh: &[u8], out: &mut [u8; 256]) {
        assert!(qh.len() >= 64);
        let h0 = _mm256_loadu_si256(qh.as_ptr() as *const __m256i);
        let h1 = _mm256_loadu_si256(qh.as_ptr().add(32) as *const __m256i);
        let m = _mm256_set1_epi8(0x30);
        widen!(qs, out, 32, |J, lo, hi| {
            let (l, h) = match J {
                0 => (_mm256_slli_epi16::<4>(h0), _mm256_slli_epi16::<4>(h1)),
                1 => (_mm256_slli_epi16::<2>(h0), _mm256_slli_epi16::<2>(h1)),
                2 => (h0, h1),
                _ => (_mm256_srli_epi16::<2>(h0), _mm256_srli_epi16::<2>(h1)),
            };
            lo = _mm256_or_si256(lo, _mm256_and_si256(l, m));
            hi = _mm256_or_si256(hi, _mm256_and_si256(h, m));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::k_quants::GgmlType;

    fn blocks<T: GgmlType>(v: &[f32]) -> Vec<T> {
        let mut b: Vec<T> = (0..v.len() / T::BLCK_SIZE).map(|_| T::zeros()).collect();
        T::from_float(v, &mut b);
        b
    }

    /// Both widenings of every element give the same bytes, and the widened
    /// rows dequantize to ggml's values exactly.
    fn check<T: Widen + Sync, B: GgmlType>(
        name: &str,
        packed: &[T],
        stock: &[B],
        rows: usize,
        cols: usize,
        wide_bytes: impl Fn(&T::Wide) -> Vec<u8>,
        row: impl Fn(&[T::Wide], usize, &mut [f32]),
    ) {
        let per_group = cols / (32 * T::BLOCKS);
        let mut want = vec![0f32; rows * cols];
        B::to_float(stock, &mut want);
        for g in 0..rows.div_ceil(8) {
            let group = &packed[g * per_group..(g + 1) * per_group];
            let mut scalar = vec![T::Wide::EMPTY; cols / 32];
            for (b, o) in group.iter().zip(scalar.chunks_exact_mut(T::BLOCKS)) {
                b.widen_scalar(o);
            }
            let mut simd = vec![T::Wide::EMPTY; cols / 32];
            widen_all(group, &mut simd);
            let bytes = |v: &[T::Wide]| v.iter().flat_map(&wide_bytes).collect::<Vec<_>>();
            assert_eq!(
                bytes(&scalar),
                bytes(&simd),
                "{name} group {g}: scalar vs SIMD widening"
            );
            T::with_wide(group, |w| {
                assert_eq!(bytes(w), bytes(&scalar), "{name}: scratch")
            });
            for k in 0..8.min(rows - 8 * g) {
                let mut got = vec![0f32; cols];
                row(&simd, k, &mut got);
                let r = 8 * g + k;
                assert_eq!(got, want[r * cols..(r + 1) * cols], "{name} row {r}");
            }
        }
    }

    #[test]
    fn native_weights_widen_exactly() {
        let (rows, cols) = (11, 512);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 0.9 + (i % 7) as f32 * 0.01)
            .collect();
        let q8 = |b: &Q8x8| {
            let mut v: Vec<u8> = b.d.iter().flat_map(|d| d.to_le_bytes()).collect();
            v.extend(b.qs);
            v
        };
        let k8 = |b: &K8| {
            let mut v: Vec<u8> = [b.s0, b.s1, b.m]
                .iter()
                .flatten()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            v.extend(b.qs);
            v
        };
        let q8row =
            |w: &[Q8x8], k: usize, out: &mut [f32]| crate::q8::unpack_q8_row(w, w.len(), k, out);
        let krow =
            |w: &[K8], k: usize, out: &mut [f32]| crate::kq::unpack_k_row(w, w.len(), k, out);

        let b4: Vec<BlockQ4_0> = blocks(&w);
        check(
            "q4_0",
            &pack_q4_0(&b4, rows, cols / 32),
            &b4,
            rows,
            cols,
            q8,
            q8row,
        );
        let b5: Vec<BlockQ5_0> = blocks(&w);
        check(
            "q5_0",
            &pack_q5_0(&b5, rows, cols / 32),
            &b5,
            rows,
            cols,
            q8,
            q8row,
        );
        let bk4: Vec<BlockQ4K> = blocks(&w);
        check(
            "q4_k",
            &pack_q4k(&bk4, rows, cols / 256),
            &bk4,
            rows,
            cols,
            k8,
            krow,
        );
        let bk6: Vec<BlockQ6K> = blocks(&w);
        check(
            "q6_k",
            &pack_q6k(&bk6, rows, cols / 256),
            &bk6,
            rows,
            cols,
            k8,
            krow,
        );
    }
}
