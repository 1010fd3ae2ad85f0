// The CUDA execution model on the CPU: statebench's `.cu` kernel sources,
// compiled by the system C++ compiler against this header, run with the
// semantics they have on a GPU.
//
// - Every GPU thread of a block is a fiber on one OS thread. A fiber runs
//   until it reaches a barrier or a warp collective, or exits; then another
//   runnable one runs: the next in thread order, or with a schedule seed
//   (LaunchConfig::seed) one the seed picks, and the blocks of a grid in an
//   order it picks too, so results that depend on the order show. A barrier
//   completes when every thread that has not exited has arrived; a block in
//   which no thread can go on while some wait is an error that names the
//   waits (never a hang).
// - `__shared__` variables live in a per-block arena filled with 0xff bytes
//   (NaN as f32, -1 as integers), with gaps between them.
// - Warp collectives (shuffles, votes, `__syncwarp`, ldmatrix, mma) are
//   rendezvous of exactly the lanes of their mask: a lane outside the mask,
//   an exited lane in it, or lanes of one mask at different collectives are
//   reported errors.
// - Checks (EMU_CHECKS: the module is compiled with ThreadSanitizer's
//   instrumentation but not its runtime, so every load and store of a
//   kernel calls one of the `__tsan_*` hooks at the end of this file):
//   shared memory remembers, byte by byte, its last writer and its readers
//   since the last barrier, and a read or write of a byte another thread
//   wrote, or a write of a byte another thread read, in the same barrier
//   interval without a warp collective of both threads in between is a
//   race; a read of shared memory no thread of the block wrote, or of
//   device memory nothing wrote (the driver keeps a bit per byte), is an
//   uninitialized read; an access in a gap between shared variables or in
//   a device allocation's redzone is out of bounds. The first of these
//   stops the block with a report naming the variable, the source lines
//   and the threads. Modules built with AddressSanitizer instead check
//   bounds only (gaps and redzones are poisoned).
// - Precision. Host libm computes expf, logf, sinf, ...; CUDA states ulp
//   bounds for its own (expf 2 ulp, logf 1 ulp, sinf/cosf 2 ulp, rsqrtf
//   2 ulp, __fdividef 2 ulp in range) and host libm stays within them, so
//   an emulated kernel is an exact program in the GPU's rounding envelope,
//   not a bit-copy of its hardware. The fast intrinsics follow their
//   hardware recipe: __expf(x) = 2^(x·log2 e) with the product rounded to
//   f32, __logf(x) = log2(x)·ln 2, __fdividef(a, b) = a · (1/b). fmaf is
//   one rounding. mma.sync sums its 16 exact bf16 products and the
//   accumulator in double and rounds once to f32.
//
// Only the source rewriting in the emulator's NVRTC (`nvrtc.cpp`) and the
// launch entry points it appends know about this file; kernels are written
// for NVRTC and include nothing.

#pragma once

#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <utility>

#include <sys/mman.h>

#include "abi.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_POISON(p, n) __asan_poison_memory_region((p), (n))
#define EMU_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define EMU_POISON(p, n) ((void)(p), (void)(n))
#define EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#if defined(__SANITIZE_THREAD__)
#define EMU_CHECKS 1
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#else
#define EMU_CHECKS 0
#endif

// Fibers switch by a hand-written x86-64 context switch, or by ucontext
// elsewhere and wherever STATEBENCH_EMU_UCONTEXT is defined (the emulated
// NVRTC defines it under STATEBENCH_EMULATOR_FIBERS=ucontext, so the
// fallback other hosts run is tested on x86-64 too).
#if defined(__x86_64__) && !defined(STATEBENCH_EMU_UCONTEXT)
#define EMU_ASM_FIBERS 1
#else
#include <ucontext.h>
#endif

// The emulator's own bookkeeping is checked by neither checker (its memory
// is its own). What it does on the kernels' behalf (ldmatrix's reads,
// cp.async's copies, atomics) AddressSanitizer checks as it happens, and
// the race checker is told explicitly, with the thread it is done for.
// (GCC inlines no function across a difference of these attributes, so a
// kernel calls them and they keep their own.)
#define EMU_NOCHECK __attribute__((no_sanitize_address, no_sanitize("thread")))
#define EMU_RUNTIME inline EMU_NOCHECK
#define EMU_BEHALF inline __attribute__((no_sanitize("thread")))

// ---------------------------------------------------------------------------
// CUDA's declaration specifiers and built-in types.

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __constant__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// `__shared__` declarations are rewritten into arena references before the
// compiler sees them; one the rewriting did not recognise must not compile.
#define __shared__ __shared___this_declaration_form_is_not_supported_by_the_emulator

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

static constexpr int warpSize = 32;

namespace emu {

[[noreturn]] EMU_RUNTIME void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// One pending cp.async copy; it happens when its group is waited for.
struct AsyncCopy {
    void* dst;
    const void* src;
    unsigned int bytes;
    unsigned int src_bytes;  // the rest of `bytes` is zero-filled
    int group;
    int32_t pc;  // where it was issued (the race checker's record)
};

enum class State { Runnable, Barrier, Warp, Done };

// Where a switched-out fiber (or the scheduler) resumes.
struct Context {
    void* sp = nullptr;
#if !defined(EMU_ASM_FIBERS)
    ucontext_t uc;
#endif
};

struct Fiber {
    Context ctx;
    char* stack = nullptr;
    State state = State::Runnable;
    uint3 tid{};
    unsigned int linear = 0;
    const char* wait_site = "";
    int wait_line = 0;
    // cp.async groups: open copies carry group `open_group`.
    AsyncCopy* copies = nullptr;
    int n_copies = 0;
    int cap_copies = 0;
    int open_group = 0;
#if defined(__SANITIZE_ADDRESS__)
    void* fake_stack = nullptr;
#endif
};

enum class WarpOp { None, Sync, Shfl, ShflUp, ShflDown, ShflXor, Ballot, Any, All, LdMatrix, Mma };

// Recent completed collectives a warp remembers (the race checker's
// question: did these two lanes meet since then?).
constexpr int kRecentCollectives = 16;

// A warp collective open: its lanes and where it is.
struct Meeting {
    WarpOp op = WarpOp::None;
    unsigned int mask = 0;
    unsigned int arrived = 0;
    const char* site = "";
    int line = 0;
    int width = 32;
    int count = 0;
};
constexpr int kOpenCollectives = 8;

// A warp's collectives: those open, each lane's operands (a lane is at one
// collective at a time), and the results the last lane to arrive at one
// computes for all of its lanes; `op` to `count` describe the collective
// being filled or computed.
struct WarpMeet {
    Meeting open[kOpenCollectives];
    WarpOp op = WarpOp::None;
    unsigned int lanes = 0;   // lanes the block has in this warp
    unsigned int exited = 0;  // of those, lanes that have exited
    unsigned int mask = 0;
    int width = 32;
    // Collectives completed in this block, the number of the last one of
    // all the warp's lanes, and the masks of the latest ones by number.
    uint32_t seq = 0;
    uint32_t full_seq = 0;
    uint32_t recent_seq[kRecentCollectives];
    uint32_t recent_mask[kRecentCollectives];
    uint64_t value[32];
    int64_t arg[32];
    uint64_t result[32];
    bool bad[32];  // a shuffle lane whose source lane is outside the mask
    // ldmatrix: each lane's row address, where it called, and its 4 result
    // registers; mma: its fragments (a: 4 regs, b: 2, c: 4 floats) and
    // results (4 floats).
    const void* addr[32];
    int32_t pc[32];
    uint32_t regs[32][4];
    uint32_t mma_a[32][4];
    uint32_t mma_b[32][2];
    float mma_c[32][4];
    float mma_d[32][4];
    int count = 0;  // ldmatrix: matrices; .trans in `width`
};

struct SharedVar {
    int id;
    void* ptr;
    const char* name;
    size_t size;
};

struct Shadow;
struct ShadowMemory;

struct Block {
    const char* kernel = "";
    uint3 idx{};
    dim3 dim{};
    dim3 grid{};
    unsigned int n = 0;
    unsigned int live = 0;
    unsigned int barrier_arrived = 0;
    const char* barrier_site = "";
    int barrier_line = 0;
    Fiber* fibers = nullptr;
    WarpMeet* warps = nullptr;
    unsigned int n_warps = 0;
    // Shared memory: the dynamic part first, static variables after it.
    char* arena = nullptr;
    size_t arena_cap = 0;
    size_t arena_used = 0;
    size_t dynamic_bytes = 0;
    const char* dynamic_name = nullptr;  // as the first `extern __shared__` names it
    SharedVar vars[64];
    int n_vars = 0;
    Context sched;
#if defined(__SANITIZE_ADDRESS__)
    bool from_scheduler = false;
    const void* sched_stack_bottom = nullptr;
    size_t sched_stack_size = 0;
    void* sched_fake_stack = nullptr;
#endif
    // The schedule: 0 runs threads in order, else the generator's state.
    uint64_t rng = 0;
    // The race checker: the current barrier interval and the block's
    // first (intervals are numbered on, never reused, per OS thread), the
    // shadow of the arena, the device's allocations with the last one hit
    // and their span, and the first uninitialized shared read of the
    // interval (reported when it ends, unless a race is found first: a
    // read before another thread's write in one interval is a race).
    uint32_t epoch = 0;
    uint32_t first_epoch = 0;
    ShadowMemory* shadow = nullptr;
    const DeviceAllocation* allocs = nullptr;
    unsigned long n_allocs = 0;
    const DeviceAllocation* last_alloc = nullptr;
    uintptr_t dev_lo = 0;
    uintptr_t dev_span = 0;
    bool uninit_pending = false;
    size_t uninit_off = 0;
    unsigned int uninit_tid = 0;
    int32_t uninit_pc = 0;
    void (*body)(void*) = nullptr;
    void* body_ctx = nullptr;
    char* error = nullptr;
    size_t error_len = 0;
    bool failed = false;
};

// The block being run on this OS thread and the fiber being run in it.
// Initial-exec TLS: one load from %fs, not a call per `threadIdx`.
__attribute__((tls_model("initial-exec"))) inline thread_local Block* cur_block = nullptr;
__attribute__((tls_model("initial-exec"))) inline thread_local Fiber* cur_fiber = nullptr;

EMU_RUNTIME Block& block() {
    if (!cur_block) {
        std::fprintf(stderr, "cuda emulator: a device built-in used outside a kernel\n");
        std::abort();
    }
    return *cur_block;
}
EMU_RUNTIME Fiber& self() {
    if (!cur_fiber) {
        std::fprintf(stderr, "cuda emulator: a device built-in used outside a kernel\n");
        std::abort();
    }
    return *cur_fiber;
}

// The built-ins by value: a kernel reads them without a memory access the
// race checker would look at.
EMU_RUNTIME uint3 thread_idx() { return self().tid; }
EMU_RUNTIME uint3 block_idx() { return block().idx; }
EMU_RUNTIME dim3 block_dim() { return block().dim; }
EMU_RUNTIME dim3 grid_dim() { return block().grid; }

// A block's thread, by its linear index.
EMU_RUNTIME uint3 thread_of(const Block& b, unsigned int linear) {
    return uint3{linear % b.dim.x, (linear / b.dim.x) % b.dim.y, linear / (b.dim.x * b.dim.y)};
}

// The schedule's generator (xorshift64*), and a seed's mix (splitmix64).
EMU_RUNTIME uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
EMU_RUNTIME uint64_t next_random(Block& b) {
    uint64_t x = b.rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    b.rng = x;
    return x * 0x2545f4914f6cdd1dull;
}

// ---------------------------------------------------------------------------
// Fibers: a context switch saves the callee-saved registers and the stack
// pointer (x86-64 System V), or uses ucontext elsewhere.

constexpr size_t kStackBytes = 256 * 1024;

#if defined(EMU_ASM_FIBERS)
extern "C" void statebench_emu_switch(void** save_sp, void* to_sp);
extern "C" void statebench_emu_fiber_entry();
asm(R"(
    .text
    .p2align 4
    .globl statebench_emu_switch
    .hidden statebench_emu_switch
    .type statebench_emu_switch,@function
statebench_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size statebench_emu_switch, .-statebench_emu_switch

    .p2align 4
    .globl statebench_emu_fiber_entry
    .hidden statebench_emu_fiber_entry
    .type statebench_emu_fiber_entry,@function
statebench_emu_fiber_entry:
    call statebench_emu_fiber_main
    ud2
    .size statebench_emu_fiber_entry, .-statebench_emu_fiber_entry
)");
#endif

extern "C" __attribute__((used, visibility("hidden"))) EMU_NOCHECK void statebench_emu_fiber_main();

// Resumed fiber `f`: tell AddressSanitizer which stack it is on now (and,
// on an entry from the scheduler, remember the scheduler's stack).
EMU_RUNTIME void sanitizer_resumed(Block& b, Fiber& f) {
#if defined(__SANITIZE_ADDRESS__)
    if (b.from_scheduler) {
        b.from_scheduler = false;
        __sanitizer_finish_switch_fiber(f.fake_stack, &b.sched_stack_bottom, &b.sched_stack_size);
    } else {
        __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
    }
#else
    (void)b;
    (void)f;
#endif
}

EMU_RUNTIME void jump(Context& from, Context& to) {
#if defined(EMU_ASM_FIBERS)
    statebench_emu_switch(&from.sp, to.sp);
#else
    swapcontext(&from.uc, &to.uc);
#endif
}

// Fiber `f` switches to `to` (fiber `next`, or the scheduler when null),
// whose stack is [to_stack, to_stack + to_size); `dying` for its last
// switch. Returns when something switches back to `f`.
EMU_RUNTIME void leave(Block& b, Fiber& f, Context& to, Fiber* next, const void* to_stack,
                       size_t to_size, bool dying) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(dying ? nullptr : &f.fake_stack, to_stack, to_size);
#else
    (void)to_stack;
    (void)to_size;
    (void)dying;
#endif
    cur_fiber = next;
    jump(f.ctx, to);
    cur_fiber = &f;
    sanitizer_resumed(b, f);
}

