//! What this CPU runs: the kernel family (the widest the CPU has, or the
//! one `STATEBENCH_CPU_ISA` caps it at), whether the AMX tiles run, and how
//! far ahead of use the kernels ask for weights. The kernel modules read it;
//! it reads none of them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// A family of CPU kernels. Every family computes the same integers and
/// the same f32 operations in the same order, so a cap changes speed, never
/// bits. On x86-64 each family includes those below it (`amx` ⊃ `avx512` ⊃
/// `avx2` ⊃ `scalar`); on aarch64 `neon` ⊃ `scalar`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, every host.
    Scalar,
    /// AVX2, FMA and F16C: the matrix products (integer dots in 256-bit
    /// lanes) and weight widening.
    Avx2,
    /// AVX-512: the matrix products by VNNI (with BW and VL), the
    /// elementwise kernels, attention and weight pairing (AVX-512F).
    Avx512,
    /// AMX int8 tiles for products of sixteen rows or more, AVX-512 for the
    /// rest.
    Amx,
    /// aarch64 NEON: the matrix products (`sdot` where the CPU has the
    /// dot-product extension, widening multiplies otherwise), the
    /// elementwise kernels and attention.
    Neon,
}

/// The variable that caps the kernel family.
pub const ISA_VAR: &str = "STATEBENCH_CPU_ISA";

impl Isa {
    pub const ALL: [Isa; 5] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
        }
    }

    /// The families this host runs, narrowest first: `scalar` and each
    /// wider one whose instructions the CPU (and, for AMX, the OS) grants.
    pub fn available() -> Vec<Isa> {
        let widest = widest();
        Isa::ALL
            .into_iter()
            .filter(|i| same_arch(*i, widest) && *i <= widest)
            .collect()
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Both x86 families, or both `neon`: `scalar` belongs to every host.
fn same_arch(a: Isa, b: Isa) -> bool {
    a == Isa::Scalar || b == Isa::Scalar || ((a == Isa::Neon) == (b == Isa::Neon))
}

/// The widest family this CPU runs.
fn widest() -> Isa {
    static W: OnceLock<Isa> = OnceLock::new();
    *W.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if cpu_has_amx_int8() && request_tile_state() {
                return Isa::Amx;
            }
            if is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if avx2_fma_f16c() {
                return Isa::Avx2;
            }
        }
        // NEON is part of every aarch64 target Rust builds for.
        #[cfg(target_arch = "aarch64")]
        return Isa::Neon;
        #[allow(unreachable_code)]
        Isa::Scalar
    })
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_fma_f16c() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Why the kernel-family cap cannot be taken: one line naming the variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsaError(String);

impl std::fmt::Display for IsaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IsaError {}

/// The family the kernels run: `STATEBENCH_CPU_ISA` where set (an unknown
/// value, or one this host cannot run, is an error), else the widest the
/// host has, narrowed by the older switches `STATEBENCH_NO_AMX` (to
/// `avx512`) and `STATEBENCH_NO_VNNI` (to `avx2`). Read once per process.
pub fn isa() -> Result<Isa, IsaError> {
    static CAP: OnceLock<Result<Isa, IsaError>> = OnceLock::new();
    CAP.get_or_init(|| {
        let var = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
        let mut cap = match std::env::var(ISA_VAR) {
            Ok(v) if !v.is_empty() => parse_cap(&v, &Isa::available())?,
            Err(std::env::VarError::NotUnicode(v)) => {
                return Err(IsaError(format!("{ISA_VAR}={v:?}: not a kernel family")))
            }
            _ => widest(),
        };
        if var("STATEBENCH_NO_AMX") && cap == Isa::Amx {
            cap = Isa::Avx512;
        }
        if var("STATEBENCH_NO_VNNI") && matches!(cap, Isa::Amx | Isa::Avx512) {
            cap = Isa::Avx2;
        }
        Ok(cap)
    })
    .clone()
}

/// A cap's value against the families `available` here.
fn parse_cap(value: &str, available: &[Isa]) -> Result<Isa, IsaError> {
    let names = || Isa::ALL.map(Isa::name).join("|");
    let isa = Isa::ALL
        .into_iter()
        .find(|i| i.name() == value.trim().to_ascii_lowercase())
        .ok_or_else(|| {
            IsaError(format!(
                "{ISA_VAR}={value}: not a kernel family (one of {})",
                names()
            ))
        })?;
    if !available.contains(&isa) {
        let have: Vec<_> = available.iter().map(|i| i.name()).collect();
        return Err(IsaError(format!(
            "{ISA_VAR}={value}: the {isa} kernels do not run on this host (it runs {})",
            have.join(", ")
        )));
    }
    Ok(isa)
}

