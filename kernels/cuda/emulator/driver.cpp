// The emulator's CUDA driver: the entry points cudarc loads from libcuda,
// over one emulated device whose memory is host memory and whose modules
// are the shared objects the emulator's NVRTC builds (nvrtc.cpp).
//
// Every operation runs to completion when it is called, so streams and
// events are in order by construction. Stream capture records kernel
// launches (their parameters copied) into a graph, and launching the graph
// runs them in order; other work on a capturing stream (a copy, a memset,
// an allocation, a synchronization) is refused and invalidates the
// capture, and so is the capturing thread's work off any stream: stricter
// than a GPU where a GPU would allow some of it. Other threads go on. "Device" allocations are 256-byte
// aligned host blocks with poisoned redzones on both sides (checked by
// AddressSanitizer in the kernels) and are filled with 0xff bytes, NaN as
// f32, so a read of memory nothing wrote shows in the results. A kernel
// that fails (a deadlock, a bad warp collective) makes the context fail
// like a GPU's after a fault: that call and every later one return
// CUDA_ERROR_LAUNCH_FAILED, and the first failure is printed to stderr and
// kept for statebench_emu_last_error().
//
// Environment, each read once and refused by name when it is not what it
// says (cuInit and cuDriverGetVersion then fail, the reason in
// statebench_emu_last_error()):
// - STATEBENCH_EMULATOR_MEMORY_GIB: the device memory it reports, in GiB
//   (default 8: the default model's bf16 weights, its KV cache and the
//   engine's activation reserve fit);
// - STATEBENCH_EMULATOR_DRIVER_VERSION: the driver it impersonates, as
//   cuDriverGetVersion's number (default 13000, CUDA 13.0). Module loading
//   then refuses what that driver could not load: PTX of a newer ISA
//   (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), a cubin from an NVRTC of a newer
//   major version (CUDA_ERROR_INVALID_IMAGE) or for another device
//   (CUDA_ERROR_NO_BINARY_FOR_GPU); and the entry points that driver lacks
//   fail with CUDA_ERROR_NOT_FOUND.

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "abi.h"

namespace {

enum Result {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_ILLEGAL_STATE = 401,
};

typedef unsigned long long DevPtr;

using emu::LaunchConfig;
using emu::Launcher;
using emu::ParamSizes;

struct Module {
    void* handle;
};
struct Function {
    Launcher launch;
    ParamSizes sizes;
    std::string name;
    // Dynamic shared memory a launch may ask for (CUDA's default, raised
    // by cuFuncSetAttribute).
    unsigned int max_dynamic_shared = 48 * 1024;
};
struct Context {
    int refs;
};

// A kernel launch as a graph holds it: its parameters copied, each at its
// offset in `blob`.
struct Node {
    Function* f;
    LaunchConfig c;
    std::vector<unsigned char> blob;
    std::vector<size_t> offsets;
};
struct Graph {
    std::vector<Node> nodes;
};
struct GraphExec {
    std::vector<Node> nodes;
};
struct Stream {
    Graph* capturing = nullptr;  // the graph being captured, if any
    bool invalidated = false;
};
struct Event {
    std::chrono::steady_clock::time_point at;
    bool recorded;
};

constexpr size_t kAlign = 256;     // cudaMalloc's alignment
constexpr size_t kRedzone = 256;   // poisoned bytes before and after each block
constexpr int kComputeMajor = 8;   // an sm_80 model: bf16 mma.sync, ldmatrix, cp.async
constexpr int kComputeMinor = 0;
const char kName[] = "statebench CUDA emulator (sm_80 model, host memory)";

// An allocation's bytes that something wrote (a copy, a memset, a
// kernel), a bit each: what the kernels' uninitialized-read check reads.
struct Written {
    std::vector<unsigned long long> bits;
};

// The allocations as a launch sees them (emu::LaunchConfig), kept alive
// by the launches that use it.
struct Snapshot {
    std::vector<emu::DeviceAllocation> rows;
    std::vector<std::shared_ptr<Written>> keep;
};

struct State {
    std::mutex lock;
    bool initialized = false;
    // Base of each live allocation → its size.
    std::map<uintptr_t, size_t> allocations;
    // Base of each live allocation → its written bytes.
    std::map<uintptr_t, std::shared_ptr<Written>> written;
    // Of the allocations now; null after a change, until the next launch.
    std::shared_ptr<const Snapshot> snapshot;
    size_t allocated = 0;
    Context primary{0};
    int sticky = CUDA_SUCCESS;
    std::string last_error;
    void (*poison)(void const volatile*, size_t) = nullptr;
    void (*unpoison)(void const volatile*, size_t) = nullptr;
};

State& state() {
    static State s;
    return s;
}

thread_local Context* current = nullptr;

// Captures this thread has begun and not ended (capture mode
// thread-local, as the engine asks): while one is open, this thread's work
// that is not on a stream (the legacy stream, synchronous copies) is
// refused. Other threads go on as they would on a GPU.
thread_local int capturing_here = 0;

// The environment's settings, or the first one that is refused.
struct Config {
    size_t memory = 8ull << 30;
    int driver = 13000;
    std::string error;
};

// Host memory backs the device's, so more than 4 TiB is a mistake.
constexpr double kMaxMemoryGib = 4096;

Config read_config() {
    Config c;
    if (const char* v = std::getenv("STATEBENCH_EMULATOR_MEMORY_GIB"); v && *v) {
        char* end = nullptr;
        const double gib = std::strtod(v, &end);
        if (!end || *end != '\0' || !(gib > 0) || !(gib <= kMaxMemoryGib)) {
            c.error = std::string("STATEBENCH_EMULATOR_MEMORY_GIB=") + v +
                      " is not a number of GiB above 0 and at most 4096";
            return c;
        }
        c.memory = static_cast<size_t>(gib * static_cast<double>(1ull << 30));
        if (c.memory < kAlign) {
            c.error = std::string("STATEBENCH_EMULATOR_MEMORY_GIB=") + v + " is less than 256 bytes";
            return c;
        }
    }
    if (const char* v = std::getenv("STATEBENCH_EMULATOR_DRIVER_VERSION"); v && *v) {
        char* end = nullptr;
        const long n = std::strtol(v, &end, 10);
        if (!end || *end != '\0' || n < 1000 || n > 99990) {
            c.error = std::string("STATEBENCH_EMULATOR_DRIVER_VERSION=") + v +
                      " is not a driver version as cuDriverGetVersion numbers them (12040 is CUDA "
                      "12.4)";
            return c;
        }
        c.driver = static_cast<int>(n);
    }
    return c;
}

const Config& config() {
    static const Config c = read_config();
    return c;
}

size_t memory_bytes() { return config().error.empty() ? config().memory : 0; }

// Redzones are poisoned once a module has brought AddressSanitizer in;
// blocks made before that are poisoned then.
void poison_redzones(State& s, uintptr_t base, size_t size) {
    if (!s.poison) return;
    s.poison(reinterpret_cast<void*>(base - kRedzone), kRedzone);
    const size_t end = base + size;
    const size_t tail = ((size + kAlign - 1) / kAlign) * kAlign - size + kRedzone;
    s.poison(reinterpret_cast<void*>(end), tail);
}

int alloc(DevPtr* out, size_t size) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    State& s = state();
    std::lock_guard<std::mutex> g(s.lock);
    if (s.sticky) return s.sticky;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (size > memory_bytes() - s.allocated) return CUDA_ERROR_OUT_OF_MEMORY;
    const size_t rounded = ((size + kAlign - 1) / kAlign) * kAlign;
    void* raw = std::aligned_alloc(kAlign, rounded + 2 * kRedzone);
    if (!raw) return CUDA_ERROR_OUT_OF_MEMORY;
    const uintptr_t base = reinterpret_cast<uintptr_t>(raw) + kRedzone;
    std::memset(reinterpret_cast<void*>(base), 0xff, size);
    auto written = std::make_shared<Written>();
    written->bits.assign((size + 63) / 64, 0);
    s.allocations[base] = size;
    s.written[base] = std::move(written);
    s.snapshot.reset();
    s.allocated += size;
    poison_redzones(s, base, size);
    *out = base;
    return CUDA_SUCCESS;
}

