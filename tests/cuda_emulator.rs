//! The CUDA emulator itself: the inline-PTX wrappers against the PTX ISA's
//! fragment layouts and a plain matrix product, and the errors it must
//! report instead of hanging or reading garbage (a deadlocked barrier, a
//! cp.async never waited for, a read past a buffer or a shared tile, a race
//! in shared memory, a read of memory nothing wrote), under each of its
//! checks (`STATEBENCH_EMULATOR_CHECKS`).
//!
//! A failed kernel makes the emulated context fail for the rest of its
//! process, as a fault does on a GPU, and AddressSanitizer ends the
//! process: so each failure runs in a child process of this test binary
//! (the ignored `child` test, started with `STATEBENCH_EMU_CASE`).
#![cfg(all(feature = "cuda", target_os = "linux"))]

mod engine_common;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use statebench::engine::device::cuda::{compile, emulator_error, load_emulator};

const PTX_CHECK: &str = include_str!("cuda/ptx_check.cu");

/// The emulated device's stream and kernel `name` of `body` (compiled as
/// kernel set `set`, after the shared definitions and the PTX wrappers).
fn kernel(set: &str, body: &str, name: &str) -> (Arc<CudaStream>, CudaFunction) {
    load_emulator().expect("the CUDA emulator loads");
    let ctx = CudaContext::new(0).expect("the emulated device opens");
    let c = compile(set, body, "compute_80").unwrap_or_else(|e| panic!("{e}\n{}", e.log));
    let f = ctx
        .load_module(Ptx::from_src(c.ptx))
        .expect("module loads")
        .load_function(name)
        .expect("kernel found");
    (ctx.default_stream(), f)
}

fn warp() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// bf16 bits of small integers and halves: every product and partial sum
/// of the checks below is exact in f32, so only layout errors can differ.
fn bf16_of(x: f32) -> u16 {
    (x.to_bits() >> 16) as u16
}

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 33) % 17) as f32 * 0.5 - 4.0
}

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn ldmatrix_registers_follow_the_ptx_layouts() {
    engine_common::require_emulator();
    let (stream, f) = kernel("ptx_check", PTX_CHECK, "ldmatrix_probe");
    // Element (row r, column c) of the 32 x 8 matrix is r * 8 + c: every
    // register then says which elements it holds.
    let m: Vec<u16> = (0..256u16).collect();
    let dm = stream.clone_htod(&m).expect("upload");
    let mut out = stream.alloc_zeros::<u32>(32 * 14).expect("alloc");
    let mut b = stream.launch_builder(&f);
    b.arg(&dm).arg(&mut out);
    // SAFETY: ldmatrix_probe(m, out): 256 halves in, 32 × 14 words out.
    unsafe { b.launch(warp()) }.expect("launch");
    let got = stream.clone_dtoh(&out).expect("download");
    let at = |r: usize, c: usize| (r * 8 + c) as u32;
    for l in 0..32 {
        let (row, col) = (l / 4, 2 * (l % 4));
        let mut want = Vec::new();
        // x1, x2, x4: of matrix i (rows 8i..8i+7), row l/4, columns 2(l%4), +1.
        for count in [1, 2, 4] {
            for i in 0..count {
                want.push(at(8 * i + row, col) | at(8 * i + row, col + 1) << 16);
            }
        }
        // .trans: column l/4, rows 2(l%4) and +1.
        for count in [1, 2, 4] {
            for i in 0..count {
                want.push(at(8 * i + col, row) | at(8 * i + col + 1, row) << 16);
            }
        }
        assert_eq!(&got[l * 14..l * 14 + 14], &want[..], "lane {l}");
    }
}

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn mma_through_cp_async_and_ldmatrix_equals_a_plain_matrix_product() {
    engine_common::require_emulator();
    let (stream, f) = kernel("ptx_check", PTX_CHECK, "mma_gemm");
    let (m, n, k) = (32usize, 24usize, 64usize);
    let mut seed = 11u64;
    let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
    let bm: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect(); // n x k
    let bt: Vec<f32> = (0..k * n).map(|i| bm[(i % n) * k + i / n]).collect(); // k x n
    let bits = |v: &[f32]| v.iter().map(|&x| bf16_of(x)).collect::<Vec<u16>>();
    let (da, db, dbt) = (
        stream.clone_htod(&bits(&a)).expect("upload"),
        stream.clone_htod(&bits(&bm)).expect("upload"),
        stream.clone_htod(&bits(&bt)).expect("upload"),
    );
    let mut c = stream.alloc_zeros::<f32>(m * n).expect("alloc");
    let mut c2 = stream.alloc_zeros::<f32>(m * n).expect("alloc");
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    let mut b = stream.launch_builder(&f);
    b.arg(&da)
        .arg(&db)
        .arg(&dbt)
        .arg(&mut c)
        .arg(&mut c2)
        .arg(&mi)
        .arg(&ni)
        .arg(&ki);
    let cfg = LaunchConfig {
        grid_dim: ((n / 8) as u32, (m / 16) as u32, 1),
        ..warp()
    };
    // SAFETY: mma_gemm(a, b, bt, c, c2, m, n, k) over (n/8) x (m/16) warps.
    unsafe { b.launch(cfg) }.expect("launch");
    let (got, got_t) = (
        stream.clone_dtoh(&c).expect("download"),
        stream.clone_dtoh(&c2).expect("download"),
    );
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| a[i * k + p] as f64 * bm[j * k + p] as f64)
                .sum();
            assert_eq!(got[i * n + j] as f64, want, "c[{i}][{j}]");
            assert_eq!(got_t[i * n + j] as f64, want, "c2[{i}][{j}] (b transposed)");
        }
    }
}

