//! Weights sixteen rows at a time: two groups of eight interleaved rows
//! ([`Q8x8`], [`K8`]) side by side, values signed again — the layout the AMX
//! tiles multiply ([`crate::amx`]).
//!
//! `qs[64 g + 32 h + 4 k + e]` is group `h`, row `k`, column `4 g + e`, so 64
//! bytes hold four columns of all sixteen rows: one tile row of the second
//! operand of a tile multiply, and one 512-bit register for a `vpdpbusd`
//! that advances sixteen dot products at once. Matrices held this way are
//! multiplied without a copy per product: the tiles take whole tiles of
//! sixteen activation rows, the kernels here the rest (and every row where
//! the tiles are off: on AVX-512 VNNI without AMX the layout is held for
//! these 512-bit kernels alone where they pay, [`crate::cpu::pairs_pay`]).
//! Per output element the arithmetic is that of the groups' kernels — the
//! same exact integer block dots, the same f32 operations in the same order
//! — so every result is the same bits.

use std::cell::RefCell;
use std::thread::LocalKey;

use crate::kq::K8;
use crate::native::Wide;
use crate::q8::{Q8Row, Q8x8, TileBlock};

/// Two groups' Q8 block: values as in the module docs, `d[8 h + k]` row
/// `k` of group `h`'s scale.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct PairQ8 {
    pub(crate) qs: [i8; 512],
    pub(crate) d: [f32; 16],
}

/// Two groups' K-quant block: values as in the module docs, scales of
/// columns 0..16 and 16..32 and the offset per row `8 h + k`.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct PairK {
    pub(crate) qs: [i8; 512],
    pub(crate) s0: [f32; 16],
    pub(crate) s1: [f32; 16],
    pub(crate) m: [f32; 16],
}

/// The two groups' values side by side, signed again (`q + 128` back to
/// `q`).
fn pair_qs(out: &mut [i8; 512], a: &[u8; 256], b: &[u8; 256]) {
    for (g, row) in out.chunks_exact_mut(64).enumerate() {
        let (lo, hi) = row.split_at_mut(32);
        for (o, &q) in lo.iter_mut().zip(&a[32 * g..32 * g + 32]) {
            *o = (q ^ 0x80) as i8;
        }
        for (o, &q) in hi.iter_mut().zip(&b[32 * g..32 * g + 32]) {
            *o = (q ^ 0x80) as i8;
        }
    }
}

fn pair_f32(out: &mut [f32; 16], a: &[f32; 8], b: &[f32; 8]) {
    out[..8].copy_from_slice(a);
    out[8..].copy_from_slice(b);
}

/// Position of row `j` (`8 h + k`), column `c` of a pair block.
fn pair_slot(j: usize, c: usize) -> usize {
    64 * (c / 4) + 4 * j + c % 4
}

/// The exact integer dot of row `j` of a pair block with activation values,
/// over columns 0..16 and 16..32.
fn pair_dots(qs: &[i8; 512], j: usize, x: &[i8; 32]) -> [i32; 2] {
    let mut s = [0i32; 2];
    for (c, &xv) in x.iter().enumerate() {
        s[c / 16] += qs[pair_slot(j, c)] as i32 * xv as i32;
    }
    s
}