/// The family in force; a cap that [`isa`] refuses stops the process here,
/// so the engine asks [`isa`] at load and reports the refusal first.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn cap() -> Isa {
    match isa() {
        Ok(i) => i,
        Err(e) => panic!("{e}"),
    }
}

#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Simd {
    None,
    Avx2,
    Vnni,
}

/// The matrix products' instructions under the cap: VNNI where the family
/// is `avx512` or wider and the CPU has VNNI, BW and VL; AVX2 where it is
/// `avx2` or wider; else none.
#[cfg(target_arch = "x86_64")]
pub(crate) fn simd_level() -> Simd {
    static LEVEL: OnceLock<Simd> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let cap = cap();
        let avx2 = cap >= Isa::Avx2 && avx2_fma_f16c();
        let vnni = cap >= Isa::Avx512
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl");
        match (avx2, vnni) {
            (true, true) => Simd::Vnni,
            (true, false) => Simd::Avx2,
            _ => Simd::None,
        }
    })
}

/// Whether the elementwise, attention and pairing kernels take their
/// AVX-512F paths: the family is `avx512` or wider.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| cap() >= Isa::Avx512 && is_x86_feature_detected!("avx512f"))
}

/// Whether the NEON kernels run: the family is `neon`.
#[cfg(target_arch = "aarch64")]
pub(crate) fn neon() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| cap() == Isa::Neon)
}

/// Whether the NEON matrix products take `sdot`: the family is `neon` and
/// the CPU has the dot-product extension (Armv8.2 and later; not the
/// Cortex-A72 of a Raspberry Pi 4, say).
#[cfg(target_arch = "aarch64")]
pub(crate) fn dotprod() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| neon() && std::arch::is_aarch64_feature_detected!("dotprod"))
}

/// Whether the sixteen-lane kernels ([`crate::lanes`]) run: AVX-512F on
/// x86-64, NEON on aarch64.
pub(crate) fn wide_lanes() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512();
    #[cfg(target_arch = "aarch64")]
    return neon();
    #[allow(unreachable_code)]
    false
}

#[cfg(target_arch = "x86_64")]
static AMX_ENABLED: AtomicBool = AtomicBool::new(true);

static SHORT_PATH: AtomicBool = AtomicBool::new(true);

/// Turns the AVX2 kernels' short path for weights within ±16 (Q4_0, Q5_0)
/// off or back on for this process. The same bits either way;
/// benchmarks use it to run both paths in one process.
pub fn set_short_path(on: bool) {
    SHORT_PATH.store(on, Ordering::Relaxed);
}

/// Whether [`set_short_path`] left the short path on.
pub(crate) fn short_path() -> bool {
    SHORT_PATH.load(Ordering::Relaxed)
}

/// Turns the AMX kernels off or back on for this process. Results are the
/// same bits either way; benchmarks and tests use it to run both paths in
/// one process.
#[cfg(target_arch = "x86_64")]
pub fn set_amx_tiles(on: bool) {
    AMX_ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the AMX kernels run here: the family is `amx` (the CPU and OS
/// have AMX int8 tiles for this process: Linux grants the tile state on
/// request, and no cap narrows it) and [`set_amx_tiles`] did not turn them
/// off. Where they do, weights held sixteen rows at a time ([`crate::pair`])
/// need no copy per product.
pub fn amx_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        AMX_ENABLED.load(Ordering::Relaxed) && cap() == Isa::Amx
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether widened weights are best held sixteen rows at a time
/// ([`crate::pair`]): where the AMX tiles run (they read that layout as it
/// lies), and under AVX-512 VNNI where a 512-bit `vpdpbusd` does the work
/// of two 256-bit ones ([`wide_dot_gain`] at least 1.5), which the pair
/// kernels' 512-bit registers then take. Not on AMD Zen 4, say, which
/// splits 512-bit operations in two: the groups' kernels stay. The same
/// bits either way.
pub fn pairs_pay() -> bool {
    amx_tiles() || wide_dot_gain().is_some_and(|g| g >= 1.5)
}

/// The multiply-accumulates of a 512-bit `vpdpbusd` over those of a
/// 256-bit one in the same time on this core, measured once per process (a
/// few milliseconds): about 2 on Intel's server cores (two 512-bit pipes),
/// about 1 on AMD Zen 4. `None` without AVX-512 VNNI under the cap.
pub fn wide_dot_gain() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        static GAIN: OnceLock<Option<f64>> = OnceLock::new();
        *GAIN.get_or_init(crate::peak::wide_dot_gain)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

#[cfg(target_arch = "x86_64")]
fn cpu_has_amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid_count, _xgetbv};
    if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("xsave")) {
        return false;
    }
    let leaf7 = __cpuid_count(7, 0);
    let (tile, int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
    // XCR0 bits 17 and 18: the OS saves tile configuration and data.
    // SAFETY: XSAVE was detected, so XGETBV is available.
    let xcr0 = unsafe { _xgetbv(0) };
    tile && int8 && xcr0 >> 17 & 3 == 3
}

