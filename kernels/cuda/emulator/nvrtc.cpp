// The emulator's NVRTC: the entry points cudarc loads from libnvrtc, with a
// compile that runs the system C++ compiler on the kernel source against
// cuda_emulator.h and hands back, as its "PTX", the path of the shared
// object it built; the emulator's driver (driver.cpp) loads that.
//
// Before compiling, `__shared__` declarations become references into the
// block's shared arena, and every `extern "C" __global__` kernel gets a
// launch entry point `statebench_emu_launch_<name>` and one that tells its
// parameters' sizes, `statebench_emu_params_<name>`.
//
// Environment: STATEBENCH_EMULATOR_CXX (else CXX, else c++) is the
// compiler; STATEBENCH_EMULATOR_CHECKS the checks modules are built with:
// `races` (the default: races in shared memory, uninitialized reads, out of
// bounds accesses; cuda_emulator.h), `asan` (AddressSanitizer: out of
// bounds only) or `off` (STATEBENCH_EMULATOR_ASAN=0, its older name, is
// `off`); STATEBENCH_EMULATOR_CACHE is where built modules are kept
// (default: $TMPDIR/statebench-cuda-emulator-<uid>);
// STATEBENCH_EMULATOR_FIBERS how a block's threads switch: `native` (the
// default: a hand-written switch on x86-64, ucontext elsewhere) or
// `ucontext` (everywhere: the fallback tested on an x86-64 host).

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "abi.h"

extern char** environ;

namespace {

enum Result {
    NVRTC_SUCCESS = 0,
    NVRTC_ERROR_OUT_OF_MEMORY = 1,
    NVRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
    NVRTC_ERROR_INVALID_INPUT = 3,
    NVRTC_ERROR_INVALID_PROGRAM = 4,
    NVRTC_ERROR_INVALID_OPTION = 5,
    NVRTC_ERROR_COMPILATION = 6,
    NVRTC_ERROR_INTERNAL_ERROR = 11,
};

struct Program {
    std::string source;
    std::string name;
    std::string log;
    std::string image;  // the module's path, as text
    // --gpu-architecture's value: sm_XY asks for a cubin, compute_XY for PTX.
    std::string arch = "compute_52";
};

// The NVRTC this one impersonates: STATEBENCH_EMULATOR_NVRTC_VERSION
// ("12.8"; default 13.0) as a cuDriverGetVersion-style number, or -1 with
// the reason in `version_error()` when the variable is not a version.
std::string& version_error() {
    static std::string e;
    return e;
}
int nvrtc_version_number() {
    static const int v = [] {
        const char* text = std::getenv("STATEBENCH_EMULATOR_NVRTC_VERSION");
        if (!text || !*text) return 13000;
        int major = -1, minor = -1, used = 0;
        if (std::sscanf(text, "%d.%d%n", &major, &minor, &used) != 2 ||
            text[used] != '\0' || major < 1 || major > 99 || minor < 0 || minor > 9) {
            version_error() = std::string("STATEBENCH_EMULATOR_NVRTC_VERSION=") + text +
                              " is not an NVRTC version like 12.8";
            std::fprintf(stderr, "statebench CUDA emulator: %s\n", version_error().c_str());
            return -1;
        }
        return major * 1000 + minor * 10;
    }();
    return v;
}

// The real archs an NVRTC of that version builds for (what
// nvrtcGetSupportedArchs lists: 12.8 added Blackwell, 13.0 dropped
// everything before Turing).
std::vector<int> supported_archs() {
    const int v = nvrtc_version_number();
    if (v >= 13000) return {75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};
    std::vector<int> a = {50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90};
    if (v >= 12080) a.insert(a.end(), {100, 101, 120});
    return a;
}

// The number in `sm_XY` / `compute_XY`, or -1.
int arch_number(const std::string& arch) {
    const size_t us = arch.find('_');
    if (us == std::string::npos) return -1;
    char* end = nullptr;
    const long n = std::strtol(arch.c_str() + us + 1, &end, 10);
    return end && *end == '\0' && n > 0 && n < 1000 ? static_cast<int>(n) : -1;
}

std::string env_or(const char* name, const std::string& fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : fallback;
}

// The directory this library was loaded from: the header sits in include/.
std::string own_dir() {
    Dl_info info;
    if (!dladdr(reinterpret_cast<void*>(&own_dir), &info) || !info.dli_fname) return ".";
    std::string p = info.dli_fname;
    const size_t slash = p.rfind('/');
    return slash == std::string::npos ? "." : p.substr(0, slash);
}

bool read_file(const std::string& path, std::string& out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::ostringstream s;
    s << f.rdbuf();
    out = s.str();
    return true;
}

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
    for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ull;
    }
    return h;
}

