//! The integer block dots of [`crate::q8`] and [`crate::kq`] on AMX tiles,
//! sixteen activation rows against sixteen weight rows at a time.
//!
//! One `tdpbssd` multiplies a tile of sixteen activation rows' block values
//! (row-major, as [`crate::q8::Activations`] holds them) by a tile of two
//! groups' weights, eight rows of four-byte column groups × sixteen weight
//! rows ([`PairQ8`], [`PairK`]: two groups of the interleaved layout side by
//! side, held that way at load or copied once per product for all its rows).
//! The int32 sums are exactly the integers the VNNI kernels compute, and each
//! row then takes the same f32 operations in the same order, so a result is
//! bit-identical whichever kernel ran it. A row of sums is one 512-bit
//! register, so the per-block f32 work (convert, scale, one FMA) runs sixteen
//! lanes wide with the accumulators in registers.
//!
//! Blocks alternate between two sets of tiles, and their sums are stored
//! `AHEAD` blocks before the f32 work reads them, so tile multiplies and
//! vector work overlap. A block's scales cannot be folded into the tile
//! multiply, which is why one multiply covers one block of 32 columns (half
//! of what a tile could take) and its sums pass through memory.
//!
//! The tile registers are used inside this module only: [`Tiles`] loads a
//! configuration for a run of kernel calls and releases it on drop, and each
//! `asm!` block leaves nothing in the tiles that a later one reads. They run
//! where [`crate::cpu::amx_tiles`] holds.

use std::arch::asm;
use std::arch::x86_64::*;

use crate::pair::{PairK, PairQ8};
use crate::q8::Tile;

/// Activation rows of one tile.
pub const ROWS: usize = 16;

