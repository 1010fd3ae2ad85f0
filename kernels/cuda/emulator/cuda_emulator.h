// The CUDA execution model on the CPU: statebench's `.cu` kernel sources,
// compiled by the system C++ compiler against this header, run with the
// semantics they have on a GPU.
//
// - Every GPU thread of a block is a fiber on one OS thread. A fiber runs
//   until it reaches a barrier or a warp collective, or exits; then the next
//   runnable one runs, in thread order. A barrier completes when every thread
//   that has not exited has arrived; a block in which no thread can go on
//   while some wait is an error that names the waits (never a hang).
// - `__shared__` variables live in a per-block arena filled with 0xff bytes
//   (NaN as f32, -1 as integers), so a read of shared memory that no thread
//   wrote shows; they are laid out with poisoned gaps between them, so under
//   AddressSanitizer a read past a shared tile stops the kernel.
// - Warp collectives (shuffles, votes, `__syncwarp`, ldmatrix, mma) are
//   rendezvous of exactly the lanes of their mask: a lane outside the mask,
//   an exited lane in it, or lanes of one mask at different collectives are
//   reported errors.
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

#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
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

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// The emulator's own bookkeeping is not checked by AddressSanitizer (its
// memory is its own); the kernels' reads and writes, and the ones it makes
// on their behalf (ldmatrix, cp.async), are.
#define EMU_RUNTIME inline __attribute__((no_sanitize_address))

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

[[noreturn]] inline void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// One pending cp.async copy; it happens when its group is waited for.
struct AsyncCopy {
    void* dst;
    const void* src;
    unsigned int bytes;
    unsigned int src_bytes;  // the rest of `bytes` is zero-filled
    int group;
};

enum class State { Runnable, Barrier, Warp, Done };

