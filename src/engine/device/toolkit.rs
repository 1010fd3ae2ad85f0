//! Which kernel image a CUDA driver and an NVRTC can agree on: a cubin for
//! the device's own sm where the NVRTC can build one the driver loads (the
//! driver then runs the bits NVRTC chose, whatever its own version), else
//! PTX of an ISA version the driver accepts (the driver's JIT then chooses
//! the bits), else a one-line refusal naming both versions and what to
//! install. Pure functions of the versions, so every pairing is tested on
//! any machine; `cuda.rs` asks the libraries and follows the plan.
//!
//! The rules, from NVIDIA's compatibility documents:
//! - A driver loads cubins built by NVRTC of its own CUDA major version or
//!   an older one ("minor version compatibility": 12.8 cubins on a 12.4
//!   driver), never those of a newer major.
//! - A driver JITs PTX only up to the ISA version of its own CUDA release
//!   (the PTX ISA release history); newer PTX is refused with
//!   `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`.
//! - A cubin runs on a device of the same compute-capability major and an
//!   equal or higher minor; NVRTC builds one only for the archs it lists.

use std::fmt;

/// The oldest driver the engine supports: CUDA 12.4 (r550), as
/// `cuDriverGetVersion` reports it.
pub const MIN_DRIVER: i32 = 12040;

/// The oldest NVRTC the engine supports (the kernels' inline PTX and C++17
/// are tested against 12.4 and 13.0).
pub const MIN_NVRTC: (i32, i32) = (12, 4);

/// A CUDA version as `cuDriverGetVersion` and `nvrtcVersion` give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    pub major: i32,
    pub minor: i32,
}

impl CudaVersion {
    /// From `cuDriverGetVersion`'s number (12040 is 12.4).
    pub fn from_driver(v: i32) -> Self {
        CudaVersion {
            major: v / 1000,
            minor: (v % 1000) / 10,
        }
    }

    /// `cuDriverGetVersion`'s number for this version.
    pub fn number(self) -> i32 {
        self.major * 1000 + self.minor * 10
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A PTX ISA version (`.version 8.4`), as (major, minor).
pub type PtxIsa = (u32, u32);

/// The newest PTX ISA each CUDA release reads and writes, newest first
/// (NVIDIA's PTX ISA release history: 12.4 ↔ 8.4, 12.5 and 12.6 ↔ 8.5,
/// 12.7 ↔ 8.6, 12.8 ↔ 8.7, 12.9 ↔ 8.8, 13.0 ↔ 9.0, 13.1 ↔ 9.1).
const PTX_OF_CUDA: [(CudaVersion, PtxIsa); 14] = [
    (
        CudaVersion {
            major: 13,
            minor: 1,
        },
        (9, 1),
    ),
    (
        CudaVersion {
            major: 13,
            minor: 0,
        },
        (9, 0),
    ),
    (
        CudaVersion {
            major: 12,
            minor: 9,
        },
        (8, 8),
    ),
    (
        CudaVersion {
            major: 12,
            minor: 8,
        },
        (8, 7),
    ),
    (
        CudaVersion {
            major: 12,
            minor: 7,
        },
        (8, 6),
    ),
    (
        CudaVersion {
            major: 12,
            minor: 5,
        },
        (8, 5),
    ),
    (
        CudaVersion {
            major: 12,
            minor: 4,
        },
        (8, 4),
    ),
    (
        CudaVersion {
            major: 12,
            minor: 3,
        },
        (8, 3),
    ),
    (
        CudaVersion {
            major: 12,
            minor: 2,
        },
        (8, 2),
    ),
    (
        CudaVersion {
            major: 12,
            minor: 1,
        },
        (8, 1),
    ),
    (
        CudaVersion {
            major: 12,
            minor: 0,
        },
        (8, 0),
    ),
    (
        CudaVersion {
            major: 11,
            minor: 8,
        },
        (7, 8),
    ),
    (
        CudaVersion {
            major: 11,
            minor: 0,
        },
        (7, 0),
    ),
    (
        CudaVersion {
            major: 10,
            minor: 0,
        },
        (6, 3),
    ),
];

/// The PTX ISA of CUDA release `v`: the newest a driver of it loads, and
/// what its NVRTC writes. A release newer than the table reads at least
/// what the table's newest does.
pub fn ptx_isa_of(v: CudaVersion) -> PtxIsa {
    PTX_OF_CUDA
        .iter()
        .find(|(first, _)| v >= *first)
        .map_or((6, 0), |(_, isa)| *isa)
}

/// The `.version` directive of a PTX text.
pub fn ptx_version_of(ptx: &str) -> Option<PtxIsa> {
    let line = ptx
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(".version"))?;
    let (major, minor) = line.trim_start_matches(".version").trim().split_once('.')?;
    Some((major.trim().parse().ok()?, minor.trim().parse().ok()?))
}

/// What the engine asks NVRTC for (`STATEBENCH_CUDA_IMAGE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageChoice {
    /// A cubin where the versions allow it, else PTX.
    Auto,
    /// A cubin, or a refusal.
    Cubin,
    /// PTX for the driver to JIT, or a refusal.
    Ptx,
}