int release(DevPtr ptr) {
    State& s = state();
    std::lock_guard<std::mutex> g(s.lock);
    auto it = s.allocations.find(ptr);
    if (it == s.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
    const size_t size = it->second;
    const size_t rounded = ((size + kAlign - 1) / kAlign) * kAlign;
    if (s.unpoison) s.unpoison(reinterpret_cast<void*>(ptr - kRedzone), rounded + 2 * kRedzone);
    std::free(reinterpret_cast<void*>(ptr - kRedzone));
    s.allocated -= size;
    s.allocations.erase(it);
    s.written.erase(ptr);
    s.snapshot.reset();
    return CUDA_SUCCESS;
}

// Whether [ptr, ptr + n) lies inside one allocation.
bool in_device(State& s, DevPtr ptr, size_t n) {
    auto it = s.allocations.upper_bound(ptr);
    if (it == s.allocations.begin()) return false;
    --it;
    return ptr >= it->first && ptr + n <= it->first + it->second && ptr + n >= ptr;
}

enum class Side { Host, Device };

// `take` (at most 64) bits of `bits` from bit `off`, and the same stored.
unsigned long long bits_at(const std::vector<unsigned long long>& bits, size_t off, size_t take) {
    const size_t w = off / 64, lo = off % 64;
    unsigned long long v = bits[w] >> lo;
    if (lo && lo + take > 64) v |= bits[w + 1] << (64 - lo);
    return take == 64 ? v : v & ((1ull << take) - 1);
}
void store_bits(std::vector<unsigned long long>& bits, size_t off, size_t take,
                unsigned long long v) {
    const size_t w = off / 64, lo = off % 64;
    const unsigned long long mask = take == 64 ? ~0ull : (1ull << take) - 1;
    v &= mask;
    bits[w] = (bits[w] & ~(mask << lo)) | (v << lo);
    if (lo && lo + take > 64) {
        bits[w + 1] = (bits[w + 1] & ~(mask >> (64 - lo))) | (v >> (64 - lo));
    }
}

// The written bytes of the allocation holding `ptr`, with `ptr`'s offset
// in it (the caller checked that there is one).
Written& written_at(State& s, DevPtr ptr, size_t* off) {
    auto it = --s.allocations.upper_bound(ptr);
    *off = ptr - it->first;
    return *s.written[it->first];
}

// Bytes [ptr, ptr + n) of the device were written.
void mark_written(State& s, DevPtr ptr, size_t n) {
    size_t off;
    Written& w = written_at(s, ptr, &off);
    for (size_t i = 0; i < n;) {
        const size_t take = (off + i) % 64 == 0 && n - i >= 64 ? 64 : 1;
        store_bits(w.bits, off + i, take, ~0ull);
        i += take;
    }
}

// A device-to-device copy carries what was written along.
void copy_written(State& s, DevPtr dst, DevPtr src, size_t n) {
    size_t doff, soff;
    Written& d = written_at(s, dst, &doff);
    const Written& from = written_at(s, src, &soff);
    const std::vector<unsigned long long> src_bits = from.bits;  // the two may overlap
    for (size_t i = 0; i < n;) {
        const size_t take = n - i < 64 ? n - i : 64;
        store_bits(d.bits, doff + i, take, bits_at(src_bits, soff + i, take));
        i += take;
    }
}

int copy(void* dst, Side dst_side, const void* src, Side src_side, size_t n) {
    State& s = state();
    {
        std::lock_guard<std::mutex> g(s.lock);
        if (s.sticky) return s.sticky;
        if (n == 0) return CUDA_SUCCESS;
        if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
        if (dst_side == Side::Device && !in_device(s, reinterpret_cast<DevPtr>(dst), n)) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (src_side == Side::Device && !in_device(s, reinterpret_cast<DevPtr>(src), n)) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (dst_side == Side::Device && src_side == Side::Device) {
            copy_written(s, reinterpret_cast<DevPtr>(dst), reinterpret_cast<DevPtr>(src), n);
        } else if (dst_side == Side::Device) {
            mark_written(s, reinterpret_cast<DevPtr>(dst), n);
        }
    }
    std::memmove(dst, src, n);
    return CUDA_SUCCESS;
}

int set8(DevPtr dst, unsigned char v, size_t n) {
    State& s = state();
    {
        std::lock_guard<std::mutex> g(s.lock);
        if (s.sticky) return s.sticky;
        if (!in_device(s, dst, n)) return CUDA_ERROR_INVALID_VALUE;
        mark_written(s, dst, n);
    }
    std::memset(reinterpret_cast<void*>(dst), v, n);
    return CUDA_SUCCESS;
}

int set32(DevPtr dst, unsigned int v, size_t n) {
    State& s = state();
    {
        std::lock_guard<std::mutex> g(s.lock);
        if (s.sticky) return s.sticky;
        if (n > SIZE_MAX / 4 || !in_device(s, dst, 4 * n)) return CUDA_ERROR_INVALID_VALUE;
        mark_written(s, dst, 4 * n);
    }
    unsigned int* p = reinterpret_cast<unsigned int*>(dst);
    for (size_t i = 0; i < n; ++i) p[i] = v;
    return CUDA_SUCCESS;
}

int sticky() {
    State& s = state();
    std::lock_guard<std::mutex> g(s.lock);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return s.sticky;
}

// Work other than a kernel launch: refused on a capturing stream (which it
// invalidates), and, without a stream, while this thread captures.
int not_capturing(Stream* stream) {
    if (stream && stream->capturing) {
        stream->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return !stream && capturing_here > 0 ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// STATEBENCH_EMULATOR_SCHEDULE_SEED: the seed of the order in which a
// block's threads run and its grid's blocks (default 1; 0 is thread order
// and blocks in order), or why it is refused.
struct Seed {
    unsigned long long value = 1;
    std::string error;
};
const Seed& schedule_seed() {
    static const Seed seed = [] {
        Seed r;
        const char* v = std::getenv("STATEBENCH_EMULATOR_SCHEDULE_SEED");
        if (!v || !*v) return r;
        bool digits = std::strlen(v) <= 20;
        for (const char* p = v; *p; ++p) digits = digits && *p >= '0' && *p <= '9';
        errno = 0;
        char* end = nullptr;
        const unsigned long long n = digits ? std::strtoull(v, &end, 10) : 0;
        if (!digits || errno == ERANGE || !end || *end) {
            r.error = std::string("STATEBENCH_EMULATOR_SCHEDULE_SEED=") + v +
                      " is not an unsigned 64-bit integer (0 runs threads in order)";
        }
        r.value = n;
        return r;
    }();
    return seed;
}

// The allocations for a launch: the last snapshot, or a new one.
std::shared_ptr<const Snapshot> snapshot(State& s) {
    std::lock_guard<std::mutex> g(s.lock);
    if (!s.snapshot) {
        auto snap = std::make_shared<Snapshot>();
        for (const auto& [base, size] : s.allocations) {
            const size_t rounded = ((size + kAlign - 1) / kAlign) * kAlign;
            const std::shared_ptr<Written>& w = s.written[base];
            snap->rows.push_back(emu::DeviceAllocation{base - kRedzone, base, size,
                                                       base + rounded + kRedzone, w->bits.data()});
            snap->keep.push_back(w);
        }
        s.snapshot = std::move(snap);
    }
    return s.snapshot;
}

// Runs one launch now; a failure makes the context fail for good.
int run(Function* f, const LaunchConfig& launch, void** params) {
    State& st = state();
    if (!schedule_seed().error.empty()) {
        std::lock_guard<std::mutex> g(st.lock);
        if (st.last_error != schedule_seed().error) {
            st.last_error = schedule_seed().error;
            std::fprintf(stderr, "statebench CUDA emulator: %s\n", st.last_error.c_str());
        }
        return CUDA_ERROR_INVALID_VALUE;
    }
    const std::shared_ptr<const Snapshot> snap = snapshot(st);
    LaunchConfig c = launch;
    c.seed = schedule_seed().value;
    c.allocations = snap->rows.data();
    c.n_allocations = snap->rows.size();
    char error[1024] = {0};
    if (f->launch(&c, params, error, sizeof error) != 0) {
        State& s = state();
        std::lock_guard<std::mutex> g(s.lock);
        if (!s.sticky) {
            s.sticky = CUDA_ERROR_LAUNCH_FAILED;
            s.last_error = error;
            std::fprintf(stderr, "statebench CUDA emulator: %s\n", error);
        }
        return CUDA_ERROR_LAUNCH_FAILED;
    }
    return CUDA_SUCCESS;
}

}  // namespace

#define API extern "C" __attribute__((visibility("default")))

API const char* statebench_emu_last_error() {
    State& s = state();
    std::lock_guard<std::mutex> g(s.lock);
    return s.last_error.c_str();
}

API int cuGetErrorName(int e, const char** out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    switch (e) {
        case CUDA_SUCCESS: *out = "CUDA_SUCCESS"; break;
        case CUDA_ERROR_INVALID_VALUE: *out = "CUDA_ERROR_INVALID_VALUE"; break;
        case CUDA_ERROR_OUT_OF_MEMORY: *out = "CUDA_ERROR_OUT_OF_MEMORY"; break;
        case CUDA_ERROR_NOT_INITIALIZED: *out = "CUDA_ERROR_NOT_INITIALIZED"; break;
        case CUDA_ERROR_INVALID_DEVICE: *out = "CUDA_ERROR_INVALID_DEVICE"; break;
        case CUDA_ERROR_INVALID_IMAGE: *out = "CUDA_ERROR_INVALID_IMAGE"; break;
        case CUDA_ERROR_INVALID_CONTEXT: *out = "CUDA_ERROR_INVALID_CONTEXT"; break;
        case CUDA_ERROR_INVALID_PTX: *out = "CUDA_ERROR_INVALID_PTX"; break;
        case CUDA_ERROR_NO_BINARY_FOR_GPU: *out = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
        case CUDA_ERROR_UNSUPPORTED_PTX_VERSION: *out = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"; break;
        case CUDA_ERROR_INVALID_HANDLE: *out = "CUDA_ERROR_INVALID_HANDLE"; break;
        case CUDA_ERROR_NOT_FOUND: *out = "CUDA_ERROR_NOT_FOUND"; break;
        case CUDA_ERROR_NOT_READY: *out = "CUDA_ERROR_NOT_READY"; break;
        case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *out = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"; break;
        case CUDA_ERROR_LAUNCH_FAILED: *out = "CUDA_ERROR_LAUNCH_FAILED"; break;
        case CUDA_ERROR_NOT_SUPPORTED: *out = "CUDA_ERROR_NOT_SUPPORTED"; break;
        case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: *out = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; break;
        case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: *out = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; break;
        case CUDA_ERROR_ILLEGAL_STATE: *out = "CUDA_ERROR_ILLEGAL_STATE"; break;
        default: *out = "CUDA_ERROR_UNKNOWN"; break;
    }
    return CUDA_SUCCESS;
}

API int cuGetErrorString(int e, const char** out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    switch (e) {
        case CUDA_ERROR_LAUNCH_FAILED:
            *out = "an emulated kernel failed (see statebench_emu_last_error / stderr)";
            return CUDA_SUCCESS;
        case CUDA_ERROR_INVALID_PTX:
            *out = "the image is not a module built by the emulator's NVRTC";
            return CUDA_SUCCESS;
        case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
            *out = "the provided PTX was compiled with an unsupported toolchain.";
            return CUDA_SUCCESS;
        case CUDA_ERROR_NO_BINARY_FOR_GPU:
            *out = "no kernel image is available for execution on the device";
            return CUDA_SUCCESS;
        case CUDA_ERROR_INVALID_IMAGE:
            *out = "device kernel image is invalid";
            return CUDA_SUCCESS;
        default: return cuGetErrorName(e, out);
    }
}

// A refused setting: kept as the last error, said once on stderr.
static int refuse_config() {
    State& s = state();
    std::lock_guard<std::mutex> g(s.lock);
    if (s.last_error != config().error) {
        s.last_error = config().error;
        std::fprintf(stderr, "statebench CUDA emulator: %s\n", s.last_error.c_str());
    }
    return CUDA_ERROR_INVALID_VALUE;
}

API int cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!config().error.empty()) return refuse_config();
    State& s = state();
    std::lock_guard<std::mutex> g(s.lock);
    s.initialized = true;
    return CUDA_SUCCESS;
}