/// Weights held sixteen rows at a time, with the kernels that read them.
pub trait Pair: Copy + Send + Sync + 'static {
    /// The layout of one group of eight rows.
    type Group: Wide;
    /// A pair of zeros (buffer fill).
    const ZERO: Self;
    /// Makes `self` groups `a` and `b` side by side, one element at a time.
    fn set_scalar(&mut self, a: &Self::Group, b: &Self::Group);
    /// The same bytes as [`Pair::set_scalar`], in registers.
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn set_avx512(&mut self, a: &Self::Group, b: &Self::Group);
    /// This thread's buffer for pairs made per product.
    fn buffer() -> &'static LocalKey<RefCell<Vec<Self>>>;
    /// Dequantizes row `j` (`0..16`) of a pair's blocks into `out`, with the
    /// groups' formulas.
    fn row(w: &[Self], j: usize, out: &mut [f32]);
    /// The arithmetic of the SIMD kernel, one element at a time.
    fn scalar(w: &[Self], x: Q8Row<'_>) -> [f32; 16];
    /// AVX-512 VNNI kernel.
    ///
    /// # Safety
    /// The CPU has AVX-512F, BW and VNNI; every row covers `w`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 16]; XR];
    /// [`Pair::vnni`] for the sixteen rows of a whole tile, `t` its blocks.
    ///
    /// # Safety
    /// As [`Pair::vnni`]; `t` covers `w`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni16(w: &[Self], t: &[TileBlock]) -> [[f32; 16]; 16];

    /// [`Pair::group`] for the sixteen rows `xs` of a whole tile, `t` its
    /// blocks (the same rows): the same bits, the rows' data read from the
    /// tile where the CPU has AVX-512 VNNI.
    fn tile(w: &[Self], t: &[TileBlock], xs: &[Q8Row<'_>; 16]) -> [[f32; 16]; 16] {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::simd_level() == crate::cpu::Simd::Vnni {
            assert!(t.len() >= w.len(), "activation tile too short");
            // SAFETY: the VNNI level implies AVX-512F, BW and VNNI; lengths
            // were checked.
            return unsafe { Self::vnni16(w, t) };
        }
        let _ = t;
        Self::group(w, xs)
    }

    /// `out[r][j] = dot(row j of the pair, xs[r])` for `XR` activation rows.
    fn group<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 16]; XR] {
        assert!(
            xs.iter().all(|x| x.covers(w.len())),
            "activation rows too short"
        );
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::simd_level() == crate::cpu::Simd::Vnni {
            // SAFETY: the VNNI level implies AVX-512F, BW and VNNI; lengths
            // were checked.
            return unsafe { Self::vnni(w, xs) };
        }
        std::array::from_fn(|r| Self::scalar(w, xs[r]))
    }
}

/// A layout of eight rows and the layout of its pairs.
pub trait Paired: Wide {
    type Pair: Pair<Group = Self>;
}

impl Paired for Q8x8 {
    type Pair = PairQ8;
}

impl Paired for K8 {
    type Pair = PairK;
}

/// Pairs of `groups` groups (an odd last group is paired with an empty one).
pub fn pairs_of(groups: usize) -> usize {
    groups.div_ceil(2)
}

/// Writes the pairs of `groups` (groups of `bpr` blocks, group after group)
/// to `out`, pair after pair and block by block; `out` holds exactly their
/// blocks. An odd last group is paired with an empty one.
pub fn pair_up<P: Pair>(groups: &[P::Group], bpr: usize, out: &mut [P]) {
    let n = groups.len() / bpr.max(1);
    assert_eq!(out.len(), pairs_of(n) * bpr, "blocks of the pairs");
    #[cfg(target_arch = "x86_64")]
    let fast = crate::ops::avx512() && is_x86_feature_detected!("f16c");
    let empty = <P::Group as Wide>::EMPTY;
    for (q, pq) in out.chunks_exact_mut(bpr.max(1)).enumerate() {
        let a = &groups[2 * q * bpr..(2 * q + 1) * bpr];
        let b = groups.get((2 * q + 1) * bpr..(2 * q + 2) * bpr);
        for (i, (o, a)) in pq.iter_mut().zip(a).enumerate() {
            let b = b.map_or(&empty, |b| &b[i]);
            #[cfg(target_arch = "x86_64")]
            if fast {
                // SAFETY: AVX-512F and F16C were detected.
                unsafe { o.set_avx512(a, b) };
                continue;
            }
            o.set_scalar(a, b);
        }
    }
}

/// The two groups' values side by side, signed again (`q + 128` back to
/// `q`), in registers.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pair_qs_avx512(out: &mut [i8; 512], a: &[u8; 256], b: &[u8; 256]) {
    use std::arch::x86_64::*;
    let flip = _mm512_set1_epi8(0x80u8 as i8);
    for g in 0..8 {
        let lo = _mm256_loadu_si256(a.as_ptr().add(32 * g) as *const __m256i);
        let hi = _mm256_loadu_si256(b.as_ptr().add(32 * g) as *const __m256i);
        let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        _mm512_storeu_si512(
            out.as_mut_ptr().add(64 * g) as *mut _,
            _mm512_xor_si512(both, flip),
        );
    }
}

/// Eight f32 of `a` then eight of `b`, in registers.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pair_f32_avx512(out: &mut [f32; 16], a: &[f32; 8], b: &[f32; 8]) {
    use std::arch::x86_64::*;
    let (lo, hi) = (_mm256_loadu_ps(a.as_ptr()), _mm256_loadu_ps(b.as_ptr()));
    let both = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi);
    _mm512_storeu_ps(out.as_mut_ptr(), both);
}