impl ImageChoice {
    /// From `STATEBENCH_CUDA_IMAGE` (unset or empty: auto).
    pub fn from_env() -> Result<Self, String> {
        match std::env::var("STATEBENCH_CUDA_IMAGE") {
            Err(std::env::VarError::NotPresent) => Ok(ImageChoice::Auto),
            Ok(v) if v.is_empty() || v == "auto" => Ok(ImageChoice::Auto),
            Ok(v) if v == "cubin" => Ok(ImageChoice::Cubin),
            Ok(v) if v == "ptx" => Ok(ImageChoice::Ptx),
            Ok(v) => Err(format!(
                "STATEBENCH_CUDA_IMAGE={v:?} is not auto, cubin or ptx"
            )),
            Err(e) => Err(format!("STATEBENCH_CUDA_IMAGE: {e}")),
        }
    }
}

/// Whether the engine runs on a driver of CUDA `driver` (12.4 or later).
pub fn supported_driver(driver: CudaVersion) -> Result<(), String> {
    if driver.number() < MIN_DRIVER {
        return Err(format!(
            "driver CUDA {driver} is older than CUDA 12.4; install an NVIDIA driver of CUDA 12.4 or later (r550+)"
        ));
    }
    Ok(())
}

/// The image the kernels are built as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Image {
    /// Machine code for `sm_<sm>`: the bits are NVRTC's, on any driver.
    Cubin { sm: i32 },
    /// PTX for `compute_<arch>`, JIT-compiled by the driver for the device.
    Ptx { arch: i32 },
}

impl Image {
    /// NVRTC's `--gpu-architecture` for this image.
    pub fn nvrtc_arch(self) -> String {
        match self {
            Image::Cubin { sm } => format!("sm_{sm}"),
            Image::Ptx { arch } => format!("compute_{arch}"),
        }
    }
}

impl fmt::Display for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Image::Cubin { sm } => write!(f, "cubin sm_{sm}"),
            Image::Ptx { arch } => write!(f, "PTX compute_{arch}"),
        }
    }
}