API int cuDriverGetVersion(int* v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (!config().error.empty()) return refuse_config();
    *v = config().driver;
    return CUDA_SUCCESS;
}

// An entry point added in CUDA `since`: a driver older than that has no
// such symbol, which the emulator cannot hide, so the call fails and says
// which one it was.
static int lacks(const char* name, int since) {
    if (config().driver >= since) return CUDA_SUCCESS;
    State& s = state();
    std::lock_guard<std::mutex> g(s.lock);
    s.last_error = std::string(name) + " does not exist in the impersonated driver (CUDA " +
                   std::to_string(config().driver / 1000) + "." +
                   std::to_string(config().driver % 1000 / 10) + ")";
    std::fprintf(stderr, "statebench CUDA emulator: %s\n", s.last_error.c_str());
    return CUDA_ERROR_NOT_FOUND;
}

API int cuDeviceGetCount(int* n) {
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    if (int e = sticky(); e == CUDA_ERROR_NOT_INITIALIZED) return e;
    *n = 1;
    return CUDA_SUCCESS;
}

API int cuDeviceGet(int* dev, int ordinal) {
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    if (int e = sticky(); e == CUDA_ERROR_NOT_INITIALIZED) return e;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *dev = 0;
    return CUDA_SUCCESS;
}

API int cuDeviceGetName(char* name, int len, int dev) {
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, static_cast<size_t>(len), "%s", kName);
    return CUDA_SUCCESS;
}