EMU_RUNTIME void to_scheduler(Block& b, Fiber& f, bool dying) {
#if defined(__SANITIZE_ADDRESS__)
    leave(b, f, b.sched, nullptr, b.sched_stack_bottom, b.sched_stack_size, dying);
#else
    leave(b, f, b.sched, nullptr, nullptr, 0, dying);
#endif
}

// Straight to a sibling fiber, without a trip through the scheduler (half
// the switches of a collective).
EMU_RUNTIME void to_sibling(Block& b, Fiber& f, Fiber& g, bool dying) {
    leave(b, f, g.ctx, &g, g.stack, kStackBytes, dying);
}

// The calling fiber waits (or has exited): the next runnable fiber runs,
// after it in thread order or from where the schedule's generator says;
// when there is none, the scheduler decides.
EMU_RUNTIME void switch_away(bool dying) {
    Block& b = block();
    Fiber& f = self();
    unsigned int k = b.rng ? static_cast<unsigned int>(next_random(b) % b.n) : f.linear + 1;
    for (unsigned int t = 0; t < b.n; ++t, ++k) {
        if (k >= b.n) k -= b.n;
        if (b.fibers[k].state == State::Runnable) {
            to_sibling(b, f, b.fibers[k], dying);
            return;
        }
    }
    to_scheduler(b, f, dying);
}

// From the scheduler into fiber `f`.
EMU_RUNTIME void to_fiber(Block& b, Fiber& f) {
    cur_fiber = &f;
#if defined(__SANITIZE_ADDRESS__)
    b.from_scheduler = true;
    __sanitizer_start_switch_fiber(&b.sched_fake_stack, f.stack, kStackBytes);
#endif
    jump(b.sched, f.ctx);
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(b.sched_fake_stack, nullptr, nullptr);
#endif
    cur_fiber = nullptr;
}

EMU_RUNTIME void start_fiber(Fiber& f) {
#if defined(EMU_ASM_FIBERS)
    // The first switch "returns" into fiber_entry with a 16-byte-aligned
    // stack: below it the return address, six registers, mxcsr and the x87
    // control word, as statebench_emu_switch pops them.
    uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack) + kStackBytes - 16) & ~uintptr_t(15);
    uint64_t* sp = reinterpret_cast<uint64_t*>(top) - 8;
    sp[0] = 0x037F00001F80ull;  // mxcsr (low half), x87 control word (high)
    for (int i = 1; i <= 6; ++i) sp[i] = 0;
    sp[7] = reinterpret_cast<uint64_t>(&statebench_emu_fiber_entry);
    f.ctx.sp = sp;
#else
    getcontext(&f.ctx.uc);
    f.ctx.uc.uc_stack.ss_sp = f.stack;
    f.ctx.uc.uc_stack.ss_size = kStackBytes;
    f.ctx.uc.uc_link = nullptr;
    makecontext(&f.ctx.uc, reinterpret_cast<void (*)()>(&statebench_emu_fiber_main), 0);
#endif
}

// Fiber stacks of this OS thread, kept from block to block: each one has a
// guard page below it so an overflow faults instead of corrupting another.
struct Stacks {
    char** stacks = nullptr;
    unsigned int n = 0;
    EMU_NOCHECK ~Stacks() {
        for (unsigned int i = 0; i < n; ++i) munmap(stacks[i] - 4096, kStackBytes + 4096);
        std::free(stacks);
    }
    EMU_NOCHECK char* get(unsigned int i) {
        if (i >= n) {
            stacks = static_cast<char**>(std::realloc(stacks, sizeof(char*) * (i + 1)));
            for (; n <= i; ++n) {
                void* m = mmap(nullptr, kStackBytes + 4096, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                if (m == MAP_FAILED) fail("no memory for a fiber stack");
                mprotect(m, 4096, PROT_NONE);
                stacks[n] = static_cast<char*>(m) + 4096;
            }
        }
        return stacks[i];
    }
};
inline thread_local Stacks stacks;

// ---------------------------------------------------------------------------
// Errors: the first one of a block stops it; the launch reports it.

EMU_RUNTIME void set_error(Block& b, const char* text) {
    if (b.failed) return;
    b.failed = true;
    if (b.error && b.error_len) {
        std::snprintf(b.error, b.error_len,
                      "kernel %s, block (%u,%u,%u): %s", b.kernel, b.idx.x, b.idx.y, b.idx.z, text);
    }
}

// Ends the block with `text` (which names its threads itself).
[[noreturn]] EMU_RUNTIME void stop(const char* text) {
    Block& b = block();
    set_error(b, text);
    if (cur_fiber) {
        // This fiber never runs again; the scheduler ends the block.
        Fiber& f = *cur_fiber;
        f.state = State::Done;
        to_scheduler(b, f, true);
    }
    std::abort();  // unreachable: errors are raised in fibers only
}

inline void fail(const char* fmt, ...) {
    char text[768];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (cur_fiber) {
        char with[900];
        Fiber& f = *cur_fiber;
        std::snprintf(with, sizeof with, "thread (%u,%u,%u): %s", f.tid.x, f.tid.y, f.tid.z, text);
        stop(with);
    }
    stop(text);
}

// ---------------------------------------------------------------------------
// The race checker's state and reports.

// Where the module is loaded: code addresses are kept as offsets from it.
inline uintptr_t module_base = 0;

EMU_RUNTIME void find_module_base() {
#if EMU_CHECKS
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&find_module_base), &info) && info.dli_fbase) {
        module_base = reinterpret_cast<uintptr_t>(info.dli_fbase);
    }
