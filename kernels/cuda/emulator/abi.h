// What the emulator's libraries agree on: the driver (driver.cpp), the
// NVRTC (nvrtc.cpp) and the modules it builds (cuda_emulator.h).

#pragma once

namespace emu {

// A launch's geometry, as cuLaunchKernel receives it.
struct LaunchConfig {
    unsigned int grid[3];
    unsigned int block[3];
    unsigned int shared_bytes;
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