// A warp finishes a collective in its last lane to arrive, which runs on
// into the next one before the others read their results: a vote of two
// lanes there must not overwrite the results of the full-warp vote before
// it. And `static __shared__` is the running block's variable, launch
// after launch.
const VOTES: &str = r#"
extern "C" __global__ void votes_and_static_shared(unsigned int* out) {
    static __shared__ unsigned int seen[32];
    const unsigned int lane = threadIdx.x % 32;
    const unsigned int a = __ballot_sync(0xffffffffu, lane < 5);
    if (lane == 0 || lane == 31) {
        (void)__ballot_sync(0x80000001u, 1);
    }
    seen[lane] = a + blockIdx.x;
    __syncwarp();
    out[blockIdx.x * 32 + lane] = seen[(lane + 1) % 32];
}
"#;

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn votes_keep_their_results_and_static_shared_is_per_block() {
    engine_common::require_emulator();
    let (stream, f) = kernel("votes", VOTES, "votes_and_static_shared");
    for _ in 0..2 {
        let mut out = stream.alloc_zeros::<u32>(64).expect("alloc");
        let mut b = stream.launch_builder(&f);
        b.arg(&mut out);
        let cfg = LaunchConfig {
            grid_dim: (2, 1, 1),
            ..warp()
        };
        // SAFETY: votes_and_static_shared(out): 2 blocks × 32 words.
        unsafe { b.launch(cfg) }.expect("launch");
        let got = stream.clone_dtoh(&out).expect("download");
        let want: Vec<u32> = (0..64).map(|i| 0x1f + i / 32).collect();
        assert_eq!(got, want);
    }
}

const ADD_ONE: &str = r#"
extern "C" __global__ void add_one(unsigned int* x) {
    x[threadIdx.x] += 1;
}
"#;