// `__shared__ T name[dims];` → `auto& name = ::emu::shared<T[dims]>(id,
// "name");` and `extern __shared__ T name[];` → a pointer to the dynamic
// part (the names are for the checker's reports).
std::string rewrite_shared(const std::string& src) {
    static const std::regex dynamic(
        R"(extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_][\w:]*(?:\s+[A-Za-z_][\w:]*)*?)\s+([A-Za-z_]\w*)\s*\[\s*\]\s*;)");
    // The leading `(void)0;` is a statement: a declaration at namespace scope,
    // which would bind before any block exists, does not compile.
    std::string out = std::regex_replace(
        src, dynamic,
        "(void)0; $1* const $2 = reinterpret_cast<$1*>(::emu::dynamic_shared(\"$2\"));");
    static const std::regex fixed(
        R"((?:static\s+)?__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_][\w:]*(?:\s+[A-Za-z_][\w:]*)*?)\s+([A-Za-z_]\w*)\s*((?:\[[^\]\n]+\])*)\s*;)");
    std::string result;
    int id = 0;
    auto begin = std::sregex_iterator(out.begin(), out.end(), fixed);
    size_t at = 0;
    for (auto it = begin; it != std::sregex_iterator(); ++it) {
        const std::smatch& m = *it;
        result.append(out, at, m.position(0) - at);
        // Not `static`: the reference is the running block's variable.
        result += "(void)0; auto& " + m[2].str() + " = ::emu::shared<" + m[1].str() + m[3].str() +
                  ">(" + std::to_string(id++) + ", \"" + m[2].str() + "\");";
        at = m.position(0) + m.length(0);
    }
    result.append(out, at, std::string::npos);
    return result;
}

std::vector<std::string> kernel_names(const std::string& src) {
    static const std::regex kernel(
        R"re(extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\()re");
    std::vector<std::string> names;
    for (auto it = std::sregex_iterator(src.begin(), src.end(), kernel);
         it != std::sregex_iterator(); ++it) {
        names.push_back((*it)[1].str());
    }
    return names;
}

// Runs argv with stderr and stdout into `log_path`; the exit status.
int run(const std::vector<std::string>& argv, const std::string& log_path) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    const int err = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err != 0) return -err;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return -errno;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