/// Chooses the image for a device of compute capability `sm` (e.g. 90),
/// given the driver's version, NVRTC's version and the archs NVRTC can
/// build (`nvrtcGetSupportedArchs`). A refusal is one line naming both
/// versions and what to install.
pub fn plan(
    driver: CudaVersion,
    nvrtc: CudaVersion,
    nvrtc_archs: &[i32],
    sm: i32,
    choice: ImageChoice,
) -> Result<Image, String> {
    let versions = format!("driver CUDA {driver}, NVRTC {nvrtc}");
    supported_driver(driver).map_err(|e| format!("{versions}: {e}"))?;
    if (nvrtc.major, nvrtc.minor) < MIN_NVRTC {
        return Err(format!(
            "{versions}: NVRTC is older than 12.4; install NVRTC 12.4 or later (pip install nvidia-cuda-nvrtc-cu12, or nvidia-cuda-nvrtc for 13.x) and put its lib directory on LD_LIBRARY_PATH"
        ));
    }
    // A cubin for the device's own sm, or for the nearest lower minor of
    // the same major (binary compatible).
    let cubin_sm = nvrtc_archs
        .iter()
        .copied()
        .filter(|&a| a / 10 == sm / 10 && a <= sm)
        .max();
    let cubin_loads = nvrtc.major <= driver.major;
    // PTX for the newest virtual arch NVRTC knows at or below the device's;
    // the driver JITs it for the device.
    let ptx_arch = nvrtc_archs.iter().copied().filter(|&a| a <= sm).max();
    // An NVRTC writes its own release's PTX ISA.
    let (driver_isa, nvrtc_isa) = (ptx_isa_of(driver), ptx_isa_of(nvrtc));
    let ptx_loads = nvrtc_isa <= driver_isa;
    let newer_major = format!(
        "{versions}: NVRTC {nvrtc} builds kernels only a CUDA {} driver loads; install a {}.x NVRTC of 12.4 or later (pip install \"nvidia-cuda-nvrtc-cu12>=12.4\", its lib directory first on LD_LIBRARY_PATH) or a driver of CUDA {}.0 or later{}",
        nvrtc.major,
        driver.major,
        nvrtc.major,
        if nvrtc.major == 13 { " (r580+)" } else { "" }
    );
    let newer_ptx = format!(
        "{versions}: NVRTC {nvrtc} writes PTX ISA {}.{}, which the driver cannot JIT (it reads up to {}.{}); unset STATEBENCH_CUDA_IMAGE for a cubin, or install an NVRTC no newer than {driver} or a newer driver",
        nvrtc_isa.0, nvrtc_isa.1, driver_isa.0, driver_isa.1
    );
    match choice {
        ImageChoice::Auto | ImageChoice::Cubin => {
            if let (Some(s), true) = (cubin_sm, cubin_loads) {
                return Ok(Image::Cubin { sm: s });
            }
            if choice == ImageChoice::Cubin {
                return Err(match cubin_sm {
                    None => format!(
                        "{versions}: this NVRTC cannot build a cubin for sm_{sm} (it knows {}); unset STATEBENCH_CUDA_IMAGE for PTX or install a newer NVRTC",
                        list(nvrtc_archs)
                    ),
                    Some(_) => newer_major,
                });
            }
        }
        ImageChoice::Ptx => {}
    }
    match (ptx_arch, ptx_loads) {
        (Some(a), true) if a >= 80 => Ok(Image::Ptx { arch: a }),
        (Some(_), false) if !cubin_loads => Err(newer_major),
        (Some(_), false) => Err(newer_ptx),
        _ => Err(format!(
            "{versions}: this NVRTC builds for none of the archs sm_80..sm_{sm} the kernels need (it knows {}); install NVRTC 12.4 or later",
            list(nvrtc_archs)
        )),
    }
}