/// A capture records launches without running them; the graph runs them,
/// in order, each time it is launched. Work of this thread off a stream is
/// refused while it captures, and work on the capturing stream invalidates
/// the capture; another thread's launches on its own stream go on.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn graphs_replay_what_a_capture_recorded_and_other_threads_go_on() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    engine_common::require_emulator();
    let (legacy, f) = kernel("graph", ADD_ONE, "add_one");
    let ctx = legacy.context().clone();
    let (a, b) = (
        ctx.new_stream().expect("stream"),
        ctx.new_stream().expect("stream"),
    );
    let launch = |s: &Arc<CudaStream>, x: &mut cudarc::driver::CudaSlice<u32>| {
        let mut l = s.launch_builder(&f);
        l.arg(x);
        // SAFETY: add_one(x): one word a thread, 32 words.
        unsafe { l.launch(warp()) }
    };
    let mut x = a.alloc_zeros::<u32>(32).expect("alloc");
    let mut y = b.alloc_zeros::<u32>(32).expect("alloc");
    a.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .expect("captures");
    launch(&a, &mut x).expect("recorded");
    launch(&a, &mut x).expect("recorded");
    assert!(
        launch(&legacy, &mut y).is_err(),
        "the legacy stream during this thread's capture"
    );
    std::thread::scope(|s| {
        s.spawn(|| {
            launch(&b, &mut y).expect("another thread's stream runs");
            b.synchronize().expect("syncs");
        });
    });
    let graph = a
        .end_capture(CUgraphInstantiate_flags(0))
        .expect("ends")
        .expect("a graph");
    assert_eq!(
        a.clone_dtoh(&x).expect("download"),
        vec![0; 32],
        "nothing ran"
    );
    assert_eq!(b.clone_dtoh(&y).expect("download"), vec![1; 32]);
    graph.launch().expect("replays");
    graph.launch().expect("replays");
    assert_eq!(a.clone_dtoh(&x).expect("download"), vec![4; 32]);
    // A copy on the capturing stream invalidates the capture.
    a.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .expect("captures");
    assert!(a.clone_dtoh(&x).is_err(), "a copy while capturing");
    assert!(
        a.end_capture(CUgraphInstantiate_flags(0)).is_err(),
        "invalidated"
    );
}

// Kernels that must fail, each in a child process.
const BAD: &str = r#"
extern "C" __global__ void divergent_warp(float* out) {
    // Lanes 0-15 wait at the block barrier, 16-31 in a shuffle for lanes 0-15.
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    }
}

extern "C" __global__ void copy_never_waited(const float* in, float* out) {
    __shared__ __align__(16) float tile[32][4];
    cp_async_16(&tile[threadIdx.x][0], in + threadIdx.x * 4);
    cp_async_commit();
    out[threadIdx.x] = tile[threadIdx.x][0];
}

extern "C" __global__ void read_past_the_buffer(const float* in, float* out, int n) {
    out[threadIdx.x] = in[threadIdx.x + n - 31];
}