Result compile(Program& p, const std::vector<std::string>& options) {
    std::vector<std::string> defines;
    for (const auto& o : options) {
        if (o.rfind("--gpu-architecture=", 0) == 0 || o.rfind("-arch=", 0) == 0 ||
            o.rfind("--std=", 0) == 0 || o.rfind("-std=", 0) == 0 || o.rfind("--fmad=", 0) == 0 ||
            o == "-lineinfo" || o == "--generate-line-info" || o == "-G" ||
            o == "--device-debug") {
            continue;  // the emulator compiles as GNU C++17 for the host, with line info
        }
        if (o.rfind("-D", 0) == 0 || o.rfind("--define-macro=", 0) == 0) {
            defines.push_back("-D" + o.substr(o[1] == 'D' ? 2 : 15));
            continue;
        }
        p.log = "nvrtc (statebench CUDA emulator): option " + o + " is not supported\n";
        return NVRTC_ERROR_INVALID_OPTION;
    }
    const std::string dir = own_dir();
    const std::string include = dir + "/include";
    std::string header;
    std::string abi;
    if (!read_file(include + "/cuda_emulator.h", header) || !read_file(include + "/abi.h", abi)) {
        p.log = "nvrtc (statebench CUDA emulator): the headers in " + include + " are missing\n";
        return NVRTC_ERROR_INTERNAL_ERROR;
    }
    // The checks the module is built with: STATEBENCH_EMULATOR_CHECKS, else
    // the older STATEBENCH_EMULATOR_ASAN (0: off, else asan).
    std::string checks = env_or("STATEBENCH_EMULATOR_CHECKS", "");
    if (checks.empty()) {
        const std::string asan_var = env_or("STATEBENCH_EMULATOR_ASAN", "");
        checks = asan_var.empty() ? "races" : asan_var == "0" ? "off" : "asan";
    }
    if (checks != "races" && checks != "asan" && checks != "off") {
        p.log = "nvrtc (statebench CUDA emulator): error: STATEBENCH_EMULATOR_CHECKS=" + checks +
                " is not one of races, asan, off\n";
        return NVRTC_ERROR_INVALID_OPTION;
    }
    const bool asan = checks == "asan";
    const bool races = checks == "races";
    // How fibers switch: `native` (x86-64's own switch, ucontext elsewhere)
    // or `ucontext` everywhere, so the other hosts' path runs here too.
    const std::string fibers = env_or("STATEBENCH_EMULATOR_FIBERS", "native");
    if (fibers != "native" && fibers != "ucontext") {
        p.log = "nvrtc (statebench CUDA emulator): error: STATEBENCH_EMULATOR_FIBERS=" + fibers +
                " is not one of native, ucontext\n";
        return NVRTC_ERROR_INVALID_OPTION;
    }
    const std::string cxx = env_or("STATEBENCH_EMULATOR_CXX", env_or("CXX", "c++"));

    std::string tu = "#include \"cuda_emulator.h\"\n#line 1 \"" + p.name + "\"\n" +
                     rewrite_shared(p.source) + "\n";
    for (const auto& k : kernel_names(p.source)) {
        tu += "extern \"C\" __attribute__((visibility(\"default\"))) int " +
              std::string(emu::kLaunchPrefix) + k +
              "(const ::emu::LaunchConfig* c, void** params, char* error, unsigned long error_len) "
              "{ return ::emu::launch(\"" + k + "\", &" + k + ", c, params, error, error_len); }\n";
        tu += "extern \"C\" __attribute__((visibility(\"default\"))) int " +
              std::string(emu::kParamsPrefix) + k +
              "(unsigned long* sizes, int max) { return ::emu::param_sizes(&" + k +
              ", sizes, max); }\n";
    }
    if (asan) {
        // ASan comes into a process that did not start with it: it must not
        // insist on being first, and leaks of the host program are not ours.
        tu += "extern \"C\" __attribute__((visibility(\"default\"))) const char* "
              "__asan_default_options() { return "
              "\"verify_asan_link_order=0:detect_leaks=0:halt_on_error=1:abort_on_error=1\"; }\n";
    }
    std::vector<std::string> argv = {cxx, "-std=gnu++17", "-O2", "-g", "-fPIC",
                                     "-fvisibility=hidden", "-fno-strict-aliasing",
                                     "-ffp-contract=off", "-I" + include};
    if (asan) {
        argv.push_back("-fsanitize=address");
        argv.push_back("-fno-omit-frame-pointer");
    }
    if (races) {
        // ThreadSanitizer's instrumentation without its runtime: compiled
        // on its own (linking would bring libtsan in); the hooks it calls
        // are the emulator's (cuda_emulator.h), and linking with
        // --no-undefined says so if one is missing.
        argv.push_back("-fsanitize=thread");
        argv.push_back("--param=tsan-instrument-func-entry-exit=0");
        argv.push_back("-c");
    } else {
        argv.push_back("-shared");
    }
    for (const auto& d : defines) argv.push_back(d);
    if (fibers == "ucontext") argv.push_back("-DSTATEBENCH_EMU_UCONTEXT");

    std::string key_text = tu + header + abi + __DATE__ __TIME__ + "\nchecks=" + checks;
    for (const auto& a : argv) key_text += "\n" + a;
    char key[32];
    std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(fnv1a(key_text)));
    const std::string cache = env_or(
        "STATEBENCH_EMULATOR_CACHE",
        env_or("TMPDIR", "/tmp") + "/statebench-cuda-emulator-" + std::to_string(getuid()));
    mkdir(cache.c_str(), 0700);
    const std::string so = cache + "/" + p.name + "-" + key + ".so";
    struct stat st;
    if (stat(so.c_str(), &st) == 0) {
        p.image = so;
        return NVRTC_SUCCESS;
    }
    // Built under a name of its own, then renamed: processes and threads
    // compiling the same kernels at once each finish with a whole file.
    static std::atomic<unsigned long> builds{0};
    const std::string tmp =
        so + "." + std::to_string(getpid()) + "-" + std::to_string(builds++) + ".tmp";
    const std::string cpp = tmp + ".cpp";
    const std::string log = tmp + ".log";
    {
        std::ofstream f(cpp, std::ios::binary);
        f << tu;
        if (!f) {
            p.log = "nvrtc (statebench CUDA emulator): cannot write " + cpp + "\n";
            return NVRTC_ERROR_INTERNAL_ERROR;
        }
    }
    argv.push_back(cpp);
    argv.push_back("-o");
    argv.push_back(races ? tmp + ".o" : tmp);
    int status = run(argv, log);
    read_file(log, p.log);
    if (races && status == 0) {
        const std::vector<std::string> link = {
            cxx, "-shared", "-fPIC", "-Wl,--no-undefined", "-Wl,-Bsymbolic", tmp + ".o", "-o", tmp,
            "-ldl"};
        status = run(link, log);
        std::string link_log;
        read_file(log, link_log);
        p.log += link_log;
    }
    unlink((tmp + ".o").c_str());
    unlink(log.c_str());
    unlink(cpp.c_str());
    if (status < 0) {
        p.log = "nvrtc (statebench CUDA emulator): cannot run the C++ compiler `" + cxx +
                "`: " + std::strerror(-status) + " (set STATEBENCH_EMULATOR_CXX)\n";
        return NVRTC_ERROR_COMPILATION;
    }
    if (status != 0) {
        unlink(tmp.c_str());
        if (p.log.find("error") == std::string::npos) {
            p.log += "\nerror: " + cxx + " exited with status " + std::to_string(status) + "\n";
        }
        return NVRTC_ERROR_COMPILATION;
    }
    if (rename(tmp.c_str(), so.c_str()) != 0) {
        unlink(tmp.c_str());
        p.log = "nvrtc (statebench CUDA emulator): cannot write " + so + "\n";
        return NVRTC_ERROR_INTERNAL_ERROR;
    }
    p.image = so;
    return NVRTC_SUCCESS;
}