API int cuDeviceGetUuid(char* uuid, int dev) {
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    std::memcpy(uuid, "statebench-emu-0", 16);
    return CUDA_SUCCESS;
}

API int cuDeviceGetUuid_v2(char* uuid, int dev) { return cuDeviceGetUuid(uuid, dev); }

API int cuDeviceTotalMem_v2(size_t* bytes, int dev) {
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = memory_bytes();
    return CUDA_SUCCESS;
}

API int cuDeviceGetAttribute(int* v, int attr, int dev) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
        case 1: *v = 1024; break;                    // max threads per block
        case 2: case 3: *v = 1024; break;            // max block dim x, y
        case 4: *v = 64; break;                      // max block dim z
        case 5: *v = 2147483647; break;              // max grid dim x
        case 6: case 7: *v = 65535; break;           // max grid dim y, z
        case 8: *v = 48 * 1024; break;               // shared memory per block
        case 9: *v = 64 * 1024; break;               // constant memory
        case 10: *v = 32; break;                     // warp size
        case 12: *v = 65536; break;                  // registers per block
        case 13: *v = 1000000; break;                // clock rate, kHz
        case 16: *v = 108; break;                    // multiprocessors (an A100's)
        case 38: *v = 0; break;                      // L2 cache
        case 39: *v = 2048; break;                   // threads per multiprocessor
        case 41: *v = 1; break;                      // unified addressing
        case 75: *v = kComputeMajor; break;
        case 76: *v = kComputeMinor; break;
        case 81: *v = 164 * 1024; break;             // shared memory per multiprocessor
        case 97: *v = 163 * 1024; break;             // shared memory per block, opt-in
        case 115: *v = 1; break;                     // memory pools
        default: *v = 0; break;
    }
    return CUDA_SUCCESS;
}

