//! What this CPU runs: the widest SIMD kernel family, whether the AMX tiles
//! run, and how far ahead of use the kernels ask for weights. The kernel
//! modules read it; it reads none of them.

#[cfg(target_arch = "x86_64")]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(target_arch = "x86_64")]
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Simd {
    None,
    Avx2,
    Vnni,
}

/// The widest kernel family this CPU runs (`STATEBENCH_NO_VNNI` forces AVX2).
#[cfg(target_arch = "x86_64")]
pub(crate) fn simd_level() -> Simd {
    static LEVEL: OnceLock<Simd> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let vnni = is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl");
        if std::env::var_os("STATEBENCH_NO_VNNI").is_some() {
            return if avx2 { Simd::Avx2 } else { Simd::None };
        }
        match (avx2, vnni) {
            (true, true) => Simd::Vnni,
            (true, false) => Simd::Avx2,
            _ => Simd::None,
        }
    })
}

#[cfg(target_arch = "x86_64")]
static AMX_ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns the AMX kernels off or back on for this process. Results are the
/// same bits either way; benchmarks and tests use it to run both paths in
/// one process.
#[cfg(target_arch = "x86_64")]
pub fn set_amx_tiles(on: bool) {
    AMX_ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the AMX kernels run here: the CPU and OS have AMX int8 tiles for
/// this process (Linux grants the tile state on request),
/// `STATEBENCH_NO_AMX` and `STATEBENCH_NO_VNNI` are unset, and
/// [`set_amx_tiles`] did not turn them off. Where they do, weights held
/// sixteen rows at a time ([`crate::pair`]) need no copy per product.
pub fn amx_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static YES: OnceLock<bool> = OnceLock::new();
        AMX_ENABLED.load(Ordering::Relaxed)
            && *YES.get_or_init(|| {
                let off = ["STATEBENCH_NO_AMX", "STATEBENCH_NO_VNNI"]
                    .iter()
                    .any(|v| std::env::var_os(v).is_some());
                !off && cpu_has_amx_int8() && request_tile_state()
            })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
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

/// Asks for the lines of the `T` that lies [`PREFETCH`] bytes past `b` (a
/// hint: an address past the data is harmless).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead<T>(b: *const T) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    static D: OnceLock<usize> = OnceLock::new();
    let dist = *D.get_or_init(|| {
        std::env::var("PF")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(PREFETCH)
    });
    let p = (b as *const i8).wrapping_add(dist);
    for line in 0..std::mem::size_of::<T>().div_ceil(64) {
        // SAFETY: a prefetch never faults; SSE is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line)) };
    }
}