#endif
}

EMU_RUNTIME int32_t pc_of(const void* return_address) {
    return static_cast<int32_t>(reinterpret_cast<uintptr_t>(return_address) - module_base);
}

#if EMU_CHECKS
// One byte of the shared arena: its last writer (thread, interval, the
// warp's collective count then, where), its readers in the interval
// `r_epoch` (the latest and the one before it, distinct; and whether
// there were more of them and of more than one warp), the largest
// collective count among them.
struct Shadow {
    uint32_t w_epoch, r_epoch;
    uint32_t w_seq, r_seq;
    int32_t w_pc, r_pc, r2_pc;
    uint16_t w_tid, r_tid, r2_tid;
};
constexpr uint16_t kTid = 0x03ff;
constexpr uint16_t kAtomicWrite = 0x8000;  // in w_tid
constexpr uint16_t kReaders = 0x8000;      // in r_tid: two or more readers
constexpr uint16_t kMixedWarps = 0x4000;   // in r_tid: of more than one warp

// Each OS thread's shadow of the arena, never cleared: an entry of an
// older interval than the block's first is one this block never wrote.
struct ShadowMemory {
    Shadow* s = nullptr;
    uint32_t epochs = 0;
    EMU_NOCHECK ~ShadowMemory() { std::free(s); }
};
inline thread_local ShadowMemory shadow_memory;
#endif

enum Access { kRead = 0, kWrite = 1, kAtomic = 2 };