API int cuDevicePrimaryCtxRetain(Context** ctx, int dev) {
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    State& s = state();
    std::lock_guard<std::mutex> g(s.lock);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    s.primary.refs++;
    *ctx = &s.primary;
    return CUDA_SUCCESS;
}

API int cuDevicePrimaryCtxRelease_v2(int dev) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    State& s = state();
    std::lock_guard<std::mutex> g(s.lock);
    if (s.primary.refs > 0) s.primary.refs--;
    return CUDA_SUCCESS;
}

API int cuCtxSetCurrent(Context* ctx) {
    current = ctx;
    return CUDA_SUCCESS;
}

API int cuCtxGetCurrent(Context** ctx) {
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = current;
    return CUDA_SUCCESS;
}

API int cuCtxPushCurrent_v2(Context* ctx) { return cuCtxSetCurrent(ctx); }
API int cuCtxPopCurrent_v2(Context** ctx) {
    if (ctx) *ctx = current;
    return CUDA_SUCCESS;
}
API int cuCtxGetDevice(int* dev) {
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    *dev = 0;
    return CUDA_SUCCESS;
}
API int cuCtxSynchronize() {
    if (int e = not_capturing(nullptr)) return e;
    return sticky();
}
API int cuCtxSetFlags(unsigned int) { return CUDA_SUCCESS; }
API int cuCtxGetFlags(unsigned int* f) {
    if (f) *f = 0;
    return CUDA_SUCCESS;
}
API int cuCtxSetLimit(int, size_t) { return CUDA_SUCCESS; }
API int cuCtxGetLimit(size_t* v, int) {
    if (v) *v = 0;
    return CUDA_SUCCESS;
}

// Streams and events: everything is done when it is asked for.
API int cuStreamCreate(Stream** s, unsigned int) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = new Stream();
    return CUDA_SUCCESS;
}
API int cuStreamCreateWithPriority(Stream** s, unsigned int flags, int) {
    return cuStreamCreate(s, flags);
}
API int cuStreamDestroy_v2(Stream* s) {
    delete s;
    return CUDA_SUCCESS;
}
API int cuStreamSynchronize(Stream* s) {
    if (s && s->capturing) return not_capturing(s);
    return sticky();
}
API int cuStreamQuery(Stream*) { return sticky(); }
API int cuStreamWaitEvent(Stream*, Event*, unsigned int) { return sticky(); }
API int cuStreamIsCapturing(Stream* s, int* status) {
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    *status = s && s->capturing ? (s->invalidated ? 2 : 1) : 0;
    return CUDA_SUCCESS;
}