extern "C" __global__ void read_past_the_tile(const float* in, float* out) {
    __shared__ float tile[32];
    tile[threadIdx.x] = in[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = tile[threadIdx.x + 1];
}

// Each thread reads its left neighbour's word with no barrier between.
extern "C" __global__ void read_after_write(const float* in, float* out) {
    __shared__ float left[32];
    left[threadIdx.x] = in[threadIdx.x];
    out[threadIdx.x] = left[threadIdx.x == 0 ? 0 : threadIdx.x - 1];
}

// Each thread overwrites its word after the barrier, which its right
// neighbour reads in the same interval.
extern "C" __global__ void write_after_read(const float* in, float* out) {
    __shared__ float right[32];
    right[threadIdx.x] = in[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = right[(threadIdx.x + 1) % 32];
    right[threadIdx.x] = 0.0f;
}

// Lane pairs swap words through shared memory: a race unless `sync`.
extern "C" __global__ void lanes_exchange(const float* in, float* out, int sync) {
    __shared__ float pairs[32];
    pairs[threadIdx.x] = in[threadIdx.x];
    if (sync) __syncwarp();
    out[threadIdx.x] = pairs[threadIdx.x ^ 1];
}

extern "C" __global__ void read_unwritten_shared(const float* in, float* out) {
    __shared__ float partial[32];
    if (threadIdx.x != 7) partial[threadIdx.x] = in[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = partial[threadIdx.x];
}

extern "C" __global__ void read_unwritten_global(const float* in, float* out) {
    out[threadIdx.x] = in[threadIdx.x] + 1.0f;
}
"#;

/// The line of `BAD` (as `bad.cu` numbers it) that holds `text`.
fn bad_line(text: &str) -> String {
    let at = BAD
        .lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("{text} not in BAD"));
    format!("bad.cu:{}", at + 1)
}

/// Runs one failing kernel; what it prints is what the parent checks.
fn run_case(case: &str) {
    let (kernel_name, sync) = match case.strip_suffix("+sync") {
        Some(name) => (name, 1i32),
        None => (case, 0i32),
    };
    let (stream, f) = kernel("bad", BAD, kernel_name);
    let input = if kernel_name == "read_unwritten_global" {
        // SAFETY: allocated and never written: what the kernel must not read.
        unsafe { stream.alloc::<f32>(128) }.expect("alloc")
    } else {
        let values: Vec<f32> = (0..128).map(|i| i as f32).collect();
        stream.clone_htod(&values).expect("upload")
    };
    let mut out = stream.alloc_zeros::<f32>(128).expect("alloc");
    let n = 128i32;
    let mut b = stream.launch_builder(&f);
    match kernel_name {
        "divergent_warp" => b.arg(&mut out),
        "read_past_the_buffer" => b.arg(&input).arg(&mut out).arg(&n),
        "lanes_exchange" => b.arg(&input).arg(&mut out).arg(&sync),
        _ => b.arg(&input).arg(&mut out),
    };
    // SAFETY: the buffers are as large as each kernel's in-bounds reads.
    let launched = unsafe { b.launch(warp()) };
    let synced = stream.synchronize();
    println!("launch: {launched:?}; sync: {synced:?}");
    println!("emulator: {}", emulator_error().unwrap_or_default());
    if launched.is_ok() && synced.is_ok() {
        let got = stream.clone_dtoh(&out).expect("download");
        println!("out: {:?}", &got[..32]);
    }
}

#[test]
#[ignore = "the entry point of the failure tests' child processes"]
fn child() {
    if let Ok(case) = std::env::var("STATEBENCH_EMU_CASE") {
        run_case(&case);
    }
}

/// This binary's `child` test in a process of its own, running `case`.
fn in_child(case: &str) -> (bool, String) {
    in_child_with(case, &[])
}

/// [`in_child`] with the environment variables `env` set (and, unless they
/// say otherwise, the default checks and the threads in order, so which
/// access a race report names first is fixed).
fn in_child_with(case: &str, env: &[(&str, &str)]) -> (bool, String) {
    let mut all = vec![("STATEBENCH_EMULATOR_SCHEDULE_SEED", "0")];
    all.extend_from_slice(env);
    engine_common::in_child("STATEBENCH_EMU_CASE", case, &all)
}

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn a_barrier_some_lanes_never_reach_is_a_reported_deadlock() {
    engine_common::require_emulator();
    let (_, text) = in_child("divergent_warp");
    assert!(
        text.contains("kernel divergent_warp") && text.contains("deadlock"),
        "{text}"
    );
    assert!(
        text.contains("16 (from thread 0) wait at __syncthreads")
            && text.contains("16 (from thread 16) wait at a warp collective"),
        "{text}"
    );
    assert!(text.contains("CUDA_ERROR_LAUNCH_FAILED"), "{text}");
}

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn a_cp_async_never_waited_for_is_reported() {
    engine_common::require_emulator();
    let (_, text) = in_child("copy_never_waited");
    assert!(
        text.contains("kernel copy_never_waited")
            && text.contains("cp.async copies never waited for"),
        "{text}"
    );
}

/// Runs `kernel` in a child, which the checks must stop with a launch
/// failure whose report holds every one of `parts`.
fn stops(kernel: &str, env: &[(&str, &str)], parts: &[&str]) -> String {
    let (_, text) = in_child_with(kernel, env);
    assert!(text.contains("CUDA_ERROR_LAUNCH_FAILED"), "{text}");
    let report = text
        .lines()
        .find(|l| l.starts_with("emulator: "))
        .unwrap_or_default();
    assert!(
        report.contains(&format!("kernel {kernel}, block (0,0,0): ")),
        "{text}"
    );
    for part in parts {
        assert!(report.contains(part), "no {part:?} in {report}");
    }
    report.to_string()
}

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn a_read_past_a_device_buffer_stops_the_kernel_by_name() {
    engine_common::require_emulator();
    // Thread 31 reads in[128] of 128.
    let line = bad_line("in[threadIdx.x + n - 31]");
    stops(
        "read_past_the_buffer",
        &[],
        &[
            "out-of-bounds read of 4 bytes at device allocation 0x",
            "+ 512 (of 512 bytes)",
            &format!("at {line}, thread (31,0,0)"),
        ],
    );
}

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn a_read_past_a_shared_tile_stops_the_kernel_by_name() {
    engine_common::require_emulator();
    let line = bad_line("tile[threadIdx.x + 1]");
    stops(
        "read_past_the_tile",
        &[],
        &[&format!(
            "out-of-bounds read of 4 bytes at byte 128 of shared tile (128 bytes) at {line}, thread (31,0,0)"
        )],
    );
}

/// With `STATEBENCH_EMULATOR_CHECKS=asan` AddressSanitizer stops the
/// kernels instead, by name.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn under_address_sanitizer_reads_out_of_bounds_stop_the_kernel_by_name() {
    engine_common::require_emulator();
    for kernel in ["read_past_the_buffer", "read_past_the_tile"] {
        let (ok, text) = in_child_with(kernel, &[("STATEBENCH_EMULATOR_CHECKS", "asan")]);
        assert!(!ok, "the child must fail:\n{text}");
        assert!(
            text.contains("AddressSanitizer") && text.contains(&format!("in {kernel}")),
            "{text}"
        );
    }
}

/// With the checks off a race is not seen, and a kernel that is right
/// gives its results; a setting that is none of the three is refused by
/// name.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn with_the_checks_off_kernels_run_unchecked_and_a_bad_setting_is_refused() {
    engine_common::require_emulator();
    let off = [("STATEBENCH_EMULATOR_CHECKS", "off")];
    let (ok, text) = in_child_with("lanes_exchange", &off);
    assert!(ok && text.contains("launch: Ok("), "{text}");
    assert!(!text.contains("race"), "{text}");
    let (ok, text) = in_child_with("lanes_exchange+sync", &off);
    let swapped: Vec<String> = (0..32).map(|i| format!("{}.0", i ^ 1)).collect();
    assert!(
        ok && text.contains(&format!("out: [{}]", swapped.join(", "))),
        "{text}"
    );
    let (_, text) = in_child_with("lanes_exchange", &[("STATEBENCH_EMULATOR_CHECKS", "tsan")]);
    assert!(
        text.contains("STATEBENCH_EMULATOR_CHECKS=tsan is not one of races, asan, off"),
        "{text}"
    );
}

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn a_read_of_a_word_another_thread_wrote_without_a_barrier_is_a_race() {
    engine_common::require_emulator();
    // In thread order: thread 1 reads what thread 0 wrote.
    let (w, r) = (
        bad_line("left[threadIdx.x] = in"),
        bad_line("out[threadIdx.x] = left["),
    );
    stops(
        "read_after_write",
        &[],
        &[&format!(
            "race on shared left (byte 0 of 128): thread (1,0,0) reads at {r} what thread (0,0,0) wrote at {w} in the same barrier interval"
        )],
    );
}

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn a_write_of_a_word_another_thread_read_since_the_barrier_is_a_race() {
    engine_common::require_emulator();
    // The last thread at the barrier (31) goes on first and reads word 0;
    // then thread 0 overwrites it.
    let (r, w) = (
        bad_line("out[threadIdx.x] = right["),
        bad_line("right[threadIdx.x] = 0.0f"),
    );
    stops(
        "write_after_read",
        &[],
        &[&format!(
            "race on shared right (byte 0 of 128): thread (0,0,0) writes at {w} what thread (31,0,0) read at {r} in the same barrier interval"
        )],
    );
}

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn a_syncwarp_between_the_lanes_removes_the_race() {
    engine_common::require_emulator();
    let (w, r) = (
        bad_line("pairs[threadIdx.x] = in"),
        bad_line("out[threadIdx.x] = pairs["),
    );
    // Without it, lane 1's write meets lane 0's read of the same word.
    stops(
        "lanes_exchange",
        &[],
        &[&format!(
            "race on shared pairs (byte 4 of 128): thread (1,0,0) writes at {w} what thread (0,0,0) read at {r} in the same barrier interval"
        )],
    );
    // With it, the pairs swap, in any schedule.
    for seed in ["0", "1", "99"] {
        let (ok, text) = in_child_with(
            "lanes_exchange+sync",
            &[("STATEBENCH_EMULATOR_SCHEDULE_SEED", seed)],
        );
        let swapped: Vec<String> = (0..32).map(|i| format!("{}.0", i ^ 1)).collect();
        assert!(
            ok && text.contains(&format!("out: [{}]", swapped.join(", "))),
            "seed {seed}: {text}"
        );
    }
}

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn a_read_of_shared_memory_no_thread_wrote_is_reported() {
    engine_common::require_emulator();
    let line = bad_line("out[threadIdx.x] = partial[");
    stops(
        "read_unwritten_shared",
        &[],
        &[&format!(
            "uninitialized read of shared partial (byte 28 of 128) at {line}, thread (7,0,0): no thread of the block wrote it"
        )],
    );
}