/// Asks Linux for permission to use the tile data (`ARCH_REQ_XCOMP_PERM` for
/// `XFEATURE_XTILEDATA`), which it grants per process.
#[cfg(target_arch = "x86_64")]
fn request_tile_state() -> bool {
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain system call with integer arguments.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// Bytes ahead of use to prefetch: the hardware prefetcher alone keeps too
/// few weight loads in flight at batch 1.
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 2048;

/// Asks, with `HINT`, for the lines of the `T` that lies `ahead` bytes past
/// `b` (a hint: an address past the data is harmless).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines<T, const HINT: i32>(b: *const T, ahead: usize) {
    let p = (b as *const u8).wrapping_add(ahead);
    for line in 0..std::mem::size_of::<T>().div_ceil(64) {
        // SAFETY: a prefetch never faults and changes no state a program
        // sees; SSE is part of x86-64.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(p.wrapping_add(64 * line) as *const i8) };
    }
}

/// Asks for the lines of the `T` that lies [`PREFETCH`] bytes past `b`,
/// into L1.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead<T>(b: *const T) {
    prefetch_lines::<T, { std::arch::x86_64::_MM_HINT_T0 }>(b, PREFETCH)
}

/// The pair kernels' distance ([`crate::pair`], blocks of 576 bytes).
#[cfg(target_arch = "x86_64")]
const PREFETCH_PAIRS: usize = 4096;

/// [`prefetch_ahead`] for the pair kernels: twice as far, and into the
/// outer caches only (`prefetcht2`), so that a line in flight holds no L1
/// fill buffer, of which the core has few, for all of its trip from
/// memory. On an Intel Xeon without AMX (2 threads, 4 interleaved rounds
/// each, weights on huge pages) decode batch 4 measured 134.8–140.4 tok/s
/// against 121.3–131.3 with `prefetch_ahead`, batch 1 40.6–43.7 against
/// 34.7–43.2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_far<T>(b: *const T) {
    prefetch_lines::<T, { std::arch::x86_64::_MM_HINT_T2 }>(b, PREFETCH_PAIRS)
}

/// Asks for the cache line holding `p` (a hint: any address is harmless,
/// nothing is read).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
pub(crate) fn prefetch_line<T>(p: *const T) {
    // SAFETY: a prefetch never faults and changes no state a program sees;
    // SSE is part of x86-64, PRFM of every aarch64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    };
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{p}]", p = in(reg) p, options(nostack, readonly, preserves_flags))
    };
}

/// Keeps the memory a forward pass frees for the next one. A prefill pass
/// allocates activations of megabytes per product (512 rows × 4,864 f32 is
/// 10 MB); glibc serves blocks that large with fresh pages from the kernel
/// and unmaps them on free, so every pass faulted its pages in again. Blocks
/// up to 32 MiB (the largest heap threshold glibc takes) now come from the
/// heap, which is no longer trimmed: the process keeps its peak footprint,
/// and a pass reuses the pages the last one touched. Process-wide, set once;
/// results do not depend on it.
pub fn hold_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: mallopt only changes the allocator's thresholds; glibc
            // takes its own lock. A refused value leaves the default.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
            }
        });
    }
}