// Graphs: a capture records launches; an instantiated graph runs them in
// order.
API int cuStreamBeginCapture_v2(Stream* s, int) {
    if (!s) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream
    if (s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    if (int e = sticky()) return e;
    s->capturing = new Graph();
    s->invalidated = false;
    capturing_here++;
    return CUDA_SUCCESS;
}
API int cuStreamEndCapture(Stream* s, Graph** out) {
    if (!s || !out) return CUDA_ERROR_INVALID_VALUE;
    if (!s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    Graph* graph = s->capturing;
    s->capturing = nullptr;
    if (capturing_here > 0) capturing_here--;
    if (s->invalidated) {
        delete graph;
        *out = nullptr;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *out = graph;
    return CUDA_SUCCESS;
}
API int cuGraphInstantiateWithFlags(GraphExec** out, Graph* graph, unsigned long long) {
    if (!out || !graph) return CUDA_ERROR_INVALID_VALUE;
    *out = new GraphExec{graph->nodes};
    return CUDA_SUCCESS;
}
API int cuGraphLaunch(GraphExec* exec, Stream* s) {
    if (!exec) return CUDA_ERROR_INVALID_HANDLE;
    if (int e = not_capturing(s)) return e;
    if (int e = sticky()) return e;
    std::vector<void*> params;
    for (Node& n : exec->nodes) {
        params.clear();
        for (size_t off : n.offsets) params.push_back(n.blob.data() + off);
        if (int e = run(n.f, n.c, params.data())) return e;
    }
    return CUDA_SUCCESS;
}
API int cuGraphUpload(GraphExec* exec, Stream*) {
    return exec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
API int cuGraphExecDestroy(GraphExec* exec) {
    delete exec;
    return CUDA_SUCCESS;
}
API int cuGraphDestroy(Graph* graph) {
    delete graph;
    return CUDA_SUCCESS;
}
API int cuLaunchHostFunc(Stream*, void (*fn)(void*), void* data) {
    if (int e = sticky()) return e;
    fn(data);
    return CUDA_SUCCESS;
}

API int cuEventCreate(Event** e, unsigned int) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    *e = new Event{std::chrono::steady_clock::now(), false};
    return CUDA_SUCCESS;
}
// Recording an event on a capturing stream is allowed, as on a GPU (it
// orders nothing here).
API int cuEventRecord(Event* e, Stream*) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    e->at = std::chrono::steady_clock::now();
    e->recorded = true;
    return sticky();
}
API int cuEventRecordWithFlags(Event* e, Stream* s, unsigned int) { return cuEventRecord(e, s); }
API int cuEventSynchronize(Event*) { return sticky(); }
API int cuEventQuery(Event*) { return sticky(); }
API int cuEventElapsedTime(float* ms, Event* a, Event* b) {
    if (!ms || !a || !b) return CUDA_ERROR_INVALID_VALUE;
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
    return CUDA_SUCCESS;
}
API int cuEventElapsedTime_v2(float* ms, Event* a, Event* b) {
    if (int e = lacks("cuEventElapsedTime_v2", 12080)) return e;
    return cuEventElapsedTime(ms, a, b);
}
API int cuEventDestroy_v2(Event* e) {
    delete e;
    return CUDA_SUCCESS;
}

// Memory.
#define CAPTURE_GUARD(stream) \
    if (int e = not_capturing(stream)) return e
API int cuMemAlloc_v2(DevPtr* p, size_t n) {
    CAPTURE_GUARD(nullptr);
    return alloc(p, n);
}
API int cuMemAllocAsync(DevPtr* p, size_t n, Stream* s) {
    CAPTURE_GUARD(s);
    return alloc(p, n);
}
API int cuMemFree_v2(DevPtr p) {
    CAPTURE_GUARD(nullptr);
    return release(p);
}
API int cuMemFreeAsync(DevPtr p, Stream* s) {
    CAPTURE_GUARD(s);
    return release(p);
}
API int cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    State& s = state();
    std::lock_guard<std::mutex> g(s.lock);
    *total = memory_bytes();
    *free_bytes = *total > s.allocated ? *total - s.allocated : 0;
    return CUDA_SUCCESS;
}
API int cuMemAllocHost_v2(void** p, size_t n) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    *p = std::aligned_alloc(kAlign, ((n + kAlign - 1) / kAlign) * kAlign);
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
API int cuMemHostAlloc(void** p, size_t n, unsigned int) { return cuMemAllocHost_v2(p, n); }
API int cuMemFreeHost(void* p) {
    std::free(p);
    return CUDA_SUCCESS;
}
API int cuMemcpyHtoDAsync_v2(DevPtr dst, const void* src, size_t n, Stream* s) {
    CAPTURE_GUARD(s);
    return copy(reinterpret_cast<void*>(dst), Side::Device, src, Side::Host, n);
}
API int cuMemcpyHtoD_v2(DevPtr dst, const void* src, size_t n) {
    return cuMemcpyHtoDAsync_v2(dst, src, n, nullptr);
}
API int cuMemcpyDtoHAsync_v2(void* dst, DevPtr src, size_t n, Stream* s) {
    CAPTURE_GUARD(s);
    return copy(dst, Side::Host, reinterpret_cast<const void*>(src), Side::Device, n);
}
API int cuMemcpyDtoH_v2(void* dst, DevPtr src, size_t n) {
    return cuMemcpyDtoHAsync_v2(dst, src, n, nullptr);
}
API int cuMemcpyDtoDAsync_v2(DevPtr dst, DevPtr src, size_t n, Stream* s) {
    CAPTURE_GUARD(s);
    return copy(reinterpret_cast<void*>(dst), Side::Device, reinterpret_cast<const void*>(src),
                Side::Device, n);
}
API int cuMemcpyDtoD_v2(DevPtr dst, DevPtr src, size_t n) {
    return cuMemcpyDtoDAsync_v2(dst, src, n, nullptr);
}
// Unified addressing: either side may be host or device memory.
API int cuMemcpyAsync(DevPtr dst, DevPtr src, size_t n, Stream* stream) {
    CAPTURE_GUARD(stream);
    State& s = state();
    Side ds, ss;
    {
        std::lock_guard<std::mutex> g(s.lock);
        ds = in_device(s, dst, n) ? Side::Device : Side::Host;
        ss = in_device(s, src, n) ? Side::Device : Side::Host;
    }
    return copy(reinterpret_cast<void*>(dst), ds, reinterpret_cast<const void*>(src), ss, n);
}
API int cuMemcpy(DevPtr dst, DevPtr src, size_t n) { return cuMemcpyAsync(dst, src, n, nullptr); }
API int cuMemsetD8Async(DevPtr dst, unsigned char v, size_t n, Stream* s) {
    CAPTURE_GUARD(s);
    return set8(dst, v, n);
}
API int cuMemsetD8_v2(DevPtr dst, unsigned char v, size_t n) {
    return cuMemsetD8Async(dst, v, n, nullptr);
}
API int cuMemsetD32Async(DevPtr dst, unsigned int v, size_t n, Stream* s) {
    CAPTURE_GUARD(s);
    return set32(dst, v, n);
}
API int cuMemsetD32_v2(DevPtr dst, unsigned int v, size_t n) {
    return cuMemsetD32Async(dst, v, n, nullptr);
}
#undef CAPTURE_GUARD

// Whether the impersonated driver loads an image of the kind `line` (the
// image's second line) names: 0, or the error a driver of that version
// gives, with the reason kept as the last error.
static int loadable(const char* line) {
    const size_t prefix = sizeof emu::kImageKind - 1;
    char kind[8] = {0};
    int a = 0, b = 0, used = 0;
    bool parsed = std::strncmp(line, emu::kImageKind, prefix) == 0;
    if (parsed) {
        line += prefix;
        parsed = std::sscanf(line, "ptx %d compute_%d%n", &a, &b, &used) == 2 ||
                 std::sscanf(line, "cubin sm_%d %d%n", &b, &a, &used) == 2;
        std::snprintf(kind, sizeof kind, "%s", line[0] == 'p' ? "ptx" : "cubin");
    }
    if (!parsed || line[used] != '\n') return CUDA_ERROR_INVALID_IMAGE;
    const int driver = config().driver;
    const int device = kComputeMajor * 10 + kComputeMinor;
    const int dmaj = driver / 1000, dmin = driver % 1000 / 10;
    char why[256] = {0};
    int e = CUDA_SUCCESS;
    if (kind[0] == 'p') {
        const int isa = emu::ptx_isa_of(driver);
        if (a > isa) {
            std::snprintf(why, sizeof why,
                          "PTX ISA %d.%d is newer than a CUDA %d.%d driver loads (%d.%d)", a / 10,
                          a % 10, dmaj, dmin, isa / 10, isa % 10);
            e = CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
        } else if (b > device) {
            std::snprintf(why, sizeof why, "PTX for compute_%d cannot run on an sm_%d device", b,
                          device);
            e = CUDA_ERROR_INVALID_PTX;
        }
    } else if (a / 1000 > dmaj) {
        std::snprintf(why, sizeof why,
                      "a cubin from NVRTC %d.%d cannot be loaded by a CUDA %d.%d driver", a / 1000,
                      a % 1000 / 10, dmaj, dmin);
        e = CUDA_ERROR_INVALID_IMAGE;
    } else if (b / 10 != device / 10 || b > device) {
        std::snprintf(why, sizeof why, "a cubin for sm_%d cannot run on an sm_%d device", b, device);
        e = CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    if (e) {
        State& s = state();
        std::lock_guard<std::mutex> g(s.lock);
        s.last_error = why;
        std::fprintf(stderr, "statebench CUDA emulator: %s\n", why);
    }
    return e;
}

// Modules and launches.
API int cuModuleLoadData(Module** module, const void* image) {
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    if (int e = sticky()) return e;
    const char* text = static_cast<const char*>(image);
    const size_t magic = sizeof emu::kImageMagic - 1;
    if (std::strncmp(text, emu::kImageMagic, magic) != 0) return CUDA_ERROR_INVALID_PTX;
    text += magic;
    if (int e = loadable(text)) return e;
    text = std::strchr(text, '\n') + 1;  // loadable() found the kind's line
    std::string path = text;
    while (!path.empty() && (path.back() == '\n' || path.back() == '\0')) path.pop_back();
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        State& s = state();
        std::lock_guard<std::mutex> g(s.lock);
        s.last_error = std::string("loading ") + path + ": " + dlerror();
        std::fprintf(stderr, "statebench CUDA emulator: %s\n", s.last_error.c_str());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    State& s = state();
    {
        std::lock_guard<std::mutex> g(s.lock);
        if (!s.poison) {
            // The first module built with AddressSanitizer: from now on
            // every allocation's redzones are poisoned, earlier ones too.
            s.poison = reinterpret_cast<void (*)(void const volatile*, size_t)>(
                dlsym(h, "__asan_poison_memory_region"));
            s.unpoison = reinterpret_cast<void (*)(void const volatile*, size_t)>(
                dlsym(h, "__asan_unpoison_memory_region"));
            if (s.poison && s.unpoison) {
                for (const auto& [base, size] : s.allocations) poison_redzones(s, base, size);
            } else {
                s.poison = nullptr;
                s.unpoison = nullptr;
            }
        }
    }
    *module = new Module{h};
    return CUDA_SUCCESS;
}

API int cuModuleLoadDataEx(Module** module, const void* image, unsigned int, void*, void**) {
    return cuModuleLoadData(module, image);
}

// Modules stay mapped: a kernel's code must outlive every handle to it.
API int cuModuleUnload(Module* module) {
    delete module;
    return CUDA_SUCCESS;
}

API int cuModuleGetFunction(Function** f, Module* module, const char* name) {
    if (!f || !module || !name) return CUDA_ERROR_INVALID_VALUE;
    void* launch = dlsym(module->handle, (std::string(emu::kLaunchPrefix) + name).c_str());
    void* sizes = dlsym(module->handle, (std::string(emu::kParamsPrefix) + name).c_str());
    if (!launch || !sizes) return CUDA_ERROR_NOT_FOUND;
    *f = new Function{reinterpret_cast<Launcher>(launch), reinterpret_cast<ParamSizes>(sizes), name};
    return CUDA_SUCCESS;
}

API int cuModuleGetGlobal_v2(DevPtr*, size_t*, Module*, const char*) {
    return CUDA_ERROR_NOT_FOUND;
}

API int cuFuncGetAttribute(int* v, int attr, Function*) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = attr == 0 ? 1024 : 0;  // max threads per block; sizes of nothing else
    return CUDA_SUCCESS;
}
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8) is kept and checked
// at launch; the others change nothing here.
API int cuFuncSetAttribute(Function* f, int attr, int value) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (attr == 8) {
        if (value < 0 || value > 163 * 1024) return CUDA_ERROR_INVALID_VALUE;
        f->max_dynamic_shared = static_cast<unsigned int>(value);
    }
    return CUDA_SUCCESS;
}
API int cuFuncSetCacheConfig(Function*, int) { return CUDA_SUCCESS; }