// `file:line` for each of `n` code offsets (into out[i]), from the
// module's line table by addr2line: the innermost frame in a `.cu` file
// (not the emulator's, the shared definitions' or the PTX wrappers'
// headers); `module+0x…` where that cannot be had.
EMU_RUNTIME void locate(const int32_t* pcs, int n, char (*out)[160]) {
    for (int i = 0; i < n; ++i) std::snprintf(out[i], 160, "module+0x%x", pcs[i]);
#if EMU_CHECKS
    Dl_info info;
    if (!dladdr(reinterpret_cast<void*>(&locate), &info) || !info.dli_fname) return;
    const char* slash = std::strrchr(info.dli_fname, '/');
    const char* so = slash ? slash + 1 : info.dli_fname;
    for (int i = 0; i < n; ++i) std::snprintf(out[i], 160, "%s+0x%x", so, pcs[i]);
    char addrs[4][24];
    const char* argv[12] = {"addr2line", "-a", "-f", "-i", "-e", info.dli_fname};
    int argc = 6;
    for (int i = 0; i < n && i < 4; ++i) {
        // A return address: the call is the instruction before it.
        std::snprintf(addrs[i], sizeof addrs[i], "0x%x", pcs[i] - 1);
        argv[argc++] = addrs[i];
    }
    argv[argc] = nullptr;
    int fd[2];
    if (pipe(fd) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    posix_spawn_file_actions_addclose(&fa, fd[1]);
    pid_t pid;
    const int err = posix_spawnp(&pid, "addr2line", &fa, nullptr, const_cast<char* const*>(argv),
                                 environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    static char text[16384];
    size_t len = 0;
    if (err == 0) {
        for (ssize_t r; len + 1 < sizeof text && (r = read(fd[0], text + len, sizeof text - 1 - len)) != 0;) {
            if (r < 0) break;
            len += static_cast<size_t>(r);
        }
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    close(fd[0]);
    text[len] = '\0';
    // Per address: its line ("0x…"), then a function line and a location
    // line per frame, innermost first.
    int at = -1, frame_line = 0;
    bool chosen = false;
    for (char* line = std::strtok(text, "\n"); line; line = std::strtok(nullptr, "\n")) {
        if (line[0] == '0' && line[1] == 'x') {
            ++at;
            frame_line = 0;
            chosen = false;
            continue;
        }
        if (at < 0 || at >= n || (++frame_line % 2) != 0 || chosen) continue;
        if (char* d = std::strstr(line, " (discriminator")) *d = '\0';
        char* colon = std::strrchr(line, ':');
        if (!colon || line[0] == '?' || colon[1] == '?' || colon[1] == '0') continue;
        *colon = '\0';
        const char* base = std::strrchr(line, '/');
        base = base ? base + 1 : line;
        const size_t bl = std::strlen(base);
        const bool header = (bl > 2 && std::strcmp(base + bl - 2, ".h") == 0) ||
                            (bl > 4 && std::strcmp(base + bl - 4, ".cuh") == 0);
        // A header's frame is kept only until a kernel's frame is found.
        std::snprintf(out[at], 160, "%s:%s", base, colon + 1);
        chosen = !header;
    }
#endif
}

EMU_RUNTIME void describe_thread(const Block& b, unsigned int linear, char* out, size_t len) {
    const uint3 t = thread_of(b, linear);
    std::snprintf(out, len, "thread (%u,%u,%u)", t.x, t.y, t.z);
}

// The shared variable holding arena byte `off` (or, in a gap, the one
// before it): its name, first byte and size; whether [off, off + n) lies
// inside it.
struct VarHit {
    const char* name;
    size_t begin;
    size_t size;
};

EMU_RUNTIME bool find_var(const Block& b, size_t off, size_t n, VarHit& h) {
    constexpr size_t kDynamicAt = 64;  // kSharedGap, below
    if (off - kDynamicAt < b.dynamic_bytes) {
        h = VarHit{b.dynamic_name ? b.dynamic_name : "dynamic shared memory", kDynamicAt,
                   b.dynamic_bytes};
        return off + n <= kDynamicAt + b.dynamic_bytes;
    }
    for (int i = 0; i < b.n_vars; ++i) {
        const size_t begin = static_cast<size_t>(static_cast<char*>(b.vars[i].ptr) - b.arena);
        if (off - begin < b.vars[i].size) {
            h = VarHit{b.vars[i].name, begin, b.vars[i].size};
            return off + n <= begin + b.vars[i].size;
        }
    }
    // In a gap: the variable before it.
    h = VarHit{"memory before every variable", 0, 0};
    if (b.dynamic_bytes && off >= kDynamicAt) {
        h = VarHit{b.dynamic_name ? b.dynamic_name : "dynamic shared memory", kDynamicAt,
                   b.dynamic_bytes};
    }
    for (int i = 0; i < b.n_vars; ++i) {
        const size_t begin = static_cast<size_t>(static_cast<char*>(b.vars[i].ptr) - b.arena);
        if (begin <= off && begin >= h.begin) h = VarHit{b.vars[i].name, begin, b.vars[i].size};
    }
    return false;
}

EMU_RUNTIME const char* access_verb(int kind) {
    return kind == kRead ? "read" : kind == kWrite ? "write" : "atomic update";
}

[[noreturn]] __attribute__((noinline, cold)) EMU_RUNTIME void report_shared_bounds(
    Block& b, unsigned int me, size_t off, size_t n, int kind, int32_t pc) {
    VarHit h;
    find_var(b, off, n, h);
    char where[1][160], who[48], text[700];
    locate(&pc, 1, where);
    describe_thread(b, me, who, sizeof who);
    std::snprintf(text, sizeof text,
                  "out-of-bounds %s of %zu bytes at byte %lld of shared %s (%zu bytes) at %s, %s",
                  access_verb(kind), n, static_cast<long long>(off) - static_cast<long long>(h.begin),
                  h.name, h.size, where[0], who);
    stop(text);
}

EMU_RUNTIME void uninit_shared_text(Block& b, unsigned int me, size_t off, int32_t pc, char* text,
                                    size_t len) {
    VarHit h;
    find_var(b, off, 1, h);
    char where[1][160], who[48];
    locate(&pc, 1, where);
    describe_thread(b, me, who, sizeof who);
    std::snprintf(text, len,
                  "uninitialized read of shared %s (byte %zu of %zu) at %s, %s: no thread of the "
                  "block wrote it",
                  h.name, off - h.begin, h.size, where[0], who);
}

[[noreturn]] __attribute__((noinline, cold)) EMU_RUNTIME void report_uninit_shared(
    Block& b, unsigned int me, size_t off, int32_t pc) {
    char text[700];
    uninit_shared_text(b, me, off, pc, text, sizeof text);
    stop(text);
}

// `me` makes access `kind` at `pc` of a byte thread `other` read or wrote
// (`other_wrote`) at `other_pc` in this barrier interval.
[[noreturn]] __attribute__((noinline, cold)) EMU_RUNTIME void report_race(
    Block& b, unsigned int me, size_t off, int kind, int32_t pc, unsigned int other,
    bool other_wrote, int32_t other_pc) {
    VarHit h;
    find_var(b, off, 1, h);
    const int32_t pcs[2] = {pc, other_pc};
    char where[2][160], who[48], whom[48], text[760];
    locate(pcs, 2, where);
    describe_thread(b, me, who, sizeof who);
    describe_thread(b, other, whom, sizeof whom);
    std::snprintf(text, sizeof text,
                  "race on shared %s (byte %zu of %zu): %s %s at %s what %s %s at %s in the same "
                  "barrier interval",
                  h.name, off - h.begin, h.size, who,
                  kind == kRead ? "reads" : kind == kWrite ? "writes" : "atomically updates",
                  where[0], whom, other_wrote ? "wrote" : "read", where[1]);
    stop(text);
}

// Thread `me`'s access of `n` bytes at `a` in allocation `d`: out of its
// bounds, or reading byte `clear`, which nothing wrote.
[[noreturn]] __attribute__((noinline, cold)) EMU_RUNTIME void report_device(
    Block& b, unsigned int me, const DeviceAllocation& d, uintptr_t a, size_t n, int kind,
    int32_t pc, bool bounds, uint64_t clear) {
    char where[1][160], who[48], text[700], unwritten[64] = "";
    locate(&pc, 1, where);
    describe_thread(b, me, who, sizeof who);
    const long long off = static_cast<long long>(a) - static_cast<long long>(d.base);
    if (!bounds && clear != static_cast<uint64_t>(off)) {
        std::snprintf(unwritten, sizeof unwritten, " (byte %llu unwritten)",
                      static_cast<unsigned long long>(clear));
    }
    std::snprintf(text, sizeof text,
                  "%s %s of %zu bytes at device allocation 0x%llx %c %lld%s (of %llu bytes) at %s, "
                  "%s",
                  bounds ? "out-of-bounds" : "uninitialized", access_verb(kind), n, d.base,
                  off < 0 ? '-' : '+', off < 0 ? -off : off, unwritten, d.size, where[0], who);
    stop(text);
}

#if EMU_CHECKS
// Whether lane `a` of warp `warp`, which made an access when the warp had
// completed `a_seq` collectives, and lane `me` met at a collective since.
EMU_RUNTIME bool joined(const Block& b, unsigned int a, uint32_t a_seq, unsigned int me) {
    if (a / 32 != me / 32) return false;
    const WarpMeet& w = b.warps[me / 32];
    if (w.full_seq > a_seq) return true;
    const unsigned int both = (1u << (a % 32)) | (1u << (me % 32));
    for (int i = 0; i < kRecentCollectives; ++i) {
        if (w.recent_seq[i] > a_seq && (w.recent_mask[i] & both) == both) return true;
    }
    return false;
}

// Thread `me`'s access to arena bytes [off, off + n).
EMU_RUNTIME void shared_access(Block& b, unsigned int me, size_t off, size_t n, int kind,
                               int32_t pc) {
    VarHit h;
    if (!find_var(b, off, n, h)) report_shared_bounds(b, me, off, n, kind, pc);
    Shadow* s = b.shadow->s + off;
    const uint32_t cur = b.epoch;
    const uint32_t seq = b.warps[me / 32].seq;
    for (size_t i = 0; i < n; ++i) {
        Shadow& e = s[i];
        const unsigned int writer = e.w_tid & kTid;
        if (kind != kWrite && e.w_epoch < b.first_epoch && !b.uninit_pending) {
            b.uninit_pending = true;
            b.uninit_off = off + i;
            b.uninit_tid = me;
            b.uninit_pc = pc;
        }
        if (e.w_epoch == cur && writer != me &&
            !(kind == kAtomic && (e.w_tid & kAtomicWrite)) && !joined(b, writer, e.w_seq, me)) {
            report_race(b, me, off + i, kind, pc, writer, true, e.w_pc);
        }
        if (kind == kRead) {
            if (e.r_epoch != cur) {
                e.r_epoch = cur;
                e.r_tid = static_cast<uint16_t>(me);
                e.r_seq = seq;
                e.r_pc = pc;
            } else if ((e.r_tid & kTid) == me) {
                e.r_seq = seq > e.r_seq ? seq : e.r_seq;
                e.r_pc = pc;
            } else {
                const unsigned int last = e.r_tid & kTid;
                uint16_t flags = static_cast<uint16_t>((e.r_tid & kMixedWarps) | kReaders);
                if (last / 32 != me / 32) flags |= kMixedWarps;
                e.r2_tid = static_cast<uint16_t>(last);
                e.r2_pc = e.r_pc;
                e.r_tid = static_cast<uint16_t>(me | flags);
                e.r_pc = pc;
                e.r_seq = seq > e.r_seq ? seq : e.r_seq;
            }
            continue;
        }
        if (e.r_epoch == cur) {
            const unsigned int last = e.r_tid & kTid;
            if (!(e.r_tid & kReaders)) {
                if (last != me && !joined(b, last, e.r_seq, me)) {
                    report_race(b, me, off + i, kind, pc, last, false, e.r_pc);
                }
            } else {
                // Readers of one warp, this thread's: a collective of the
                // whole warp since the last of them. Of more warps: a race.
                const WarpMeet& w = b.warps[me / 32];
                if ((e.r_tid & kMixedWarps) || last / 32 != me / 32 || w.full_seq <= e.r_seq) {
                    const bool latest = last != me;
                    report_race(b, me, off + i, kind, pc, latest ? last : e.r2_tid, false,
                                latest ? e.r_pc : e.r2_pc);
                }
            }
        }
        e.w_epoch = cur;
        e.w_tid = static_cast<uint16_t>(me | (kind == kAtomic ? kAtomicWrite : 0));
        e.w_seq = seq;
        e.w_pc = pc;
        e.r_epoch = 0;
    }
}

// Bits [off, off + n) of a device allocation's written-bytes map: whether
// all are set (else the first clear one in `*clear`), or set them all.
EMU_RUNTIME bool all_written(const unsigned long long* bits, uint64_t off, uint64_t n,
                             uint64_t* clear) {
    for (uint64_t i = off, end = off + n; i < end;) {
        const uint64_t w = i / 64, lo = i % 64;
        const uint64_t take = end - i < 64 - lo ? end - i : 64 - lo;
        const unsigned long long want = (take == 64 ? ~0ull : ((1ull << take) - 1)) << lo;
        if ((bits[w] & want) != want) {
            *clear = i + __builtin_ctzll(~bits[w] & want) - lo;
            return false;
        }
        i += take;
    }
    return true;
}
EMU_RUNTIME void set_written(unsigned long long* bits, uint64_t off, uint64_t n) {
    for (uint64_t i = off, end = off + n; i < end;) {
        const uint64_t w = i / 64, lo = i % 64;
        const uint64_t take = end - i < 64 - lo ? end - i : 64 - lo;
        bits[w] |= (take == 64 ? ~0ull : ((1ull << take) - 1)) << lo;
        i += take;
    }
}

// The allocation whose host block (redzones included) holds `a`, if any.
EMU_RUNTIME const DeviceAllocation* find_allocation(Block& b, uintptr_t a) {
    const DeviceAllocation* last = b.last_alloc;
    if (last && a - last->lo < last->hi - last->lo) return last;
    unsigned long lo = 0, hi = b.n_allocs;
    while (lo < hi) {
        const unsigned long mid = (lo + hi) / 2;
        if (b.allocs[mid].lo <= a) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo == 0 || a >= b.allocs[lo - 1].hi) return nullptr;
    b.last_alloc = &b.allocs[lo - 1];
    return b.last_alloc;
}

EMU_RUNTIME void device_access(Block& b, unsigned int me, uintptr_t a, size_t n, int kind,
                               int32_t pc) {
    const DeviceAllocation* d = find_allocation(b, a);
    if (!d) return;  // host memory: not the device's
    if (a < d->base || a + n > d->base + d->size) report_device(b, me, *d, a, n, kind, pc, true, 0);
    const uint64_t off = a - d->base;
    if (kind != kWrite) {
        uint64_t clear;
        if (!all_written(d->init, off, n, &clear)) {
            report_device(b, me, *d, a, n, kind, pc, false, clear);
        }
    }
    if (kind != kRead) set_written(d->init, off, n);
}

// An access of thread `me` to [p, p + n): shared memory, device memory or
// neither (a fiber's stack, the host's memory), which is not checked.
__attribute__((always_inline)) EMU_RUNTIME void check_as(unsigned int me, const void* p, size_t n,
                                                         int kind, int32_t pc) {
    Block* b = cur_block;
    Fiber* f = cur_fiber;
    if (!b || !f || n == 0) return;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uintptr_t off = a - reinterpret_cast<uintptr_t>(b->arena);
    if (off < b->arena_cap) {
        shared_access(*b, me, off, n, kind, pc);
        return;
    }
    if (a - reinterpret_cast<uintptr_t>(f->stack) < kStackBytes) return;
    if (a - b->dev_lo < b->dev_span) device_access(*b, me, a, n, kind, pc);
}

__attribute__((always_inline)) EMU_RUNTIME void check(const void* p, size_t n, int kind,
                                                      int32_t pc) {
    if (Fiber* f = cur_fiber) check_as(f->linear, p, n, kind, pc);
}
#endif

// The end of a barrier interval: a pending uninitialized read is reported
// (no other thread wrote the byte in the interval, or that was a race);
// the next interval begins.
EMU_RUNTIME void end_interval(Block& b) {
#if EMU_CHECKS
    if (b.uninit_pending && !b.failed) {
        b.uninit_pending = false;
        report_uninit_shared(b, b.uninit_tid, b.uninit_off, b.uninit_pc);
    }
    b.epoch = ++b.shadow->epochs;
#else
    (void)b;
#endif
}

// ---------------------------------------------------------------------------
// Barriers.

EMU_RUNTIME void release_barrier(Block& b) {
    end_interval(b);
    for (unsigned int i = 0; i < b.n; ++i) {
        if (b.fibers[i].state == State::Barrier) b.fibers[i].state = State::Runnable;
    }
    b.barrier_arrived = 0;
}

EMU_RUNTIME void syncthreads(const char* file, int line) {
    Block& b = block();
    Fiber& f = self();
    if (b.barrier_arrived > 0 && (line != b.barrier_line || std::strcmp(file, b.barrier_site) != 0)) {
        fail("__syncthreads at %s:%d while other threads wait at %s:%d (divergent barrier)", file,
             line, b.barrier_site, b.barrier_line);
    }
    b.barrier_site = file;
    b.barrier_line = line;
    f.wait_site = file;
    f.wait_line = line;
    if (++b.barrier_arrived == b.live) {
        release_barrier(b);
        return;
    }
    f.state = State::Barrier;
    switch_away(false);
}

// ---------------------------------------------------------------------------
// Warp collectives.

EMU_RUNTIME unsigned int lane_id() { return self().linear % 32; }

EMU_RUNTIME WarpMeet& my_warp() { return block().warps[self().linear / 32]; }

// Joins this lane to its warp's collective `op`: `fill` stores the lane's
// operands in the meeting, `compute` runs once, in the last lane to arrive,
// over all of them. Returns when every lane of `mask` has arrived. Lanes
// of a warp in different branches may each be at a collective of their
// own mask at once; one mask at two different collectives is an error.
template <class Fill, class Compute>
EMU_RUNTIME void warp_collective(WarpOp op, unsigned int mask, const char* file, int line, Fill fill,
                            Compute compute) {
    Block& b = block();
    Fiber& f = self();
    const unsigned int lane = f.linear % 32;
    const unsigned int first = (f.linear / 32) * 32;
    WarpMeet& w = b.warps[f.linear / 32];
    if (!(mask >> lane & 1u)) {
        fail("warp collective at %s:%d: mask 0x%08x does not name the calling lane %u", file, line,
             mask, lane);
    }
    if (mask & ~w.lanes) {
        fail("warp collective at %s:%d: mask 0x%08x names lanes the block does not have", file,
             line, mask);
    }
    if (mask & w.exited) {
        fail("warp collective at %s:%d: lane %d of mask 0x%08x has exited", file, line,
             __builtin_ctz(mask & w.exited), mask);
    }
    Meeting* m = nullptr;
    Meeting* free_slot = nullptr;
    for (Meeting& o : w.open) {
        if (o.op == WarpOp::None) {
            if (!free_slot) free_slot = &o;
        } else if (o.mask == mask) {
            m = &o;
        }
    }
    if (m && m->op != op) {
        fail("lanes of warp %u meet at different warp collectives (%s:%d with mask 0x%08x, %s:%d "
             "with mask 0x%08x)",
             f.linear / 32, file, line, mask, m->site, m->line, m->mask);
    }
    if (!m) {
        if (!free_slot) {
            fail("warp collective at %s:%d: more than %d collectives of warp %u open at once", file,
                 line, kOpenCollectives, f.linear / 32);
        }
        m = free_slot;
        *m = Meeting{op, mask, 0, file, line, 32, 0};
    }
    fill(w, lane);
    // What the lanes' fills say of the whole collective, kept with it.
    m->width = w.width;
    m->count = w.count;
    m->arrived |= 1u << lane;
    f.wait_site = file;
    f.wait_line = line;
    if (m->arrived == mask) {
        w.op = op;
        w.mask = mask;
        w.width = m->width;
        w.count = m->count;
        compute(w);
        m->op = WarpOp::None;
        // For the race checker: these lanes met, after everything each
        // did before it.
        ++w.seq;
        if (mask == w.lanes) w.full_seq = w.seq;
        w.recent_seq[w.seq % kRecentCollectives] = w.seq;
        w.recent_mask[w.seq % kRecentCollectives] = mask;
        for (unsigned int rest = mask & ~(1u << lane); rest; rest &= rest - 1) {
            b.fibers[first + __builtin_ctz(rest)].state = State::Runnable;
        }
        return;
    }
    f.state = State::Warp;
    switch_away(false);
}

template <class T>
EMU_RUNTIME uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp operands are at most 64 bits");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T>
EMU_RUNTIME T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}

// One shuffle: `arg` is the lane's srcLane, delta or lane mask.
template <class T>
EMU_RUNTIME T shuffle(WarpOp op, unsigned int mask, T v, int arg, int width, const char* file,
                 int line) {
    if (width <= 0 || width > 32 || (width & (width - 1))) {
        fail("shuffle at %s:%d: width %d is not a power of two up to 32", file, line, width);
    }
    const unsigned int lane = lane_id();
    warp_collective(
        op, mask, file, line,
        [&](WarpMeet& w, unsigned int l) EMU_NOCHECK {
            w.value[l] = to_bits(v);
            w.arg[l] = arg;
            w.width = width;
        },
        [&](WarpMeet& w) EMU_NOCHECK {
            for (unsigned int l = 0; l < 32; ++l) {
                if (!(w.mask >> l & 1u)) continue;
                const int wd = w.width;
                const int base = l & ~(wd - 1);
                const int a = static_cast<int>(w.arg[l]);
                int src = l;
                switch (w.op) {
                    case WarpOp::Shfl: src = base + (a & (wd - 1)); break;
                    case WarpOp::ShflUp: src = (int)(l - base) >= a ? (int)l - a : (int)l; break;
                    case WarpOp::ShflDown: src = (int)(l - base) + a < wd ? (int)l + a : (int)l; break;
                    case WarpOp::ShflXor: {
                        const int s = (int)l ^ a;
                        src = s < base + wd ? s : (int)l;
                        break;
                    }
                    default: break;
                }
                // CUDA leaves a read of a lane outside the mask undefined;
                // the emulator refuses it.
                w.bad[l] = src < 0 || src > 31 || !(w.mask >> src & 1u);
                w.result[l] = w.bad[l] ? 0 : w.value[src];
            }
        });
    WarpMeet& w = my_warp();
    if (w.bad[lane]) {
        fail("shuffle at %s:%d: lane %u reads a lane outside mask 0x%08x", file, line, lane, mask);
    }
    return from_bits<T>(w.result[lane]);
}

EMU_RUNTIME unsigned int vote(WarpOp op, unsigned int mask, int pred, const char* file, int line) {
    const unsigned int lane = lane_id();
    warp_collective(
        op, mask, file, line, [&](WarpMeet& w, unsigned int l) EMU_NOCHECK { w.value[l] = pred != 0; },
        [&](WarpMeet& w) EMU_NOCHECK {
            unsigned int ballot = 0;
            for (unsigned int l = 0; l < 32; ++l) {
                if ((w.mask >> l & 1u) && w.value[l]) ballot |= 1u << l;
            }
            // Only the mask's lanes: others may not have read their last result.
            for (unsigned int rest = w.mask; rest; rest &= rest - 1) {
                w.result[__builtin_ctz(rest)] = ballot;
            }
        });
    return static_cast<unsigned int>(my_warp().result[lane]);
}

// ---------------------------------------------------------------------------
// Shared memory.

constexpr size_t kSharedGap = 64;  // unused bytes after each shared variable (poisoned under ASan)
static_assert(kSharedGap == 64, "find_var's dynamic part starts after one gap");

// Static and dynamic shared memory of a block together (an sm_80's opt-in
// maximum).
EMU_RUNTIME size_t shared_limit() { return 163 * 1024; }

EMU_RUNTIME void* shared_alloc(Block& b, size_t bytes, size_t align) {
    size_t at = (b.arena_used + align - 1) & ~(align - 1);
    if (at + bytes + kSharedGap > b.arena_cap) {
        fail("more than %zu bytes of shared memory", shared_limit());
    }
    void* p = b.arena + at;
    EMU_UNPOISON(p, bytes);
    std::memset(p, 0xff, bytes);
    b.arena_used = at + bytes + kSharedGap;
    return p;
}

// The block's instance of the `__shared__` variable `name` declared at
// site `id`.
template <class T>
EMU_RUNTIME T& shared(int id, const char* name) {
    Block& b = block();
    for (int i = 0; i < b.n_vars; ++i) {
        if (b.vars[i].id == id) return *static_cast<T*>(b.vars[i].ptr);
    }
    if (b.n_vars == 64) fail("more than 64 __shared__ variables");
    void* p = shared_alloc(b, sizeof(T), alignof(T) < 16 ? 16 : alignof(T));
    b.vars[b.n_vars++] = SharedVar{id, p, name, sizeof(T)};
    return *static_cast<T*>(p);
}

EMU_RUNTIME void* dynamic_shared(const char* name) {
    Block& b = block();
    if (!b.dynamic_name) b.dynamic_name = name;
    return b.arena + kSharedGap;
}

// Whether `p` points into the block's shared memory.
EMU_RUNTIME bool in_shared(const Block& b, const void* p) {
    return static_cast<size_t>(static_cast<const char*>(p) - b.arena) < b.arena_cap;
}

// ---------------------------------------------------------------------------
// cp.async: copies are recorded and happen when their group is waited for.
// For the race checker a copy writes its shared bytes (all of them: the
// zero-filled ones too) both when it is issued and when it is waited for,
// as the issuing thread: the copy lands somewhere between the two.

__attribute__((noinline)) EMU_BEHALF void cp_async(void* dst, const void* src, unsigned int bytes,
                                                   unsigned int src_bytes) {
    const int32_t pc = pc_of(__builtin_return_address(0));
    Fiber& f = self();
    if (f.n_copies == f.cap_copies) {
        f.cap_copies = f.cap_copies ? 2 * f.cap_copies : 16;
        f.copies = static_cast<AsyncCopy*>(std::realloc(f.copies, sizeof(AsyncCopy) * f.cap_copies));
    }
    if (reinterpret_cast<uintptr_t>(dst) % bytes || reinterpret_cast<uintptr_t>(src) % bytes) {
        fail("cp.async of %u bytes from %p to %p: both addresses must be %u-byte aligned", bytes,
             src, dst, bytes);
    }
    if (!in_shared(block(), dst)) {
        fail("cp.async of %u bytes to %p: the destination is not shared memory", bytes, dst);
    }
#if EMU_CHECKS
    check(src, src_bytes < bytes ? src_bytes : bytes, kRead, pc);
    check(dst, bytes, kWrite, pc);
#endif
    f.copies[f.n_copies++] = AsyncCopy{dst, src, bytes, src_bytes, f.open_group, pc};
}

EMU_RUNTIME void cp_async_commit() { self().open_group++; }

// Completes every committed group but the newest `pending` ones (uncommitted
// copies wait for a later commit).
__attribute__((noinline)) EMU_BEHALF void cp_async_wait(int pending) {
    Fiber& f = self();
    const int upto = f.open_group - pending;  // groups < upto complete
    int kept = 0;
    for (int i = 0; i < f.n_copies; ++i) {
        AsyncCopy& c = f.copies[i];
        if (c.group < upto) {
            const unsigned int n = c.src_bytes < c.bytes ? c.src_bytes : c.bytes;
            std::memcpy(c.dst, c.src, n);
            std::memset(static_cast<char*>(c.dst) + n, 0, c.bytes - n);
#if EMU_CHECKS
            check(c.dst, c.bytes, kWrite, c.pc);
#endif
        } else {
            f.copies[kept++] = c;
        }
    }
    f.n_copies = kept;
}

// ---------------------------------------------------------------------------
// ldmatrix and mma.sync, by the PTX ISA's fragment layouts.

EMU_RUNTIME uint16_t lo16(uint32_t r) { return static_cast<uint16_t>(r & 0xffff); }
EMU_RUNTIME uint16_t hi16(uint32_t r) { return static_cast<uint16_t>(r >> 16); }
EMU_RUNTIME uint32_t pack16(uint16_t lo, uint16_t hi) {
    return lo | (static_cast<uint32_t>(hi) << 16);
}

// ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16: lanes 8i..8i+7
// give the row addresses of matrix i (16-byte rows of shared memory, 16-byte
// aligned); lane l gets, of each matrix, row l/4, columns 2(l%4) and
// 2(l%4)+1 (with .trans: column l/4, rows 2(l%4), +1). Each row is read by
// the lane that gave its address.
__attribute__((noinline)) EMU_BEHALF void ldmatrix(uint32_t* out, int count, bool trans,
                                                   const void* row_addr, const char* file,
                                                   int line) {
    const int32_t pc = pc_of(__builtin_return_address(0));
    const unsigned int lane = lane_id();
    if (lane < 8u * count) {
        if (!in_shared(block(), row_addr)) {
            fail("ldmatrix at %s:%d: the row address %p is not shared memory", file, line,
                 row_addr);
        }
        if (reinterpret_cast<uintptr_t>(row_addr) % 16) {
            fail("ldmatrix at %s:%d: the row address %p is not 16-byte aligned", file, line,
                 row_addr);
        }
    }
    warp_collective(
        WarpOp::LdMatrix, 0xffffffffu, file, line,
        [&](WarpMeet& w, unsigned int l) EMU_NOCHECK {
            w.addr[l] = row_addr;
            w.pc[l] = pc;
            w.count = count;
            w.width = trans;
        },
        [&](WarpMeet& w) __attribute__((no_sanitize("thread"))) {
#if EMU_CHECKS
            const unsigned int first = self().linear / 32 * 32;
            for (int r = 0; r < 8 * w.count; ++r) {
                check_as(first + r, w.addr[r], 16, kRead, w.pc[r]);
            }
#endif
            for (int m = 0; m < w.count; ++m) {
                for (unsigned int l = 0; l < 32; ++l) {
                    const int r = l / 4, c = 2 * (l % 4);
                    uint16_t e0, e1;
                    if (!w.width) {
                        const uint16_t* row = static_cast<const uint16_t*>(w.addr[8 * m + r]);
                        e0 = row[c];
                        e1 = row[c + 1];
                    } else {
                        e0 = static_cast<const uint16_t*>(w.addr[8 * m + c])[r];
                        e1 = static_cast<const uint16_t*>(w.addr[8 * m + c + 1])[r];
                    }
                    w.regs[l][m] = pack16(e0, e1);
                }
            }
        });
    for (int m = 0; m < count; ++m) out[m] = my_warp().regs[lane][m];
}

EMU_RUNTIME float bf16_bits_to_float(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, lane l with g = l/4,
// t = l%4: a = {A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]},
// b = {B[2t..][g], B[2t+8..][g]}, c and d = {C[g][2t], C[g][2t+1],
// C[g+8][2t], C[g+8][2t+1]}; each register holds the lower index in its
// low half.
EMU_RUNTIME void mma_bf16_m16n8k16(float* d, const uint32_t* a, const uint32_t* b, const float* c,
                              const char* file, int line) {
    const unsigned int lane = lane_id();
    warp_collective(
        WarpOp::Mma, 0xffffffffu, file, line,
        [&](WarpMeet& w, unsigned int l) EMU_NOCHECK {
            for (int i = 0; i < 4; ++i) w.mma_a[l][i] = a[i];
            for (int i = 0; i < 2; ++i) w.mma_b[l][i] = b[i];
            for (int i = 0; i < 4; ++i) w.mma_c[l][i] = c[i];
        },
        [&](WarpMeet& w) EMU_NOCHECK {
            float A[16][16], B[16][8], C[16][8];
            for (int l = 0; l < 32; ++l) {
                const int g = l / 4, t = l % 4;
                const uint32_t* ra = w.mma_a[l];
                A[g][2 * t] = bf16_bits_to_float(lo16(ra[0]));
                A[g][2 * t + 1] = bf16_bits_to_float(hi16(ra[0]));
                A[g + 8][2 * t] = bf16_bits_to_float(lo16(ra[1]));
                A[g + 8][2 * t + 1] = bf16_bits_to_float(hi16(ra[1]));
                A[g][2 * t + 8] = bf16_bits_to_float(lo16(ra[2]));
                A[g][2 * t + 9] = bf16_bits_to_float(hi16(ra[2]));
                A[g + 8][2 * t + 8] = bf16_bits_to_float(lo16(ra[3]));
                A[g + 8][2 * t + 9] = bf16_bits_to_float(hi16(ra[3]));
                const uint32_t* rb = w.mma_b[l];
                B[2 * t][g] = bf16_bits_to_float(lo16(rb[0]));
                B[2 * t + 1][g] = bf16_bits_to_float(hi16(rb[0]));
                B[2 * t + 8][g] = bf16_bits_to_float(lo16(rb[1]));
                B[2 * t + 9][g] = bf16_bits_to_float(hi16(rb[1]));
                C[g][2 * t] = w.mma_c[l][0];
                C[g][2 * t + 1] = w.mma_c[l][1];
                C[g + 8][2 * t] = w.mma_c[l][2];
                C[g + 8][2 * t + 1] = w.mma_c[l][3];
            }
            float D[16][8];
            for (int i = 0; i < 16; ++i) {
                for (int j = 0; j < 8; ++j) {
                    double s = C[i][j];
                    for (int k = 0; k < 16; ++k) s += static_cast<double>(A[i][k]) * B[k][j];
                    D[i][j] = static_cast<float>(s);
                }
            }
            for (int l = 0; l < 32; ++l) {
                const int g = l / 4, t = l % 4;
                w.mma_d[l][0] = D[g][2 * t];
                w.mma_d[l][1] = D[g][2 * t + 1];
                w.mma_d[l][2] = D[g + 8][2 * t];
                w.mma_d[l][3] = D[g + 8][2 * t + 1];
            }
        });
    for (int i = 0; i < 4; ++i) d[i] = my_warp().mma_d[lane][i];
}

// ---------------------------------------------------------------------------
// Running a grid.

// The scheduler of one block: runs fibers, each until it waits or exits,
// until all have exited or none can go on.
EMU_RUNTIME void run_block(Block& b) {
    for (unsigned int i = 0; i < b.n; ++i) {
        Fiber& f = b.fibers[i];
        f.state = State::Runnable;
        f.n_copies = 0;
#if defined(__SANITIZE_ADDRESS__)
        f.fake_stack = nullptr;  // the last block's was destroyed with its final switch
#endif
        f.open_group = 0;
        f.stack = stacks.get(i);
        start_fiber(f);
    }
    for (unsigned int w = 0; w < b.n_warps; ++w) {
        WarpMeet& m = b.warps[w];
        const unsigned int in_warp = b.n - 32 * w < 32 ? b.n - 32 * w : 32;
        for (Meeting& o : m.open) o.op = WarpOp::None;
        m.lanes = in_warp == 32 ? 0xffffffffu : (1u << in_warp) - 1;
        m.exited = 0;
        m.seq = 0;
        m.full_seq = 0;
        std::memset(m.recent_seq, 0, sizeof m.recent_seq);
    }
    b.live = b.n;
    b.barrier_arrived = 0;
    b.n_vars = 0;
    b.dynamic_name = nullptr;
#if EMU_CHECKS
    ShadowMemory& sm = *b.shadow;
    if (sm.epochs > 0xf0000000u) {
        // Interval numbers run out after billions of barriers: start over.
        std::memset(sm.s, 0, sizeof(Shadow) * b.arena_cap);
        sm.epochs = 0;
    }
    b.first_epoch = b.epoch = ++sm.epochs;
    b.uninit_pending = false;
    b.last_alloc = nullptr;
#endif
    // [gap][dynamic part][gap][static variables, each followed by a gap]
    b.arena_used = kSharedGap + b.dynamic_bytes + kSharedGap;
    EMU_POISON(b.arena, b.arena_cap);
    EMU_UNPOISON(b.arena + kSharedGap, b.dynamic_bytes);
    std::memset(b.arena + kSharedGap, 0xff, b.dynamic_bytes);
    unsigned int next = 0;
    while (!b.failed) {
        if (b.rng) next = static_cast<unsigned int>(next_random(b) % b.n);
        unsigned int tried = 0;
        while (tried < b.n && b.fibers[next].state != State::Runnable) {
            next = next + 1 < b.n ? next + 1 : 0;
            ++tried;
        }
        if (tried == b.n) break;
        to_fiber(b, b.fibers[next]);
    }
    if (b.failed) return;
    if (b.live > 0) {
        // Nobody can go on: say who waits where, one group per wait.
        struct Group {
            State state;
            const char* site;
            int line;
            unsigned int first, count;
        } groups[4];
        int n_groups = 0;
        unsigned int others = 0;
        for (unsigned int i = 0; i < b.n; ++i) {
            Fiber& f = b.fibers[i];
            if (f.state == State::Done) continue;
            int g = 0;
            while (g < n_groups && !(groups[g].state == f.state && groups[g].line == f.wait_line &&
                                     std::strcmp(groups[g].site, f.wait_site) == 0)) {
                ++g;
            }
            if (g == n_groups) {
                if (n_groups == 4) {
                    ++others;
                    continue;
                }
                groups[n_groups++] = Group{f.state, f.wait_site, f.wait_line, f.linear, 0};
            }
            groups[g].count++;
        }
        char text[600];
        int at = std::snprintf(text, sizeof text, "deadlock: %u of %u threads can never go on:",
                               b.live, b.n);
        for (int g = 0; g < n_groups && at < (int)sizeof text; ++g) {
            at += std::snprintf(text + at, sizeof text - at, " %u (from thread %u) wait at %s %s:%d;",
                                groups[g].count, groups[g].first,
                                groups[g].state == State::Barrier ? "__syncthreads" : "a warp collective",
                                groups[g].site, groups[g].line);
        }
        if (at < (int)sizeof text) {
            std::snprintf(text + at, sizeof text - at, " %u elsewhere, %u exited", others,
                          b.n - b.live);
        }
        set_error(b, text);
        return;
    }
#if EMU_CHECKS
    if (b.uninit_pending) {
        // The last interval's: every thread has exited, none wrote it.
        char text[700];
        uninit_shared_text(b, b.uninit_tid, b.uninit_off, b.uninit_pc, text, sizeof text);
        set_error(b, text);
    }
#endif
}

extern "C" EMU_NOCHECK void statebench_emu_fiber_main() {
    Block& b = *cur_block;
    Fiber& f = *cur_fiber;
    sanitizer_resumed(b, f);
    b.body(b.body_ctx);
    if (f.n_copies) {
        // Copies never waited for are lost on a GPU too; say so.
        fail("exited with %d cp.async copies never waited for", f.n_copies);
    }
    f.state = State::Done;
    b.warps[f.linear / 32].exited |= 1u << (f.linear % 32);
    if (--b.live > 0 && b.barrier_arrived == b.live) release_barrier(b);
    switch_away(true);
    std::abort();
}

template <class Kernel, class... Args, size_t... I>
EMU_RUNTIME void call_kernel(Kernel k, void** params, std::index_sequence<I...>) {
    k(*static_cast<Args*>(params[I])...);
}

template <class... Args>
struct Invocation {
    void (*kernel)(Args...);
    void** params;
    EMU_NOCHECK static void run(void* self) {
        auto* inv = static_cast<Invocation*>(self);
        call_kernel<void (*)(Args...), Args...>(inv->kernel, inv->params,
                                                std::index_sequence_for<Args...>{});
    }
};

// Runs every block of a launch on the calling OS thread, in the order the
// seed gives (a permutation i -> (a·i + c) mod blocks). Returns 0, or 1
// with the first error in `error`.
template <class... Args>
EMU_RUNTIME int launch(const char* name, void (*kernel)(Args...), const LaunchConfig* c,
                       void** params, char* error, size_t error_len) {
    Invocation<Args...> inv{kernel, params};
    Block b;
    b.kernel = name;
    b.dim = dim3{c->block[0], c->block[1], c->block[2]};
    b.grid = dim3{c->grid[0], c->grid[1], c->grid[2]};
    b.n = c->block[0] * c->block[1] * c->block[2];
    b.n_warps = (b.n + 31) / 32;
    b.dynamic_bytes = c->shared_bytes;
    b.arena_cap = shared_limit() + 66 * kSharedGap;
    b.error = error;
    b.error_len = error_len;
    b.body = &Invocation<Args...>::run;
    b.body_ctx = &inv;
#if EMU_CHECKS
    if (!module_base) find_module_base();
    ShadowMemory& sm = shadow_memory;
    if (!sm.s) sm.s = static_cast<Shadow*>(std::calloc(b.arena_cap, sizeof(Shadow)));
    if (!sm.s) {
        std::snprintf(error, error_len, "kernel %s: no host memory for the race checker", name);
        return 1;
    }
    b.shadow = &sm;
    b.allocs = c->allocations;
    b.n_allocs = c->allocations ? c->n_allocations : 0;
    if (b.n_allocs) {
        b.dev_lo = b.allocs[0].lo;
        uintptr_t hi = 0;
        for (unsigned long i = 0; i < b.n_allocs; ++i) hi = b.allocs[i].hi > hi ? b.allocs[i].hi : hi;
        b.dev_span = hi - b.dev_lo;
    }
#endif
    b.fibers = new (std::nothrow) Fiber[b.n];
    b.warps = new (std::nothrow) WarpMeet[b.n_warps];
    b.arena = static_cast<char*>(std::aligned_alloc(128, b.arena_cap));
    if (!b.fibers || !b.warps || !b.arena) {
        std::snprintf(error, error_len, "kernel %s: no host memory for a block", name);
        delete[] b.fibers;
        delete[] b.warps;
        std::free(b.arena);
        return 1;
    }
    for (unsigned int z = 0; z < b.dim.z; ++z) {
        for (unsigned int y = 0; y < b.dim.y; ++y) {
            for (unsigned int x = 0; x < b.dim.x; ++x) {
                const unsigned int i = x + b.dim.x * (y + b.dim.y * z);
                b.fibers[i].tid = uint3{x, y, z};
                b.fibers[i].linear = i;
            }
        }
    }
    const uint64_t gx = b.grid.x, gxy = gx * b.grid.y, blocks = gxy * b.grid.z;
    uint64_t name_hash = 1469598103934665603ull;
    for (const char* p = name; *p; ++p) name_hash = (name_hash ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
    uint64_t stride = 1, offset = 0;
    if (c->seed && blocks > 1) {
        const uint64_t r = mix64(c->seed ^ mix64(name_hash));
        offset = r % blocks;
        stride = 1 + (r >> 17) % (blocks - 1);
        while (std::gcd(stride, blocks) != 1) stride = stride + 1 < blocks ? stride + 1 : 1;
    }
    Block* outer = cur_block;
    cur_block = &b;
    for (uint64_t i = 0; i < blocks && !b.failed; ++i) {
        const uint64_t j = static_cast<uint64_t>(
            (static_cast<unsigned __int128>(stride) * i + offset) % blocks);
        b.idx = uint3{static_cast<unsigned int>(j % gx), static_cast<unsigned int>(j % gxy / gx),
                      static_cast<unsigned int>(j / gxy)};
        // Each block's own stream of choices: the same whatever ran before.
        b.rng = c->seed ? mix64(c->seed ^ mix64(name_hash ^ mix64(j))) | 1 : 0;
        run_block(b);
    }
    cur_block = outer;
    const bool failed = b.failed;
    if (failed) {
        // Fibers stopped mid-kernel leave their frames' poison behind.
        for (unsigned int i = 0; i < b.n; ++i) EMU_UNPOISON(stacks.get(i), kStackBytes);
    }
    for (unsigned int i = 0; i < b.n; ++i) std::free(b.fibers[i].copies);
    EMU_UNPOISON(b.arena, b.arena_cap);
    std::free(b.arena);
    delete[] b.fibers;
    delete[] b.warps;
    return failed ? 1 : 0;
}

// The sizes of a kernel's parameters, in order.
template <class... Args>
EMU_RUNTIME int param_sizes(void (*)(Args...), unsigned long* out, int max) {
    const unsigned long sizes[] = {sizeof(Args)..., 0};
    const int n = static_cast<int>(sizeof...(Args));
    for (int i = 0; i < n && i < max; ++i) out[i] = sizes[i];
    return n;
}

}  // namespace emu

// ---------------------------------------------------------------------------
// The device built-ins kernels use.

#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx())
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())

#define __syncthreads() ::emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::emu::syncwarp_at(__FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_sync(m, v, ...) ::emu::shfl_at(::emu::WarpOp::Shfl, m, v, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(m, v, ...) ::emu::shfl_at(::emu::WarpOp::ShflUp, m, v, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(m, v, ...) ::emu::shfl_at(::emu::WarpOp::ShflDown, m, v, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(m, v, ...) ::emu::shfl_at(::emu::WarpOp::ShflXor, m, v, __FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(m, p) ::emu::vote(::emu::WarpOp::Ballot, m, p, __FILE__, __LINE__)
#define __any_sync(m, p) (::emu::vote(::emu::WarpOp::Any, m, p, __FILE__, __LINE__) != 0)
#define __all_sync(m, p) ((::emu::vote(::emu::WarpOp::All, m, p, __FILE__, __LINE__) & (m)) == (m))

namespace emu {
EMU_RUNTIME void syncwarp_at(const char* file, int line, unsigned int mask = 0xffffffffu) {
    warp_collective(WarpOp::Sync, mask, file, line, [](WarpMeet&, unsigned int) EMU_NOCHECK {},
                    [](WarpMeet&) EMU_NOCHECK {});
}
template <class T>
EMU_RUNTIME T shfl_at(WarpOp op, unsigned int mask, T v, const char* file, int line, int arg,
                 int width = 32) {
    return shuffle<T>(op, mask, v, arg, width, file, line);
}
}  // namespace emu

// The lanes of the caller's warp that have not exited.
EMU_RUNTIME unsigned int __activemask() {
    const ::emu::WarpMeet& w = ::emu::my_warp();
    return w.lanes & ~w.exited;
}

inline void __threadfence() {}
inline void __threadfence_block() {}

// Integer intrinsics.
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned int>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned int __brev(unsigned int x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}

// min and max as CUDA overloads them (not std's templates: mixed int and
// unsigned arguments convert as in CUDA).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned int min(int a, unsigned int b) { return min(static_cast<unsigned int>(a), b); }
inline unsigned int min(unsigned int a, int b) { return min(a, static_cast<unsigned int>(b)); }
inline unsigned int max(int a, unsigned int b) { return max(static_cast<unsigned int>(a), b); }
inline unsigned int max(unsigned int a, int b) { return max(a, static_cast<unsigned int>(b)); }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// Bit casts.
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(unsigned int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned int __float_as_uint(float x) { unsigned int i; std::memcpy(&i, &x, 4); return i; }
inline double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
inline long long __double_as_longlong(double x) { long long i; std::memcpy(&i, &x, 8); return i; }

// bf16 and f16 as their bits, with CUDA's conversions (round to nearest
// even; NaN stays NaN).
struct __nv_bfloat16 {
    unsigned short __x;
};
struct __half {
    unsigned short __x;
};
inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float(static_cast<unsigned int>(h.__x) << 16); }
inline __nv_bfloat16 __float2bfloat16(float f) {
    unsigned int b = __float_as_uint(f);
    if (f != f) return __nv_bfloat16{0x7fff};  // CUDA's canonical NaN
    b += 0x7fff + ((b >> 16) & 1);
    return __nv_bfloat16{static_cast<unsigned short>(b >> 16)};
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rz(float f) {
    return __nv_bfloat16{static_cast<unsigned short>(__float_as_uint(f) >> 16)};
}
inline float __half2float(__half h) {
    const unsigned int s = (h.__x & 0x8000u) << 16;
    const unsigned int e = (h.__x >> 10) & 0x1f;
    unsigned int m = h.__x & 0x3ff;
    if (e == 0x1f) return __uint_as_float(s | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return __uint_as_float(s);
        // Subnormal: m · 2^-24, exact in f32.
        const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
        return s ? -v : v;
    }
    return __uint_as_float(s | ((e + 112) << 23) | (m << 13));
}
inline __half __float2half_rn(float f) {
    const unsigned int b = __float_as_uint(f);
    const unsigned short sign = static_cast<unsigned short>((b >> 16) & 0x8000u);
    const float a = fabsf(f);
    if (a != a) return __half{static_cast<unsigned short>(sign | 0x7e00)};
    if (a >= 65520.0f) return __half{static_cast<unsigned short>(sign | 0x7c00)};
    if (a < 6.103515625e-05f) {
        // Subnormal half: a / 2^-24 rounded to nearest even.
        const float q = nearbyintf(a * 16777216.0f);
        return __half{static_cast<unsigned short>(sign | static_cast<unsigned short>(q))};
    }
    unsigned int ab = __float_as_uint(a);
    ab += 0xfff + ((ab >> 13) & 1);
    return __half{static_cast<unsigned short>(sign | (((ab >> 23) - 112) << 10) | ((ab >> 13) & 0x3ff))};
}
inline __half __float2half(float f) { return __float2half_rn(f); }

// Math with its rounding stated above.
inline float __expf(float x) { return exp2f(x * 1.44269504f); }
inline float __logf(float x) { return log2f(x) * 0.693147181f; }
inline float __log2f(float x) { return log2f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __powf(float a, float b) { return exp2f(b * log2f(a)); }
inline float __fdividef(float a, float b) { return a * (1.0f / b); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __saturatef(float x) { return x != x ? 0.0f : fminf(fmaxf(x, 0.0f), 1.0f); }


// Atomics. Blocks run one after another on one OS thread and fibers switch
// only at barriers and collectives, so a read-modify-write as written is
// atomic. The race checker takes it as one access (atomics of two threads
// to one byte are no race; an atomic and a plain access are).
namespace emu {
template <class T>
struct same {
    using type = T;
};
}  // namespace emu
#if EMU_CHECKS
#define EMU_ATOMIC_ACCESS(p) \
    ::emu::check((p), sizeof(*(p)), ::emu::kAtomic, ::emu::pc_of(__builtin_return_address(0)))
#else
#define EMU_ATOMIC_ACCESS(p) ((void)0)
#endif
// The value converts to the pointee's type, as CUDA's overloads do.
#define EMU_ATOMIC(name, expr)                                         \
    template <class T>                                                 \
    __attribute__((noinline)) EMU_BEHALF T name(T* p, typename ::emu::same<T>::type v) { \
        EMU_ATOMIC_ACCESS(p);                                          \
        T old = *p;                                                    \
        *p = (expr);                                                   \
        return old;                                                    \
    }
EMU_ATOMIC(atomicAdd, old + v)
EMU_ATOMIC(atomicSub, old - v)
EMU_ATOMIC(atomicMax, old > v ? old : v)
EMU_ATOMIC(atomicMin, old < v ? old : v)
EMU_ATOMIC(atomicAnd, old & v)
EMU_ATOMIC(atomicOr, old | v)
EMU_ATOMIC(atomicXor, old ^ v)
EMU_ATOMIC(atomicExch, v)
#undef EMU_ATOMIC
template <class T>
__attribute__((noinline)) EMU_BEHALF T atomicCAS(T* p, typename ::emu::same<T>::type compare,
                                                 typename ::emu::same<T>::type v) {
    EMU_ATOMIC_ACCESS(p);
    T old = *p;
    if (old == compare) *p = v;
    return old;
}
__attribute__((noinline)) EMU_BEHALF unsigned int atomicInc(unsigned int* p, unsigned int limit) {
    EMU_ATOMIC_ACCESS(p);
    unsigned int old = *p;
    *p = old >= limit ? 0 : old + 1;
    return old;
}
__attribute__((noinline)) EMU_BEHALF unsigned int atomicDec(unsigned int* p, unsigned int limit) {
    EMU_ATOMIC_ACCESS(p);
    unsigned int old = *p;
    *p = (old == 0 || old > limit) ? limit : old - 1;
    return old;
}
#undef EMU_ATOMIC_ACCESS

#if EMU_CHECKS
// ThreadSanitizer's instrumentation calls these for every load and store
// of a kernel (and the module's constructor calls __tsan_init); here they
// are the race checker, with where the access was made. (The compiler
// declares them with default visibility; the module is linked with
// -Bsymbolic, so its calls are its own.)
#define EMU_HOOK extern "C" __attribute__((used)) EMU_NOCHECK
#define EMU_HOOKS(n)                                                                     \
    EMU_HOOK void __tsan_read##n(void* p) {                                              \
        ::emu::check(p, n, ::emu::kRead, ::emu::pc_of(__builtin_return_address(0)));     \
    }                                                                                    \
    EMU_HOOK void __tsan_write##n(void* p) {                                             \
        ::emu::check(p, n, ::emu::kWrite, ::emu::pc_of(__builtin_return_address(0)));    \
    }                                                                                    \
    EMU_HOOK void __tsan_unaligned_read##n(void* p) {                                    \
        ::emu::check(p, n, ::emu::kRead, ::emu::pc_of(__builtin_return_address(0)));     \
    }                                                                                    \
    EMU_HOOK void __tsan_unaligned_write##n(void* p) {                                   \
        ::emu::check(p, n, ::emu::kWrite, ::emu::pc_of(__builtin_return_address(0)));    \
    }                                                                                    \
    EMU_HOOK void __tsan_volatile_read##n(void* p) {                                     \
        ::emu::check(p, n, ::emu::kRead, ::emu::pc_of(__builtin_return_address(0)));     \
    }                                                                                    \
    EMU_HOOK void __tsan_volatile_write##n(void* p) {                                    \
        ::emu::check(p, n, ::emu::kWrite, ::emu::pc_of(__builtin_return_address(0)));    \
    }
EMU_HOOKS(1)
EMU_HOOKS(2)
EMU_HOOKS(4)
EMU_HOOKS(8)
EMU_HOOKS(16)
#undef EMU_HOOKS
EMU_HOOK void __tsan_read_range(void* p, long n) {
    ::emu::check(p, n, ::emu::kRead, ::emu::pc_of(__builtin_return_address(0)));
}
EMU_HOOK void __tsan_write_range(void* p, long n) {
    ::emu::check(p, n, ::emu::kWrite, ::emu::pc_of(__builtin_return_address(0)));
}
EMU_HOOK void __tsan_init() { ::emu::find_module_base(); }
EMU_HOOK void __tsan_func_entry(void*) {}
EMU_HOOK void __tsan_func_exit(void*) {}
EMU_HOOK void __tsan_vptr_update(void*, void*) {}
EMU_HOOK void __tsan_vptr_read(void*) {}
#undef EMU_HOOK
#endif
