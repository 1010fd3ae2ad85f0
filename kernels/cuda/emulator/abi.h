// What the emulator's libraries agree on: the driver (driver.cpp), the
// NVRTC (nvrtc.cpp) and the modules it builds (cuda_emulator.h).

#pragma once

namespace emu {

// A device allocation as a launch sees it: the buffer is [base, base +
// size), the host block around it with its redzones [lo, hi); `init` has a
// bit per byte of the buffer, set once something wrote the byte (a copy or
// memset of the driver, a kernel).
struct DeviceAllocation {
    unsigned long long lo, base, size, hi;
    unsigned long long* init;
};

// A launch: its geometry as cuLaunchKernel receives it, and what the driver
// adds when it runs it.
struct LaunchConfig {
    unsigned int grid[3];
    unsigned int block[3];
    unsigned int shared_bytes;
    // Which runnable thread runs next and the order of the blocks come from
    // it; 0 is thread order and blocks in order.
    unsigned long long seed;
    // The live allocations, sorted by base: the driver's snapshot, valid
    // for the launch.
    const DeviceAllocation* allocations;
    unsigned long n_allocations;
};

// Each kernel's entry point in a module: `<kLaunchPrefix><kernel name>`,
// returning 0, or 1 with the first error in `error`.
typedef int (*Launcher)(const LaunchConfig* c, void** params, char* error,
                        unsigned long error_len);
constexpr char kLaunchPrefix[] = "statebench_emu_launch_";

// Each kernel's parameter sizes: `<kParamsPrefix><kernel name>` writes up
// to `max` of them to `sizes` and returns how many the kernel takes (what
// a graph copies when it captures a launch).
typedef int (*ParamSizes)(unsigned long* sizes, int max);
constexpr char kParamsPrefix[] = "statebench_emu_params_";

// The first line of the module image NVRTC hands out (no PTX starts so);
// the module's path follows it.
constexpr char kImageMagic[] = "// statebench CUDA emulator module\n";

}  // namespace emu

namespace emu {

// The newest PTX ISA (major * 10 + minor) a CUDA release reads and writes,
// by its cuDriverGetVersion number: the PTX ISA release history, as
// src/engine/device/toolkit.rs has it. The emulator's NVRTC stamps its PTX
// with its version's ISA, and its driver refuses newer PTX, as a GPU's do.
inline int ptx_isa_of(int cuda) {
    static const int table[][2] = {
        {13010, 91}, {13000, 90}, {12090, 88}, {12080, 87}, {12070, 86}, {12050, 85},
        {12040, 84}, {12030, 83}, {12020, 82}, {12010, 81}, {12000, 80}, {11080, 78},
        {11000, 70}, {10000, 63},
    };
    for (const auto& row : table) {
        if (cuda >= row[0]) return row[1];
    }
    return 60;
}

// The second line of a module image: what kind it is, as NVRTC made it.
// `// image ptx <isa> compute_<arch>` or `// image cubin sm_<arch> <nvrtc>`,
// with the ISA and the NVRTC version as numbers (90; 13000).
constexpr char kImageKind[] = "// image ";

}  // namespace emu