// What cuModuleLoadData reads: a first line no PTX has, the image's kind
// (PTX of this NVRTC's ISA, or a cubin from this NVRTC), then the path.
std::string image_text(const Program& p, bool cubin) {
    const int arch = arch_number(p.arch);
    const std::string kind =
        cubin ? "cubin sm_" + std::to_string(arch) + " " + std::to_string(nvrtc_version_number())
              : "ptx " + std::to_string(emu::ptx_isa_of(nvrtc_version_number())) + " compute_" +
                    std::to_string(arch);
    return emu::kImageMagic + (emu::kImageKind + kind) + "\n" + p.image + "\n";
}

bool is_cubin_arch(const Program& p) { return p.arch.rfind("sm_", 0) == 0; }

}  // namespace

#define API extern "C" __attribute__((visibility("default")))

// Why the impersonated version is refused, when it is ("" otherwise).
API const char* statebench_emu_nvrtc_error() { return version_error().c_str(); }

API const char* nvrtcGetErrorString(int r) {
    switch (r) {
        case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
        case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
        case NVRTC_ERROR_PROGRAM_CREATION_FAILURE: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
        case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
        case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
        case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
        case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
        default: return "NVRTC_ERROR_INTERNAL_ERROR";
    }
}

API int nvrtcVersion(int* major, int* minor) {
    if (!major || !minor) return NVRTC_ERROR_INVALID_INPUT;
    const int v = nvrtc_version_number();
    if (v < 0) return NVRTC_ERROR_INVALID_INPUT;
    *major = v / 1000;
    *minor = (v % 1000) / 10;
    return NVRTC_SUCCESS;
}

API int nvrtcGetNumSupportedArchs(int* n) {
    if (!n) return NVRTC_ERROR_INVALID_INPUT;
    *n = static_cast<int>(supported_archs().size());
    return NVRTC_SUCCESS;
}

API int nvrtcGetSupportedArchs(int* archs) {
    if (!archs) return NVRTC_ERROR_INVALID_INPUT;
    const std::vector<int> a = supported_archs();
    std::memcpy(archs, a.data(), a.size() * sizeof(int));
    return NVRTC_SUCCESS;
}

API int nvrtcCreateProgram(Program** prog, const char* src, const char* name, int num_headers,
                           const char* const*, const char* const*) {
    if (!prog || !src) return NVRTC_ERROR_INVALID_INPUT;
    if (num_headers != 0) return NVRTC_ERROR_INVALID_INPUT;  // the engine passes none
    auto* p = new (std::nothrow) Program();
    if (!p) return NVRTC_ERROR_OUT_OF_MEMORY;
    p->source = src;
    p->name = name && *name ? name : "default_program";
    for (char& c : p->name) {
        if (c == '/' || c == ' ') c = '_';
    }
    *prog = p;
    return NVRTC_SUCCESS;
}