#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn a_read_of_device_memory_nothing_wrote_is_reported() {
    engine_common::require_emulator();
    let line = bad_line("out[threadIdx.x] = in[threadIdx.x] + 1.0f");
    stops(
        "read_unwritten_global",
        &[],
        &[
            "uninitialized read of 4 bytes at device allocation 0x",
            &format!("+ 0 (of 512 bytes) at {line}, thread (0,0,0)"),
        ],
    );
}

/// The ucontext fibers (what hosts other than x86-64 run, forced here by
/// `STATEBENCH_EMULATOR_FIBERS=ucontext`) meet at warp collectives in any
/// schedule, and a block stuck at a barrier is reported as a deadlock.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn the_ucontext_fibers_exchange_lanes_and_report_a_deadlock() {
    engine_common::require_emulator();
    let ucontext = ("STATEBENCH_EMULATOR_FIBERS", "ucontext");
    for seed in ["0", "99"] {
        let (ok, text) = in_child_with(
            "lanes_exchange+sync",
            &[("STATEBENCH_EMULATOR_SCHEDULE_SEED", seed), ucontext],
        );
        let swapped: Vec<String> = (0..32).map(|i| format!("{}.0", i ^ 1)).collect();
        assert!(
            ok && text.contains(&format!("out: [{}]", swapped.join(", "))),
            "seed {seed}: {text}"
        );
    }
    let (_, text) = in_child_with("divergent_warp", &[ucontext]);
    assert!(
        text.contains("deadlock") && text.contains("CUDA_ERROR_LAUNCH_FAILED"),
        "{text}"
    );
}

/// A schedule seed that is not a number is refused by name, at the launch.
#[test]
#[cfg_attr(
    not(has_cuda_emulator),
    ignore = "needs the CUDA emulator: a C++ compiler when statebench builds"
)]
fn a_schedule_seed_that_is_not_a_number_is_refused_by_name() {
    engine_common::require_emulator();
    let (_, text) = in_child_with(
        "lanes_exchange+sync",
        &[("STATEBENCH_EMULATOR_SCHEDULE_SEED", "-3")],
    );
    assert!(
        text.contains("STATEBENCH_EMULATOR_SCHEDULE_SEED=-3 is not an unsigned 64-bit integer"),
        "{text}"
    );
    assert!(text.contains("CUDA_ERROR_INVALID_VALUE"), "{text}");
}