// Where a switched-out fiber (or the scheduler) resumes.
struct Context {
    void* sp = nullptr;
#if !defined(__x86_64__)
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

// A warp collective in progress: each lane's operand, and the results the
// last lane to arrive computes for all of them.
struct WarpMeet {
    WarpOp op = WarpOp::None;
    unsigned int lanes = 0;   // lanes the block has in this warp
    unsigned int exited = 0;  // of those, lanes that have exited
    unsigned int mask = 0;
    unsigned int arrived = 0;
    const char* site = "";
    int line = 0;
    int width = 32;
    uint64_t value[32];
    int64_t arg[32];
    uint64_t result[32];
    bool bad[32];  // a shuffle lane whose source lane is outside the mask
    // ldmatrix: each lane's row address and its 4 result registers; mma: its
    // fragments (a: 4 regs, b: 2, c: 4 floats) and results (4 floats).
    const void* addr[32];
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
};

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
    SharedVar vars[64];
    int n_vars = 0;
    Context sched;
#if defined(__SANITIZE_ADDRESS__)
    bool from_scheduler = false;
    const void* sched_stack_bottom = nullptr;
    size_t sched_stack_size = 0;
    void* sched_fake_stack = nullptr;
#endif
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

// ---------------------------------------------------------------------------
// Fibers: a context switch saves the callee-saved registers and the stack
// pointer (x86-64 System V), or uses ucontext elsewhere.

constexpr size_t kStackBytes = 256 * 1024;

#if defined(__x86_64__)
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

extern "C" __attribute__((used, visibility("hidden"))) void statebench_emu_fiber_main();

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
#if defined(__x86_64__)
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

// The calling fiber waits (or has exited): the next runnable fiber after it
// in thread order runs; when there is none, the scheduler decides.
EMU_RUNTIME void switch_away(bool dying) {
    Block& b = block();
    Fiber& f = self();
    for (unsigned int t = 1; t < b.n; ++t) {
        unsigned int k = f.linear + t;
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

inline void start_fiber(Fiber& f) {
#if defined(__x86_64__)
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
    ~Stacks() {
        for (unsigned int i = 0; i < n; ++i) munmap(stacks[i] - 4096, kStackBytes + 4096);
        std::free(stacks);
    }
    char* get(unsigned int i) {
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

inline void set_error(Block& b, const char* text) {
    if (b.failed) return;
    b.failed = true;
    if (b.error && b.error_len) {
        std::snprintf(b.error, b.error_len,
                      "kernel %s, block (%u,%u,%u): %s", b.kernel, b.idx.x, b.idx.y, b.idx.z, text);
    }
}

inline void fail(const char* fmt, ...) {
    char text[768];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    Block& b = block();
    if (cur_fiber) {
        char with[900];
        Fiber& f = *cur_fiber;
        std::snprintf(with, sizeof with, "thread (%u,%u,%u): %s", f.tid.x, f.tid.y, f.tid.z, text);
        set_error(b, with);
        // This fiber never runs again; the scheduler ends the block.
        f.state = State::Done;
        to_scheduler(b, f, true);
    }
    set_error(b, text);
    std::abort();  // unreachable: errors are raised in fibers only
}

// ---------------------------------------------------------------------------
// Barriers.

EMU_RUNTIME void release_barrier(Block& b) {
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
// over all of them. Returns when every lane of `mask` has arrived.
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
    if (w.op != WarpOp::None && (w.op != op || w.mask != mask)) {
        fail("lanes of warp %u meet at different warp collectives (%s:%d with mask 0x%08x, %s:%d "
             "with mask 0x%08x)",
             f.linear / 32, file, line, mask, w.site, w.line, w.mask);
    }
    if (w.op == WarpOp::None) {
        w.op = op;
        w.mask = mask;
        w.arrived = 0;
        w.site = file;
        w.line = line;
    }
    fill(w, lane);
    w.arrived |= 1u << lane;
    f.wait_site = file;
    f.wait_line = line;
    if (w.arrived == mask) {
        compute(w);
        w.op = WarpOp::None;
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
        [&](WarpMeet& w, unsigned int l) {
            w.value[l] = to_bits(v);
            w.arg[l] = arg;
            w.width = width;
        },
        [&](WarpMeet& w) {
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
        op, mask, file, line, [&](WarpMeet& w, unsigned int l) { w.value[l] = pred != 0; },
        [&](WarpMeet& w) {
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

constexpr size_t kSharedGap = 64;  // poisoned bytes after each shared variable

// Static and dynamic shared memory of a block together (an sm_80's opt-in
// maximum).
inline size_t shared_limit() { return 163 * 1024; }

inline void* shared_alloc(Block& b, size_t bytes, size_t align) {
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

// The block's instance of the `__shared__` variable declared at site `id`.
template <class T>
inline T& shared(int id) {
    Block& b = block();
    for (int i = 0; i < b.n_vars; ++i) {
        if (b.vars[i].id == id) return *static_cast<T*>(b.vars[i].ptr);
    }
    if (b.n_vars == 64) fail("more than 64 __shared__ variables");
    void* p = shared_alloc(b, sizeof(T), alignof(T) < 16 ? 16 : alignof(T));
    b.vars[b.n_vars++] = SharedVar{id, p};
    return *static_cast<T*>(p);
}

inline void* dynamic_shared() { return block().arena + kSharedGap; }

// ---------------------------------------------------------------------------
// cp.async: copies are recorded and happen when their group is waited for.

inline void cp_async(void* dst, const void* src, unsigned int bytes, unsigned int src_bytes) {
    Fiber& f = self();
    if (f.n_copies == f.cap_copies) {
        f.cap_copies = f.cap_copies ? 2 * f.cap_copies : 16;
        f.copies = static_cast<AsyncCopy*>(std::realloc(f.copies, sizeof(AsyncCopy) * f.cap_copies));
    }
    if (reinterpret_cast<uintptr_t>(dst) % bytes || reinterpret_cast<uintptr_t>(src) % bytes) {
        fail("cp.async of %u bytes from %p to %p: both addresses must be %u-byte aligned", bytes,
             src, dst, bytes);
    }
    f.copies[f.n_copies++] = AsyncCopy{dst, src, bytes, src_bytes, f.open_group};
}

inline void cp_async_commit() { self().open_group++; }

// Completes every committed group but the newest `pending` ones (uncommitted
// copies wait for a later commit).
inline void cp_async_wait(int pending) {
    Fiber& f = self();
    const int upto = f.open_group - pending;  // groups < upto complete
    int kept = 0;
    for (int i = 0; i < f.n_copies; ++i) {
        AsyncCopy& c = f.copies[i];
        if (c.group < upto) {
            const unsigned int n = c.src_bytes < c.bytes ? c.src_bytes : c.bytes;
            std::memcpy(c.dst, c.src, n);
            std::memset(static_cast<char*>(c.dst) + n, 0, c.bytes - n);
        } else {
            f.copies[kept++] = c;
        }
    }
    f.n_copies = kept;
}

// ---------------------------------------------------------------------------
// ldmatrix and mma.sync, by the PTX ISA's fragment layouts.

inline uint16_t lo16(uint32_t r) { return static_cast<uint16_t>(r & 0xffff); }
inline uint16_t hi16(uint32_t r) { return static_cast<uint16_t>(r >> 16); }
inline uint32_t pack16(uint16_t lo, uint16_t hi) { return lo | (static_cast<uint32_t>(hi) << 16); }

// ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16: lanes 8i..8i+7
// give the row addresses of matrix i; lane l gets, of each matrix, row l/4,
// columns 2(l%4) and 2(l%4)+1 (with .trans: column l/4, rows 2(l%4), +1).
inline void ldmatrix(uint32_t* out, int count, bool trans, const void* row_addr, const char* file,
                     int line) {
    const unsigned int lane = lane_id();
    warp_collective(
        WarpOp::LdMatrix, 0xffffffffu, file, line,
        [&](WarpMeet& w, unsigned int l) {
            w.addr[l] = row_addr;
            w.count = count;
            w.width = trans;
        },
        [&](WarpMeet& w) {
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

inline float bf16_bits_to_float(uint16_t b) {
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
inline void mma_bf16_m16n8k16(float* d, const uint32_t* a, const uint32_t* b, const float* c,
                              const char* file, int line) {
    const unsigned int lane = lane_id();
    warp_collective(
        WarpOp::Mma, 0xffffffffu, file, line,
        [&](WarpMeet& w, unsigned int l) {
            for (int i = 0; i < 4; ++i) w.mma_a[l][i] = a[i];
            for (int i = 0; i < 2; ++i) w.mma_b[l][i] = b[i];
            for (int i = 0; i < 4; ++i) w.mma_c[l][i] = c[i];
        },
        [&](WarpMeet& w) {
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

// The scheduler of one block: runs fibers in thread order, each until it
// waits or exits, until all have exited or none can go on.
inline void run_block(Block& b) {
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
        m.op = WarpOp::None;
        m.lanes = in_warp == 32 ? 0xffffffffu : (1u << in_warp) - 1;
        m.exited = 0;
    }
    b.live = b.n;
    b.barrier_arrived = 0;
    b.n_vars = 0;
    // [gap][dynamic part][gap][static variables, each followed by a gap]
    b.arena_used = kSharedGap + b.dynamic_bytes + kSharedGap;
    EMU_POISON(b.arena, b.arena_cap);
    EMU_UNPOISON(b.arena + kSharedGap, b.dynamic_bytes);
    std::memset(b.arena + kSharedGap, 0xff, b.dynamic_bytes);
    unsigned int next = 0;
    while (!b.failed) {
        unsigned int tried = 0;
        while (tried < b.n && b.fibers[next].state != State::Runnable) {
            next = (next + 1) % b.n;
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
    }
}

extern "C" void statebench_emu_fiber_main() {
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
inline void call_kernel(Kernel k, void** params, std::index_sequence<I...>) {
    k(*static_cast<Args*>(params[I])...);
}

template <class... Args>
struct Invocation {
    void (*kernel)(Args...);
    void** params;
    static void run(void* self) {
        auto* inv = static_cast<Invocation*>(self);
        call_kernel<void (*)(Args...), Args...>(inv->kernel, inv->params,
                                                std::index_sequence_for<Args...>{});
    }
};

// Runs every block of a launch on the calling OS thread. Returns 0, or 1
// with the first error in `error`.
template <class... Args>
inline int launch(const char* name, void (*kernel)(Args...), const LaunchConfig* c, void** params,
                  char* error, size_t error_len) {
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
    Block* outer = cur_block;
    cur_block = &b;
    for (unsigned int z = 0; z < b.grid.z && !b.failed; ++z) {
        for (unsigned int y = 0; y < b.grid.y && !b.failed; ++y) {
            for (unsigned int x = 0; x < b.grid.x && !b.failed; ++x) {
                b.idx = uint3{x, y, z};
                run_block(b);
            }
        }
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
inline int param_sizes(void (*)(Args...), unsigned long* out, int max) {
    const unsigned long sizes[] = {sizeof(Args)..., 0};
    const int n = static_cast<int>(sizeof...(Args));
    for (int i = 0; i < n && i < max; ++i) out[i] = sizes[i];
    return n;
}

}  // namespace emu

// ---------------------------------------------------------------------------
// The device built-ins kernels use.

#define threadIdx (::emu::self().tid)
#define blockIdx (::emu::block().idx)
#define blockDim (::emu::block().dim)
#define gridDim (::emu::block().grid)

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
    warp_collective(WarpOp::Sync, mask, file, line, [](WarpMeet&, unsigned int) {},
                    [](WarpMeet&) {});
}
template <class T>
EMU_RUNTIME T shfl_at(WarpOp op, unsigned int mask, T v, const char* file, int line, int arg,
                 int width = 32) {
    return shuffle<T>(op, mask, v, arg, width, file, line);
}
}  // namespace emu

// The lanes of the caller's warp that have not exited.
inline unsigned int __activemask() {
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
// atomic.
namespace emu {
template <class T>
struct same {
    using type = T;
};
}  // namespace emu
// The value converts to the pointee's type, as CUDA's overloads do.
#define EMU_ATOMIC(name, expr)                                    \
    template <class T>                                            \
    inline T name(T* p, typename ::emu::same<T>::type v) {        \
        T old = *p;                     \
        *p = (expr);                    \
        return old;                     \
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
inline T atomicCAS(T* p, typename ::emu::same<T>::type compare, typename ::emu::same<T>::type v) {
    T old = *p;
    if (old == compare) *p = v;
    return old;
}
inline unsigned int atomicInc(unsigned int* p, unsigned int limit) {
    unsigned int old = *p;
    *p = old >= limit ? 0 : old + 1;
    return old;
}
inline unsigned int atomicDec(unsigned int* p, unsigned int limit) {
    unsigned int old = *p;
    *p = (old == 0 || old > limit) ? limit : old - 1;
    return old;
}