fn list(archs: &[i32]) -> String {
    match (archs.iter().min(), archs.iter().max()) {
        (Some(a), Some(b)) => format!("sm_{a}..sm_{b}"),
        _ => "no arch".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: i32, minor: i32) -> CudaVersion {
        CudaVersion { major, minor }
    }

    /// What NVRTC 12.4, 12.8 and 13.0 list (`nvrtcGetSupportedArchs`).
    const ARCHS_124: &[i32] = &[50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
    const ARCHS_128: &[i32] = &[
        50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 120,
    ];
    const ARCHS_130: &[i32] = &[75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];

    #[test]
    fn the_ptx_table_follows_the_release_history() {
        assert_eq!(ptx_isa_of(v(12, 4)), (8, 4));
        assert_eq!(ptx_isa_of(v(12, 6)), (8, 5));
        assert_eq!(ptx_isa_of(v(12, 8)), (8, 7));
        assert_eq!(ptx_isa_of(v(13, 0)), (9, 0));
        assert_eq!(ptx_isa_of(v(13, 2)), (9, 1));
        assert_eq!(CudaVersion::from_driver(12040), v(12, 4));
        assert_eq!(CudaVersion::from_driver(13000).number(), 13000);
        assert_eq!(
            ptx_version_of("//\n// Generated\n.version 8.7\n.target sm_80\n"),
            Some((8, 7))
        );
        assert_eq!(ptx_version_of(".target sm_80"), None);
    }

    #[test]
    fn a_cubin_wherever_the_driver_loads_nvrtcs_machine_code() {
        let auto = ImageChoice::Auto;
        // The H200 this project targets: a 13.0 driver and NVRTC 13.0.
        assert_eq!(
            plan(v(13, 0), v(13, 0), ARCHS_130, 90, auto),
            Ok(Image::Cubin { sm: 90 })
        );
        // Minor version compatibility: NVRTC 12.8 on a 12.4 driver.
        assert_eq!(
            plan(v(12, 4), v(12, 8), ARCHS_128, 80, auto),
            Ok(Image::Cubin { sm: 80 })
        );
        // An older NVRTC on a newer driver.
        assert_eq!(
            plan(v(13, 0), v(12, 4), ARCHS_124, 89, auto),
            Ok(Image::Cubin { sm: 89 })
        );
        // sm_86 takes sm_86 itself; an sm_87 NVRTC lacks goes to sm_86's
        // binary-compatible neighbour below it.
        assert_eq!(
            plan(v(12, 4), v(12, 4), &[80, 86], 87, auto),
            Ok(Image::Cubin { sm: 86 })
        );
    }

    #[test]
    fn ptx_where_nvrtc_does_not_know_the_device() {
        // NVRTC 12.4 on a Blackwell (sm_120) under a 12.8 driver: PTX for
        // compute_90, which the driver JITs.
        assert_eq!(
            plan(v(12, 8), v(12, 4), ARCHS_124, 120, ImageChoice::Auto),
            Ok(Image::Ptx { arch: 90 })
        );
        // Asked for PTX: of the newest arch at or below the device's.
        assert_eq!(
            plan(v(13, 0), v(13, 0), ARCHS_130, 90, ImageChoice::Ptx),
            Ok(Image::Ptx { arch: 90 })
        );
    }

    #[test]
    fn refusals_name_both_versions_and_what_to_install() {
        let auto = ImageChoice::Auto;
        // NVRTC 13 on a 12.x driver: neither its cubins nor its PTX load.
        let e = plan(v(12, 4), v(13, 0), ARCHS_130, 90, auto).unwrap_err();
        assert!(e.contains("driver CUDA 12.4, NVRTC 13.0"), "{e}");
        assert!(e.contains("nvidia-cuda-nvrtc-cu12>=12.4"), "{e}");
        assert!(e.contains("r580"), "{e}");
        // A driver older than 12.4.
        let e = plan(v(11, 8), v(12, 4), ARCHS_124, 80, auto).unwrap_err();
        assert!(
            e.contains("older than CUDA 12.4") && e.contains("r550"),
            "{e}"
        );
        // PTX newer than the driver (12.8's on a 12.4 driver).
        let e = plan(v(12, 4), v(12, 8), ARCHS_128, 80, ImageChoice::Ptx).unwrap_err();
        assert!(
            e.contains("PTX ISA 8.7, which the driver cannot JIT (it reads up to 8.4)"),
            "{e}"
        );
        // An old NVRTC.
        let e = plan(v(13, 0), v(12, 2), ARCHS_124, 90, auto).unwrap_err();
        assert!(e.contains("NVRTC is older than 12.4"), "{e}");
        // A cubin asked for where NVRTC cannot build one.
        let e = plan(v(12, 8), v(12, 4), ARCHS_124, 120, ImageChoice::Cubin).unwrap_err();
        assert!(e.contains("cannot build a cubin for sm_120"), "{e}");
        // Every refusal is one line.
        for e in [
            plan(v(12, 4), v(13, 0), ARCHS_130, 90, auto),
            plan(v(11, 8), v(12, 4), ARCHS_124, 80, auto),
        ] {
            assert!(!e.unwrap_err().contains('\n'));
        }
    }
}