thread_local! {
    static Q8_PAIRS: RefCell<Vec<PairQ8>> = const { RefCell::new(Vec::new()) };
    static K_PAIRS: RefCell<Vec<PairK>> = const { RefCell::new(Vec::new()) };
}

impl Pair for PairQ8 {
    type Group = Q8x8;
    const ZERO: Self = PairQ8 {
        qs: [0; 512],
        d: [0.0; 16],
    };
    fn set_scalar(&mut self, a: &Q8x8, b: &Q8x8) {
        pair_qs(&mut self.qs, &a.qs, &b.qs);
        for (j, d) in self.d.iter_mut().enumerate() {
            *d = if j < 8 { a.d[j] } else { b.d[j - 8] }.to_f32();
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn set_avx512(&mut self, a: &Q8x8, b: &Q8x8) {
        use std::arch::x86_64::*;
        pair_qs_avx512(&mut self.qs, &a.qs, &b.qs);
        let half = |d: &[half::f16; 8]| _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr() as *const _));
        let both = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(half(&a.d)), half(&b.d));
        _mm512_storeu_ps(self.d.as_mut_ptr(), both);
    }
    fn buffer() -> &'static LocalKey<RefCell<Vec<Self>>> {
        &Q8_PAIRS
    }
    fn row(w: &[Self], j: usize, out: &mut [f32]) {
        for (b, o) in w.iter().zip(out.chunks_exact_mut(32)) {
            for (c, v) in o.iter_mut().enumerate() {
                *v = b.qs[pair_slot(j, c)] as f32 * b.d[j];
            }
        }
    }
    fn scalar(w: &[Self], x: Q8Row<'_>) -> [f32; 16] {
        let mut acc = [0f32; 16];
        for (i, b) in w.iter().enumerate() {
            for (j, a) in acc.iter_mut().enumerate() {
                let [lo, hi] = pair_dots(&b.qs, j, &x.qs[i]);
                let d = b.d[j] * x.scales[i];
                *a = d.mul_add((lo + hi) as f32, *a);
            }
        }
        acc
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 16]; XR] {
        vnni::q8(w, xs)
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni16(w: &[Self], t: &[TileBlock]) -> [[f32; 16]; 16] {
        vnni::q8_16(w, t)
    }
}