API int nvrtcDestroyProgram(Program** prog) {
    if (!prog || !*prog) return NVRTC_ERROR_INVALID_PROGRAM;
    delete *prog;
    *prog = nullptr;
    return NVRTC_SUCCESS;
}

API int nvrtcCompileProgram(Program* p, int num_options, const char* const* options) {
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    std::vector<std::string> opts;
    for (int i = 0; i < num_options; ++i) opts.emplace_back(options[i]);
    p->log.clear();
    p->image.clear();
    if (nvrtc_version_number() < 0) {
        p->log = "nvrtc (statebench CUDA emulator): " + version_error() + "\n";
        return NVRTC_ERROR_INVALID_OPTION;
    }
    // As NVRTC does, an arch this version does not know is refused.
    for (const auto& o : opts) {
        for (const char* flag : {"--gpu-architecture=", "-arch="}) {
            if (o.rfind(flag, 0) != 0) continue;
            p->arch = o.substr(std::strlen(flag));
            const int n = arch_number(p->arch);
            const std::vector<int> known = supported_archs();
            const bool virt = p->arch.rfind("compute_", 0) == 0;
            const bool ok = n > 0 && (virt || p->arch.rfind("sm_", 0) == 0) &&
                            (virt ? n >= known.front() && n <= known.back()
                                  : std::find(known.begin(), known.end(), n) != known.end());
            if (!ok) {
                p->log = "nvrtc (statebench CUDA emulator, as NVRTC " +
                         std::to_string(nvrtc_version_number() / 1000) + "." +
                         std::to_string(nvrtc_version_number() % 1000 / 10) +
                         "): invalid value for --gpu-architecture (-arch): " + p->arch + "\n";
                return NVRTC_ERROR_INVALID_OPTION;
            }
        }
    }
    return compile(*p, opts);
}

API int nvrtcGetProgramLogSize(Program* p, size_t* size) {
    if (!p || !size) return NVRTC_ERROR_INVALID_INPUT;
    *size = p->log.size() + 1;
    return NVRTC_SUCCESS;
}

API int nvrtcGetProgramLog(Program* p, char* log) {
    if (!p || !log) return NVRTC_ERROR_INVALID_INPUT;
    std::memcpy(log, p->log.c_str(), p->log.size() + 1);
    return NVRTC_SUCCESS;
}

API int nvrtcGetPTXSize(Program* p, size_t* size) {
    if (!p || !size) return NVRTC_ERROR_INVALID_INPUT;
    if (p->image.empty()) return NVRTC_ERROR_INVALID_PROGRAM;
    *size = image_text(*p, false).size() + 1;
    return NVRTC_SUCCESS;
}

API int nvrtcGetPTX(Program* p, char* ptx) {
    if (!p || !ptx) return NVRTC_ERROR_INVALID_INPUT;
    if (p->image.empty()) return NVRTC_ERROR_INVALID_PROGRAM;
    const std::string text = image_text(*p, false);
    std::memcpy(ptx, text.c_str(), text.size() + 1);
    return NVRTC_SUCCESS;
}

// A cubin only of a program built for a real arch (sm_XY), as NVRTC.
API int nvrtcGetCUBINSize(Program* p, size_t* size) {
    if (!p || !size) return NVRTC_ERROR_INVALID_INPUT;
    if (p->image.empty()) return NVRTC_ERROR_INVALID_PROGRAM;
    if (!is_cubin_arch(*p)) return NVRTC_ERROR_INVALID_INPUT;
    *size = image_text(*p, true).size() + 1;
    return NVRTC_SUCCESS;
}

API int nvrtcGetCUBIN(Program* p, char* cubin) {
    if (!p || !cubin) return NVRTC_ERROR_INVALID_INPUT;
    if (p->image.empty()) return NVRTC_ERROR_INVALID_PROGRAM;
    if (!is_cubin_arch(*p)) return NVRTC_ERROR_INVALID_INPUT;
    const std::string text = image_text(*p, true);
    std::memcpy(cubin, text.c_str(), text.size() + 1);
    return NVRTC_SUCCESS;
}