/// A tile configuration (`ldtilecfg`'s 64-byte form): rows and bytes per row
/// of each tile register.
#[repr(C, align(64))]
pub struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const fn config(shapes: [(u8, u16); 8]) -> Config {
    let mut c = Config {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    let mut t = 0;
    while t < 8 {
        c.rows[t] = shapes[t].0;
        c.colsb[t] = shapes[t].1;
        t += 1;
    }
    c
}

/// Q8, for even and odd blocks: `tmm0`/`tmm3` sums (16 activation rows × 16
/// int32), `tmm1`/`tmm4` activations (16 rows × 32 bytes), `tmm2`/`tmm5`
/// weights (8 rows of four-byte groups × 16 weight rows).
const Q8_TILES: Config = config([
    (16, 64),
    (16, 32),
    (8, 64),
    (16, 64),
    (16, 32),
    (8, 64),
    (0, 0),
    (0, 0),
]);

/// K-quants, whose half-blocks have their own scales: `tmm0`/`tmm1` sums of
/// columns 0..16 and 16..32 for even blocks, `tmm2`/`tmm3` for odd ones;
/// `tmm4`/`tmm5` activations of the half-blocks (16 rows × 16 bytes),
/// `tmm6`/`tmm7` their weights (4 rows × 64 bytes).
const K_TILES: Config = config([
    (16, 64),
    (16, 64),
    (16, 64),
    (16, 64),
    (16, 16),
    (16, 16),
    (4, 64),
    (4, 64),
]);

/// A tile configuration, loaded for a run of kernel calls (loading one costs
/// about as much as a kernel's work on a block) and released on drop.
pub struct Tiles(&'static Config);

impl Tiles {
    /// # Safety
    /// [`crate::cpu::amx_tiles`] returned true.
    unsafe fn load(config: &'static Config) -> Self {
        asm!("ldtilecfg [{}]", in(reg) config, options(nostack, readonly));
        Tiles(config)
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: a configuration was loaded by `Tiles::load`.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// Pair layouts ([`crate::pair`]) with an AMX kernel.
pub trait Kernel: Sized {
    /// The kernel's tile configuration.
    const TILES: &'static Config;
    /// Two groups × sixteen rows: `out[r][8 h + k]` is weight row `k` of
    /// group `h` with activation row `r`.
    ///
    /// # Safety
    /// [`crate::cpu::amx_tiles`] returned true and `tiles` holds
    /// [`Kernel::TILES`]; `x` covers `w`.
    unsafe fn run(tiles: &Tiles, w: &[Self], x: &Tile<'_>, out: &mut [[f32; ROWS]; ROWS]);
}

macro_rules! kernel {
    ($pair:ident, $tiles:ident, $run:ident) => {
        impl Kernel for $pair {
            const TILES: &'static Config = &$tiles;
            unsafe fn run(tiles: &Tiles, w: &[$pair], x: &Tile<'_>, out: &mut [[f32; ROWS]; ROWS]) {
                debug_assert!(std::ptr::eq(tiles.0, Self::TILES));
                $run(w, x, out)
            }
        }
    };
}
kernel!(PairQ8, Q8_TILES, q8_groups);
kernel!(PairK, K_TILES, k_groups);

/// The products of the matrix product's whole tiles: `tile(b)` gives
/// activation rows `b..b + 16`; returns the end of the whole tiles.
pub(crate) fn products<'a, P: Kernel>(
    pairs: &[P],
    bpr: usize,
    tile: impl Fn(usize) -> Tile<'a>,
    rows: std::ops::Range<usize>,
    slice: usize,
    mut out: impl FnMut(usize, usize, &[[f32; ROWS]; ROWS]),
) -> usize {
    let end = rows.start + (rows.len() / ROWS) * ROWS;
    // SAFETY: the caller checked `crate::cpu::amx_tiles`.
    let tiles = unsafe { Tiles::load(P::TILES) };
    let mut v = [[0f32; ROWS]; ROWS];
    for s0 in (rows.start..end).step_by(slice) {
        for (q, pw) in pairs.chunks_exact(bpr).enumerate() {
            for b in (s0..(s0 + slice).min(end)).step_by(ROWS) {
                // SAFETY: tiles of this kernel are loaded; the caller
                // checked that the rows cover the weights.
                unsafe { P::run(&tiles, pw, &tile(b), &mut v) };
                out(b, q, &v);
            }
        }
    }
    end
}

/// Sums of one block, a row of sixteen int32 per activation row.
#[repr(C, align(64))]
struct Sums([[i32; 16]; ROWS]);

impl Sums {
    const ZERO: Self = Sums([[0; 16]; ROWS]);

    #[inline(always)]
    unsafe fn row(&self, r: usize) -> __m512i {
        _mm512_load_si512(self.0[r].as_ptr() as *const _)
    }
}

/// `c[r][n] = Σ_j x_r[j] · q_n[j]` over one block's 32 columns, in the tiles
/// named (sums, activations, weights).
///
/// Safety: [`Q8_TILES`] are loaded; `x` points at row 0's block with the next
/// rows `stride` bytes apart (sixteen rows readable).
macro_rules! block_sums {
    ($c:literal, $a:literal, $b:literal) => {
        |x: *const i8, stride: usize, qs: &[i8; 512], c: &mut Sums| {
            asm!(
                concat!("tilezero tmm", $c),
                concat!("tileloadd tmm", $a, ", [{x} + {stride} * 1]"),
                concat!("tileloadd tmm", $b, ", [{w} + {b64} * 1]"),
                concat!("tdpbssd tmm", $c, ", tmm", $a, ", tmm", $b),
                concat!("tilestored [{c} + {b64} * 1], tmm", $c),
                x = in(reg) x,
                stride = in(reg) stride,
                w = in(reg) qs.as_ptr(),
                b64 = in(reg) 64usize,
                c = in(reg) c.0.as_mut_ptr(),
                options(nostack),
            )
        }
    };
}

/// The same over columns 0..16 and 16..32 separately, into the two sum
/// tiles named. Safety: [`K_TILES`] are loaded; otherwise as for
/// [`block_sums`].
macro_rules! half_block_sums {
    ($lo:literal, $hi:literal) => {
        |x: *const i8, stride: usize, qs: &[i8; 512], c: &mut [Sums; 2]| {
            let [lo, hi] = c;
            asm!(
                concat!("tilezero tmm", $lo),
                concat!("tilezero tmm", $hi),
                "tileloadd tmm4, [{x} + {stride} * 1]",
                "tileloadd tmm5, [{x} + {stride} * 1 + 16]",
                "tileloadd tmm6, [{w} + {b64} * 1]",
                "tileloadd tmm7, [{w} + {b64} * 1 + 256]",
                concat!("tdpbssd tmm", $lo, ", tmm4, tmm6"),
                concat!("tdpbssd tmm", $hi, ", tmm5, tmm7"),
                concat!("tilestored [{lo} + {b64} * 1], tmm", $lo),
                concat!("tilestored [{hi} + {b64} * 1], tmm", $hi),
                x = in(reg) x,
                stride = in(reg) stride,
                w = in(reg) qs.as_ptr(),
                b64 = in(reg) 64usize,
                lo = in(reg) lo.0.as_mut_ptr(),
                hi = in(reg) hi.0.as_mut_ptr(),
                options(nostack),
            )
        }
    };
}

/// Runs `$body` for `r` = 0..16, unrolled so the accumulators stay in
/// registers.
macro_rules! each_row {
    ($r:ident => $body:block) => {{
        each_row!(@ $r $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    }};
    (@ $r:ident $body:block; $($n:literal)*) => {
        $({ let $r: usize = $n; $body })*
    };
}

/// Blocks whose tiles are multiplied before the f32 work on a block's sums:
/// those sums are then stored well before they are loaded.
const AHEAD: usize = 3;

/// Runs the tiles of block `i` of weights `w` (`even`/`odd` by parity, into
/// sum buffer `i % (AHEAD + 1)`) [`AHEAD`] blocks before the f32 work
/// `scale(i, sums)`, asking for later blocks' weights as it goes (held at
/// load, they come from memory, not from a copy in cache).
macro_rules! pipelined {
    ($w:expr, $bufs:ident, $even:expr, $odd:expr, $scale:expr) => {{
        let n = $w.len();
        for i in 0..n + AHEAD {
            if i >= AHEAD {
                $scale(i - AHEAD, &$bufs[(i - AHEAD) % (AHEAD + 1)]);
            }
            if i < n {
                crate::cpu::prefetch_ahead($w.as_ptr().wrapping_add(i));
                let c = &mut $bufs[i % (AHEAD + 1)];
                if i % 2 == 0 {
                    $even(i, c)
                } else {
                    $odd(i, c)
                }
            }
        }
    }};
}

/// [`crate::q8`]'s group kernel for two groups × sixteen activation rows: per
/// block the exact integer dot, then `acc = fma(dw · dx, s, acc)`;
/// `out[r][8 h + k]` is weight row `k` of group `h` with activation row `r`.
///
/// # Safety
/// [`crate::cpu::amx_tiles`] returned true; `x` holds sixteen rows covering
/// `w`.
#[target_feature(enable = "avx512f")]
unsafe fn q8_groups(w: &[PairQ8], x: &Tile<'_>, out: &mut [[f32; 16]; ROWS]) {
    let mut acc = [_mm512_setzero_ps(); ROWS];
    let mut bufs = [const { Sums::ZERO }; AHEAD + 1];
    let (even, odd) = (block_sums!("0", "1", "2"), block_sums!("3", "4", "5"));
    let stride = x.stride;
    pipelined!(
        w,
        bufs,
        |i: usize, c: &mut Sums| even(x.qs[i].as_ptr(), stride, &w[i].qs, c),
        |i: usize, c: &mut Sums| odd(x.qs[i].as_ptr(), stride, &w[i].qs, c),
        |i: usize, c: &Sums| {
            let dw = _mm512_loadu_ps(w[i].d.as_ptr());
            let t = x.blocks.get_unchecked(i);
            each_row!(r => {
                let d = _mm512_mul_ps(dw, _mm512_set1_ps(t.dx[r]));
                acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(c.row(r)), acc[r]);
            });
        }
    );
    for (o, a) in out.iter_mut().zip(acc) {
        _mm512_storeu_ps(o.as_mut_ptr(), a);
    }
}

/// [`crate::kq`]'s group kernel for two groups × sixteen activation rows: per
/// block `acc = fma(s0·dx, lo, acc)`, `acc = fma(s1·dx, hi, acc)`,
/// `corr = fma(m·dx, Σx, corr)`; the result is `acc − corr`. The two chains
/// never meet before that subtraction, so `corr` runs in a loop of its own.
///
/// # Safety
/// [`crate::cpu::amx_tiles`] returned true; `x` holds sixteen rows covering
/// `w`.
#[target_feature(enable = "avx512f")]
unsafe fn k_groups(w: &[PairK], x: &Tile<'_>, out: &mut [[f32; 16]; ROWS]) {
    let mut acc = [_mm512_setzero_ps(); ROWS];
    let mut bufs = [const { [Sums::ZERO, Sums::ZERO] }; AHEAD + 1];
    let (even, odd) = (half_block_sums!("0", "1"), half_block_sums!("2", "3"));
    let stride = x.stride;
    pipelined!(
        w,
        bufs,
        |i: usize, c: &mut [Sums; 2]| even(x.qs[i].as_ptr(), stride, &w[i].qs, c),
        |i: usize, c: &mut [Sums; 2]| odd(x.qs[i].as_ptr(), stride, &w[i].qs, c),
        |i: usize, c: &[Sums; 2]| {
            let s0 = _mm512_loadu_ps(w[i].s0.as_ptr());
            let s1 = _mm512_loadu_ps(w[i].s1.as_ptr());
            let t = x.blocks.get_unchecked(i);
            each_row!(r => {
                let dx = _mm512_set1_ps(t.dx[r]);
                let a = _mm512_fmadd_ps(_mm512_mul_ps(s0, dx), _mm512_cvtepi32_ps(c[0].row(r)), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(s1, dx), _mm512_cvtepi32_ps(c[1].row(r)), a);
            });
        }
    );
    let mut corr = [_mm512_setzero_ps(); ROWS];
    for (i, b) in w.iter().enumerate() {
        let m = _mm512_loadu_ps(b.m.as_ptr());
        let t = x.blocks.get_unchecked(i);
        each_row!(r => {
            let dx = _mm512_set1_ps(t.dx[r]);
            let sx = _mm512_set1_ps(t.sx[r]);
            corr[r] = _mm512_fmadd_ps(_mm512_mul_ps(m, dx), sx, corr[r]);
        });
    }
    for ((o, a), c) in out.iter_mut().zip(acc).zip(corr) {
        _mm512_storeu_ps(o.as_mut_ptr(), _mm512_sub_ps(a, c));
    }
}