impl Pair for PairK {
    type Group = K8;
    const ZERO: Self = PairK {
        qs: [0; 512],
        s0: [0.0; 16],
        s1: [0.0; 16],
        m: [0.0; 16],
    };
    fn set_scalar(&mut self, a: &K8, b: &K8) {
        pair_qs(&mut self.qs, &a.qs, &b.qs);
        pair_f32(&mut self.s0, &a.s0, &b.s0);
        pair_f32(&mut self.s1, &a.s1, &b.s1);
        pair_f32(&mut self.m, &a.m, &b.m);
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn set_avx512(&mut self, a: &K8, b: &K8) {
        pair_qs_avx512(&mut self.qs, &a.qs, &b.qs);
        pair_f32_avx512(&mut self.s0, &a.s0, &b.s0);
        pair_f32_avx512(&mut self.s1, &a.s1, &b.s1);
        pair_f32_avx512(&mut self.m, &a.m, &b.m);
    }
    fn buffer() -> &'static LocalKey<RefCell<Vec<Self>>> {
        &K_PAIRS
    }
    fn row(w: &[Self], j: usize, out: &mut [f32]) {
        for (b, o) in w.iter().zip(out.chunks_exact_mut(32)) {
            for (c, v) in o.iter_mut().enumerate() {
                let s = if c < 16 { b.s0[j] } else { b.s1[j] };
                *v = s * b.qs[pair_slot(j, c)] as f32 - b.m[j];
            }
        }
    }
    fn scalar(w: &[Self], x: Q8Row<'_>) -> [f32; 16] {
        let mut acc = [0f32; 16];
        let mut corr = [0f32; 16];
        for (i, b) in w.iter().enumerate() {
            let dx = x.scales[i];
            let sx = x.sx[i];
            for j in 0..16 {
                let [lo, hi] = pair_dots(&b.qs, j, &x.qs[i]);
                acc[j] = (b.s0[j] * dx).mul_add(lo as f32, acc[j]);
                acc[j] = (b.s1[j] * dx).mul_add(hi as f32, acc[j]);
                corr[j] = (b.m[j] * dx).mul_add(sx, corr[j]);
            }
        }
        std::array::from_fn(|j| acc[j] - corr[j])
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni<const XR: usize>(w: &[Self], xs: &[Q8Row<'_>; XR]) -> [[f32; 16]; XR] {
        vnni::k(w, xs)
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni16(w: &[Self], t: &[TileBlock]) -> [[f32; 16]; 16] {
        vnni::k16(w, t)
    }
}

/// The pair kernels in 512-bit registers: per block the eight registers of
/// four columns × sixteen rows are loaded once for all `XR` activation rows
/// (made unsigned again for `vpdpbusd`, whose sums start from `-128 · Σx` as
/// [`crate::q8`]'s do), then each row takes its groups' f32 operations.
#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{PairK, PairQ8};
    use crate::q8::{lanes, Q8Row, TileBlock};
    use std::arch::x86_64::*;

    /// A block's values, unsigned (`q + 128`), four columns a register.
    #[inline(always)]
    unsafe fn load(qs: &[i8; 512]) -> [__m512i; 8] {
        let flip = _mm512_set1_epi8(0x80u8 as i8);
        std::array::from_fn(|g| {
            _mm512_xor_si512(_mm512_load_si512(qs.as_ptr().add(64 * g) as *const _), flip)
        })
    }

    /// The exact integer dots of sixteen rows with one activation block,
    /// over columns 0..16 and 16..32.
    #[inline(always)]
    unsafe fn dots(q: &[__m512i; 8], x: &[i8; 32], start: [i32; 2]) -> (__m512i, __m512i) {
        let group4 = |g: usize| {
            _mm512_set1_epi32(std::ptr::read_unaligned(x.as_ptr().add(4 * g) as *const i32))
        };
        let mut lo = _mm512_set1_epi32(start[0]);
        let mut hi = _mm512_set1_epi32(start[1]);
        for g in 0..4 {
            lo = _mm512_dpbusd_epi32(lo, q[g], group4(g));
            hi = _mm512_dpbusd_epi32(hi, q[g + 4], group4(g + 4));
        }
        (lo, hi)
    }

    /// The exact integer dots of sixteen rows with one activation block,
    /// over all 32 columns in one chain from `start` (the Q8 kernels add
    /// the halves' sums anyway; integers, so the same sum).
    #[inline(always)]
    unsafe fn dot(q: &[__m512i; 8], x: &[i8; 32], start: i32) -> __m512i {
        let mut s = _mm512_set1_epi32(start);
        for (g, qg) in q.iter().enumerate() {
            let x4 = std::ptr::read_unaligned(x.as_ptr().add(4 * g) as *const i32);
            s = _mm512_dpbusd_epi32(s, *qg, _mm512_set1_epi32(x4));
        }
        s
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn q8<const XR: usize>(w: &[PairQ8], x: &[Q8Row<'_>; XR]) -> [[f32; 16]; XR] {
        let mut acc = [_mm512_setzero_ps(); XR];
        for (i, b) in w.iter().enumerate() {
            crate::cpu::prefetch_far(b);
            let dw = _mm512_load_ps(b.d.as_ptr());
            let q = load(&b.qs);
            for (a, xr) in acc.iter_mut().zip(x) {
                let (lo, hi) = dots(&q, xr.qs.get_unchecked(i), *xr.starts.get_unchecked(i));
                let s = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
                let d = _mm512_mul_ps(dw, _mm512_set1_ps(*xr.scales.get_unchecked(i)));
                *a = _mm512_fmadd_ps(d, s, *a);
            }
        }
        lanes(acc)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn k<const XR: usize>(w: &[PairK], x: &[Q8Row<'_>; XR]) -> [[f32; 16]; XR] {
        let mut acc = [_mm512_setzero_ps(); XR];
        let mut corr = [_mm512_setzero_ps(); XR];
        for (i, b) in w.iter().enumerate() {
            crate::cpu::prefetch_far(b);
            let s0 = _mm512_load_ps(b.s0.as_ptr());
            let s1 = _mm512_load_ps(b.s1.as_ptr());
            let m = _mm512_load_ps(b.m.as_ptr());
            let q = load(&b.qs);
            for r in 0..XR {
                let xr = x.get_unchecked(r);
                let (lo, hi) = dots(&q, xr.qs.get_unchecked(i), *xr.starts.get_unchecked(i));
                let dx = _mm512_set1_ps(*xr.scales.get_unchecked(i));
                let sx = _mm512_set1_ps(*xr.sx.get_unchecked(i));
                let a = _mm512_fmadd_ps(_mm512_mul_ps(s0, dx), _mm512_cvtepi32_ps(lo), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(s1, dx), _mm512_cvtepi32_ps(hi), a);
                corr[r] = _mm512_fmadd_ps(_mm512_mul_ps(m, dx), sx, corr[r]);
            }
        }
        for (a, c) in acc.iter_mut().zip(corr) {
            *a = _mm512_sub_ps(*a, c);
        }
        lanes(acc)
    }

    /// [`q8`] for the sixteen rows of a whole tile: every row's accumulator
    /// in a register of its own and one chain of eight dots a row for the
    /// whole block, as [`crate::q8::vnni::group16`] does for eight weight
    /// rows (1.05× two chains of four, one thread with the weights in L2;
    /// no gain below sixteen rows, where the weights' trip from memory
    /// bounds the kernel).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn q8_16(w: &[PairQ8], t: &[TileBlock]) -> [[f32; 16]; 16] {
        let mut acc = [_mm512_setzero_ps(); 16];
        for (b, x) in w.iter().zip(t) {
            crate::cpu::prefetch_far(b);
            let dw = _mm512_load_ps(b.d.as_ptr());
            let q = load(&b.qs);
            macro_rules! row {
                ($r:literal) => {
                    let s = _mm512_cvtepi32_ps(dot(&q, &x.qs[$r], x.start[$r]));
                    let d = _mm512_mul_ps(dw, _mm512_set1_ps(x.dx[$r]));
                    acc[$r] = _mm512_fmadd_ps(d, s, acc[$r]);
                };
            }
            crate::q8::sixteen!(row);
        }
        lanes(acc)
    }

    /// [`k`] for the sixteen rows of a whole tile: the `acc` chains over the
    /// blocks, then the `corr` chains, as [`crate::kq`]'s `group16_vnni`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn k16(w: &[PairK], t: &[TileBlock]) -> [[f32; 16]; 16] {
        let mut acc = [_mm512_setzero_ps(); 16];
        for (b, x) in w.iter().zip(t) {
            crate::cpu::prefetch_far(b);
            let s0 = _mm512_load_ps(b.s0.as_ptr());
            let s1 = _mm512_load_ps(b.s1.as_ptr());
            let q = load(&b.qs);
            macro_rules! row {
                ($r:literal) => {
                    let (lo, hi) = dots(&q, &x.qs[$r], [x.halves[0][$r], x.halves[1][$r]]);
                    let dx = _mm512_set1_ps(x.dx[$r]);
                    let a = _mm512_fmadd_ps(_mm512_mul_ps(s0, dx), _mm512_cvtepi32_ps(lo), acc[$r]);
                    acc[$r] = _mm512_fmadd_ps(_mm512_mul_ps(s1, dx), _mm512_cvtepi32_ps(hi), a);
                };
            }
            crate::q8::sixteen!(row);
        }
        let mut corr = [_mm512_setzero_ps(); 16];
        for (b, x) in w.iter().zip(t) {
            let m = _mm512_load_ps(b.m.as_ptr());
            macro_rules! row {
                ($r:literal) => {
                    let (dx, sx) = (_mm512_set1_ps(x.dx[$r]), _mm512_set1_ps(x.sx[$r]));
                    corr[$r] = _mm512_fmadd_ps(_mm512_mul_ps(m, dx), sx, corr[$r]);
                };
            }
            crate::q8::sixteen!(row);
        }
        for (a, c) in acc.iter_mut().zip(corr) {
            *a = _mm512_sub_ps(*a, c);
        }
        lanes(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kq::unpack_k_row;
    use crate::native::{pack_q4k, pack_q5_0, Stored};
    use crate::q8::{unpack_q8_row, Activations};
    use candle_core::quantized::k_quants::GgmlType;

    fn blocks<T: GgmlType>(v: &[f32]) -> Vec<T> {
        let mut b: Vec<T> = (0..v.len() / T::BLCK_SIZE).map(|_| T::zeros()).collect();
        T::from_float(v, &mut b);
        b
    }

    /// Every row of every pair (an odd group paired with an empty one)
    /// dequantizes as its group does, and each kernel gives the groups'
    /// bits for one, four and eight activation rows.
    fn agrees<G: Paired>(
        groups: &[G],
        rows: usize,
        cols: usize,
        row: fn(&[G], usize, usize, &mut [f32]),
    ) {
        let bpr = cols / 32;
        let mut pairs = vec![G::Pair::ZERO; pairs_of(rows.div_ceil(8)) * bpr];
        pair_up(groups, bpr, &mut pairs);
        let mut scalar = vec![G::Pair::ZERO; pairs.len()];
        let empty = G::EMPTY;
        for (q, pq) in scalar.chunks_exact_mut(bpr).enumerate() {
            for (i, o) in pq.iter_mut().enumerate() {
                let b = groups.get((2 * q + 1) * bpr + i).unwrap_or(&empty);
                o.set_scalar(&groups[2 * q * bpr + i], b);
            }
        }
        let bytes = |p: &[G::Pair]| {
            // SAFETY: pairs are plain data (bytes, f32) with no padding.
            unsafe { std::slice::from_raw_parts(p.as_ptr() as *const u8, std::mem::size_of_val(p)) }
                .to_vec()
        };
        assert!(
            bytes(&pairs) == bytes(&scalar),
            "pairs made in registers and one element at a time"
        );
        let x: Vec<f32> = (0..8 * cols)
            .map(|i| ((i * 13) % 29) as f32 / 14.0 - 1.0)
            .collect();
        let acts = Activations::quantize(&x, 8, cols);
        let xs: [Q8Row<'_>; 8] = std::array::from_fn(|r| acts.row(r));
        let x16: Vec<f32> = (0..16 * cols)
            .map(|i| ((i * 7) % 31) as f32 / 15.0 - 1.0)
            .collect();
        let acts16 = Activations::quantize(&x16, 16, cols);
        let xs16: [Q8Row<'_>; 16] = std::array::from_fn(|r| acts16.row(r));
        for q in 0..rows.div_ceil(16) {
            let pw = &pairs[q * bpr..(q + 1) * bpr];
            let sixteen = G::Pair::group(pw, &xs16);
            for (r, &xr) in xs16.iter().enumerate() {
                assert_eq!(
                    G::Pair::group(pw, &[xr])[0],
                    sixteen[r],
                    "pair {q}: one row vs sixteen"
                );
            }
            // Where the CPU runs the whole-tile kernels, the rows carry a tile.
            if let Some(t) = acts16.whole_tile(0) {
                assert_eq!(
                    G::Pair::tile(pw, t, &xs16),
                    sixteen,
                    "pair {q}: whole tile vs rows"
                );
            }
            let eight = G::Pair::group(pw, &xs);
            let four = G::Pair::group(pw, &[xs[0], xs[1], xs[2], xs[3]]);
            for (r, &xr) in xs.iter().enumerate() {
                let one = G::Pair::group(pw, &[xr]);
                assert_eq!(one[0], eight[r], "pair {q}: one row vs eight");
                assert_eq!(
                    G::Pair::scalar(pw, xr),
                    one[0],
                    "pair {q}: scalar emulation"
                );
                if r < 4 {
                    assert_eq!(four[r], eight[r], "pair {q}: four rows vs eight");
                }
                for h in 0..2 {
                    let g = 2 * q + h;
                    if 8 * g >= rows {
                        continue;
                    }
                    let want = G::group(&groups[g * bpr..(g + 1) * bpr], &[xr]);
                    assert_eq!(eight[r][8 * h..8 * h + 8], want[0], "group {g}");
                }
            }
            for j in 0..16.min(rows - 16 * q) {
                let (mut got, mut want) = (vec![0f32; cols], vec![0f32; cols]);
                G::Pair::row(pw, j, &mut got);
                row(groups, bpr, 16 * q + j, &mut want);
                assert_eq!(got, want, "row {}", 16 * q + j);
            }
        }
    }

    #[test]
    fn pairs_read_as_their_groups() {
        // 40 rows: two pairs and an odd group.
        let (rows, cols) = (40, 512);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 0.9)
            .collect();
        let widen = |packed: Vec<_>| {
            let mut wide = Vec::new();
            for g in packed.chunks(cols / 256) {
                Stored::with_wide(g, |k: &[K8]| wide.extend_from_slice(k));
            }
            wide
        };
        let k = widen(pack_q4k(&blocks(&w), rows, cols / 256));
        agrees(&k, rows, cols, unpack_k_row);
        let mut q8: Vec<Q8x8> = Vec::new();
        for g in pack_q5_0(&blocks(&w), rows, cols / 32).chunks(cols / 32) {
            Stored::with_wide(g, |q: &[Q8x8]| q8.extend_from_slice(q));
        }
        agrees(&q8, rows, cols, unpack_q8_row);
    }
}