// Blocks of `threads` threads and `shared` bytes that an sm_80's
// multiprocessor holds (2,048 threads, 164 KiB, 32 blocks); registers are
// not modelled.
API int cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, Function* f, int threads,
                                                              size_t shared, unsigned int) {
    if (!blocks) return CUDA_ERROR_INVALID_VALUE;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (threads <= 0 || threads > 1024) return CUDA_ERROR_INVALID_VALUE;
    int n = 2048 / threads;
    if (shared > 0) n = std::min<long>(n, static_cast<long>((164 * 1024) / (shared + 1024)));
    *blocks = std::max(0, std::min(n, 32));
    return CUDA_SUCCESS;
}
API int cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Function* f, int threads,
                                                     size_t shared) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, f, threads, shared, 0);
}

API int cuLaunchKernel(Function* f, unsigned int gx, unsigned int gy, unsigned int gz,
                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                       Stream* stream, void** params, void** extra) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (int e = sticky()) return e;
    if (extra) return CUDA_ERROR_NOT_SUPPORTED;
    if (!gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535 || bz > 64) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (static_cast<unsigned long long>(bx) * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
    // Past 48 KiB only with the kernel's attribute raised, as on a GPU.
    if (shared > f->max_dynamic_shared) return CUDA_ERROR_INVALID_VALUE;
    LaunchConfig c{{gx, gy, gz}, {bx, by, bz}, shared};
    if (stream && stream->capturing) {
        unsigned long sizes[64];
        const int n = f->sizes(sizes, 64);
        if (n > 64) return CUDA_ERROR_NOT_SUPPORTED;
        Node node{f, c, {}, {}};
        for (int i = 0; i < n; ++i) {
            const size_t at = (node.blob.size() + 15) / 16 * 16;
            node.blob.resize(at + sizes[i]);
            std::memcpy(node.blob.data() + at, params[i], sizes[i]);
            node.offsets.push_back(at);
        }
        stream->capturing->nodes.push_back(std::move(node));
        return CUDA_SUCCESS;
    }
    if (int e = not_capturing(stream)) return e;
    return run(f, c, params);
}
