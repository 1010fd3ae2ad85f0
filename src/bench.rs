//! The measurements behind `statebench bench`: engine throughput (prefill,
//! batched decode, a growing conversation with and without prefix reuse)
//! and a live cell run batched against one episode-arm at a time. Each
//! returns its figures; the command line prints them.
//!
//! Layer: on top. It drives the engine directly and runs the ladder's cells,
//! to measure both.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;
use std::time::Instant;

use crate::backend::shared::Client;
use crate::backend::{Backend, BackendError, ChatRequest, Message, ModelIdentity, Role, Usage};
use crate::engine::device::Device;
use crate::engine::model::BatchItem;
use crate::engine::Engine;
use crate::ladder::arms::Arm;
use crate::ladder::run::cell::{
    progress_bar, run_cell, run_cells, CellConfig, CellError, CellJob, CellParts,
};
use crate::ladder::run::runlog::{read_run, read_turns, Locking, RunRead};

/// What `bench` measures on the engine.
#[derive(Debug, Clone)]
pub struct EngineBenchOptions {
    /// Prompt length of the prefill measurement.
    pub prefill_tokens: usize,
    /// Decode steps measured per batch size.
    pub decode_steps: usize,
    /// Batch sizes of the decode measurement.
    pub batches: Vec<usize>,
    /// Cached tokens of each sequence before the decode steps.
    pub decode_context: usize,
    /// Turns of the growing conversation.
    pub turns: usize,
    /// Reply tokens per turn of the growing conversation.
    pub turn_tokens: usize,
}

/// Tokens over seconds.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    pub tokens: usize,
    pub secs: f64,
}

impl Rate {
    pub fn per_sec(&self) -> f64 {
        self.tokens as f64 / self.secs
    }
}

/// One turn of the growing conversation, with its prefix reused and cold.
#[derive(Debug, Clone, Copy)]
pub struct TurnCost {
    /// One-based turn.
    pub turn: usize,
    pub warm_secs: f64,
    pub warm: Usage,
    pub cold_secs: f64,
    pub cold: Usage,
}

/// The engine's figures.
#[derive(Debug, Clone)]
pub struct EngineBench {
    pub prefill: Rate,
    /// Aggregate decode rate per batch size.
    pub decode: Vec<(usize, Rate)>,
    /// Sampled turns of the growing conversation.
    pub conversation: Vec<TurnCost>,
    /// Mean seconds per turn with reuse, over every turn.
    pub mean_warm_secs: f64,
}

/// A short request beside a long prompt's prefill: how long it takes
/// alone, and beside the prefill at each per-step prefill size while it
/// decodes.
#[derive(Debug, Clone)]
pub struct Interleave {
    pub long_tokens: usize,
    pub short_tokens: usize,
    pub short_alone_secs: f64,
    /// (prefill tokens per step while another decodes, the short request's
    /// seconds, the long prompt's seconds)
    pub beside: Vec<(usize, f64, f64)>,
}

/// Submits a long prompt, steps it once, then submits a short request and
/// steps both to the end, once per chunk size in `chunks` (restored to
/// `restore` after).
pub fn interleave<D: Device>(
    engine: &mut Engine<D>,
    long_tokens: usize,
    chunks: &[usize],
    restore: usize,
) -> Result<Interleave, BackendError> {
    const SHORT_TOKENS: usize = 16;
    let mut long = engine.encode(&filler(long_tokens * 2, 5))?;
    long.truncate(long_tokens);
    let short_prompt = |salt: usize| ChatRequest {
        prompt_text: Some(filler(24, salt)),
        ..ChatRequest::greedy(Vec::new(), SHORT_TOKENS)
    };
    let t = Instant::now();
    let s = engine.open_session();
    engine.chat(s, short_prompt(1))?;
    engine.close_session(s);
    let short_alone_secs = t.elapsed().as_secs_f64();
    let mut beside = Vec::new();
    for &chunk in chunks {
        engine.set_mixed_prefill_chunk(chunk);
        let (ls, ss) = (engine.open_session(), engine.open_session());
        let started = Instant::now();
        let long_id = engine.submit(
            ls,
            ChatRequest {
                prompt_ids: Some(long.clone()),
                ..ChatRequest::greedy(Vec::new(), 1)
            },
        )?;
        engine.step()?;
        let short_started = Instant::now();
        let short_id = engine.submit(ss, short_prompt(2))?;
        let (mut short_secs, mut long_secs) = (None, None);
        while engine.has_pending() {
            for (id, r) in engine.step()? {
                r?;
                if id == short_id {
                    short_secs = Some(short_started.elapsed().as_secs_f64());
                } else if id == long_id {
                    long_secs = Some(started.elapsed().as_secs_f64());
                }
            }
        }
        engine.close_session(ls);
        engine.close_session(ss);
        beside.push((chunk, short_secs.unwrap_or(0.0), long_secs.unwrap_or(0.0)));
    }
    engine.set_mixed_prefill_chunk(restore);
    Ok(Interleave {
        long_tokens: long.len(),
        short_tokens: SHORT_TOKENS,
        short_alone_secs,
        beside,
    })
}

/// Deterministic filler text for benchmarks.
fn filler(words: usize, salt: usize) -> String {
    const W: [&str; 12] = [
        "ledger", "invoice", "step", "booking", "order", "review", "audit", "ship", "draft",
        "check", "plan", "note",
    ];
    (0..words)
        .map(|i| W[(i * 7 + salt * 3) % W.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Marks the timed parts of the engine figures for a profiler: under
/// `perf record -D -1 --control fifo:CTL,ACK`, statebench writes `enable`
/// to CTL as each timed part starts and `disable` as it ends, and waits for
/// perf's acknowledgement on ACK each time, so the profile holds the
/// figures alone: not the model's load, the host's ceilings or the prompts
/// each decode measurement prefills first.
#[derive(Default)]
pub struct Marks(Option<Fifos>);

/// perf's control FIFO, written, and its acknowledgement FIFO, read.
struct Fifos {
    ctl: std::path::PathBuf,
    to: File,
    from: BufReader<File>,
}

impl Marks {
    /// Marks written to `ctl`, each acknowledged on `ack` (FIFOs that a
    /// running `perf record --control fifo:CTL,ACK` reads and writes);
    /// refused at once where nothing reads `ctl`.
    pub fn perf(ctl: &Path, ack: &Path) -> Result<Marks, BackendError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| BackendError::Io { path, source }
        };
        let to = open_written_fifo(ctl).map_err(io(ctl))?;
        // perf holds its end of `ack` open from before it reads `ctl`, so
        // this open does not wait.
        let from = File::open(ack).map_err(io(ack))?;
        Ok(Marks(Some(Fifos {
            ctl: ctl.to_path_buf(),
            to,
            from: BufReader::new(from),
        })))
    }

    fn send(&mut self, command: &str) -> Result<(), BackendError> {
        let Some(f) = &mut self.0 else {
            return Ok(());
        };
        let mut line = String::new();
        writeln!(f.to, "{command}")
            .and_then(|()| f.to.flush())
            // perf answers `ack`; a line is read to its end or 256 bytes,
            // whatever else writes to the FIFO.
            .and_then(|()| f.from.by_ref().take(256).read_line(&mut line))
            .and_then(|n| match n {
                0 => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("perf did not acknowledge `{command}` (has it stopped?)"),
                )),
                _ => Ok(()),
            })
            .map_err(|source| BackendError::Io {
                path: f.ctl.clone(),
                source,
            })
    }

    /// `f`, with the profiler enabled while it runs.
    fn timed<T>(&mut self, f: impl FnOnce() -> Result<T, BackendError>) -> Result<T, BackendError> {
        self.send("enable")?;
        let r = f();
        self.send("disable")?;
        r
    }
}

/// `path` opened for writing, refused at once where no process has it open
/// for reading (a FIFO's open waits for its reader; a profiler that never
/// started would leave statebench waiting).
fn open_written_fifo(path: &Path) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NONBLOCK);
    }
    let f = o.open(path).map_err(|e| match e.raw_os_error() {
        #[cfg(unix)]
        Some(libc::ENXIO) => io::Error::new(
            e.kind(),
            "no profiler reads it (start `perf record -D -1 --control fifo:CTL,ACK` first)",
        ),
        _ => e,
    })?;
    // Back to blocking writes: each mark waits for its acknowledgement anyway.
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: fcntl on a descriptor this function owns; only the
        // status flags change.
        let ok = unsafe {
            let fd = f.as_raw_fd();
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(f)
}

/// Prefill, batched decode and the growing conversation on `engine`; the
/// timed parts of prefill and decode marked on `marks`.
pub fn engine<D: Device>(
    engine: &mut Engine<D>,
    o: &EngineBenchOptions,
    marks: &mut Marks,
) -> Result<EngineBench, BackendError> {
    let prefill = prefill(engine, o.prefill_tokens, marks)?;
    let decode = o
        .batches
        .iter()
        .map(|&b| {
            let r = decode(engine, b, o.decode_context, o.decode_steps, marks)?;
            Ok((b, r))
        })
        .collect::<Result<_, BackendError>>()?;
    let (conversation, mean_warm_secs) = conversation(engine, o.turns, o.turn_tokens)?;
    Ok(EngineBench {
        prefill,
        decode,
        conversation,
        mean_warm_secs,
    })
}

/// Timed passes of the prefill measurement, after one untimed pass.
pub const PREFILL_PASSES: usize = 3;

/// One prompt of exactly `n` tokens into an empty cache, the mean of
/// [`PREFILL_PASSES`] passes after one untimed: the first pass of a process
/// also pays for faulting in the activations' memory, which every later
/// pass reuses (`llama-bench` likewise warms up and averages five runs).
fn prefill<D: Device>(
    engine: &Engine<D>,
    n: usize,
    marks: &mut Marks,
) -> Result<Rate, BackendError> {
    let mut toks = engine.encode(&filler(n * 2, 0))?;
    toks.truncate(n);
    let pass = || {
        engine.forward(&mut [BatchItem {
            tokens: &toks,
            cache: &mut Default::default(),
        }])
    };
    pass()?;
    let secs = marks.timed(|| {
        let t = Instant::now();
        for _ in 0..PREFILL_PASSES {
            pass()?;
        }
        Ok(t.elapsed().as_secs_f64())
    })?;
    Ok(Rate {
        tokens: toks.len(),
        secs: secs / PREFILL_PASSES as f64,
    })
}

/// `b` sequences with distinct `context`-token prompts, `steps` decode
/// steps each (the prompts are prefilled a few at a time, so a long
/// context at a large batch does not need all its activations at once).
fn decode<D: Device>(
    engine: &Engine<D>,
    b: usize,
    context: usize,
    steps: usize,
    marks: &mut Marks,
) -> Result<Rate, BackendError> {
    let mut prompts = Vec::with_capacity(b);
    for i in 0..b {
        let mut p = engine.encode(&filler(context * 2 + 36, i + 1))?;
        p.truncate(context);
        prompts.push(p);
    }
    let mut caches: Vec<D::Cache> = (0..b).map(|_| D::Cache::default()).collect();
    let per_forward = (16_384 / context.max(1)).max(1);
    for (ps, cs) in prompts
        .chunks(per_forward)
        .zip(caches.chunks_mut(per_forward))
    {
        let mut items: Vec<BatchItem<'_, D::Cache>> = ps
            .iter()
            .zip(cs.iter_mut())
            .map(|(p, cache)| BatchItem { tokens: p, cache })
            .collect();
        engine.forward(&mut items)?;
    }
    // Greedy steps as the scheduler runs them: the next tokens picked on
    // the device (a GPU copies back token ids, not a vocabulary of logits
    // a row) and fed to the next step.
    let mut feed: Vec<[u32; 1]> = (0..b).map(|i| [(i as u32 * 17 + 220) % 1000]).collect();
    let secs = marks.timed(|| {
        let t = Instant::now();
        for _ in 0..steps {
            let mut items: Vec<BatchItem<'_, D::Cache>> = feed
                .iter()
                .zip(caches.iter_mut())
                .map(|(f, cache)| BatchItem { tokens: f, cache })
                .collect();
            let next = engine.forward_greedy(&mut items)?;
            for (f, t) in feed.iter_mut().zip(next) {
                f[0] = t;
            }
        }
        Ok(t.elapsed().as_secs_f64())
    })?;
    Ok(Rate {
        tokens: b * steps,
        secs,
    })
}

/// A conversation that re-sends its whole transcript every turn: with
/// prefix reuse only the new tokens are prefilled; cold, all of them are.
/// Returns five sampled turns both ways (all of them cold takes minutes)
/// and the mean seconds per turn with reuse.
fn conversation<D: Device>(
    engine: &mut Engine<D>,
    turns: usize,
    reply_tokens: usize,
) -> Result<(Vec<TurnCost>, f64), BackendError> {
    let mut messages = vec![Message::new(
        Role::System,
        "You keep a ledger of work orders.".to_string(),
    )];
    let session = engine.open_session();
    let mut warm = Vec::new();
    let mut transcripts = Vec::new();
    for turn in 0..turns {
        messages.push(Message::new(
            Role::User,
            format!("Turn {}: {}", turn + 1, filler(20, turn)),
        ));
        let req = ChatRequest::greedy(messages.clone(), reply_tokens);
        transcripts.push(req.clone());
        let t = Instant::now();
        let reply = engine.chat(session, req)?;
        warm.push((t.elapsed().as_secs_f64(), reply.usage));
        messages.push(Message::new(Role::Assistant, reply.content));
    }
    let n = turns;
    let mut sample: Vec<usize> = [1, n / 4, n / 2, 3 * n / 4, n]
        .into_iter()
        .filter(|&t| t >= 1 && t <= n)
        .collect();
    sample.dedup();
    let mut costs = Vec::new();
    for t in sample {
        let s = engine.open_session();
        let start = Instant::now();
        let cold = engine.chat(s, transcripts[t - 1].clone())?;
        let cold_secs = start.elapsed().as_secs_f64();
        engine.close_session(s);
        let (warm_secs, warm_usage) = warm[t - 1];
        costs.push(TurnCost {
            turn: t,
            warm_secs,
            warm: warm_usage,
            cold_secs,
            cold: cold.usage,
        });
    }
    let mean = warm.iter().map(|w| w.0).sum::<f64>() / n.max(1) as f64;
    Ok((costs, mean))
}

/// Replies and bookings per (seed, arm, turn) of a run directory.
fn transcripts(d: &Path) -> Result<Vec<String>, CellError> {
    let mut v: Vec<String> = read_turns(d)?
        .into_iter()
        .map(|t| serde_json::json!([t.seed, t.arm, t.turn, t.replies, t.bookings]).to_string())
        .collect();
    v.sort();
    Ok(v)
}

/// One arm's rates in the cell benchmark.
#[derive(Debug, Clone)]
pub struct ArmRates {
    /// The arm's name, or `all`.
    pub arm: String,
    /// The arm's episodes over the wall time every arm shared.
    pub batched_per_hour: f64,
    /// The arm's episodes over the time they took, one at a time.
    pub sequential_per_hour: f64,
    /// Share of the batched run's prompt tokens served from cache.
    pub cached_share: f64,
}

/// A live cell batched against one episode-arm at a time.
#[derive(Debug, Clone)]
pub struct CellBench {
    pub cell: CellConfig,
    pub model: String,
    pub batched_secs: f64,
    pub sequential_secs: f64,
    /// Whether both runs wrote the same replies and bookings.
    pub identical: bool,
    /// Per arm, then `all`.
    pub arms: Vec<ArmRates>,
}

/// Runs `cell` with every episode-arm live at once, then one at a time, in
/// run directories under `scratch` (removed afterwards).
pub fn cell(
    client: Client,
    model: ModelIdentity,
    cell: CellConfig,
    scratch: &Path,
) -> Result<CellBench, CellError> {
    let parts = CellParts::model(client, model.clone(), cell.thinking);
    let total = cell.episodes as usize * cell.arms.len();
    let mut walls = Vec::new();
    for (name, workers) in [("batched", total), ("sequential", 1)] {
        let dir = scratch.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        let t = Instant::now();
        run_cell(&cell, &parts, None, &dir, workers, true)?;
        walls.push((dir, t.elapsed().as_secs_f64()));
    }
    let runs: Vec<RunRead> = walls
        .iter()
        .map(|(d, _)| read_run(d))
        .collect::<Result<_, _>>()?;
    let identical = transcripts(&walls[0].0)? == transcripts(&walls[1].0)?;
    let (batched_secs, sequential_secs) = (walls[0].1, walls[1].1);
    let (mut prompt, mut cached) = (0usize, 0usize);
    let mut arms = Vec::new();
    for arm in &cell.arms {
        let of = |r: &RunRead| -> Vec<_> {
            r.episodes
                .iter()
                .filter(|e| e.arm == *arm)
                .cloned()
                .collect()
        };
        let (b, q) = (of(&runs[0]), of(&runs[1]));
        let seq_s: f64 = q.iter().map(|e| e.wall_s).sum();
        let p: usize = b.iter().map(|e| e.usage.prompt_tokens).sum();
        let c: usize = b.iter().map(|e| e.usage.cached_tokens).sum();
        prompt += p;
        cached += c;
        arms.push(ArmRates {
            arm: Arm::name(*arm).to_string(),
            batched_per_hour: b.len() as f64 / batched_secs * 3600.0,
            sequential_per_hour: q.len() as f64 / seq_s.max(1e-9) * 3600.0,
            cached_share: c as f64 / p.max(1) as f64,
        });
    }
    arms.push(ArmRates {
        arm: "all".into(),
        batched_per_hour: total as f64 / batched_secs * 3600.0,
        sequential_per_hour: total as f64 / sequential_secs * 3600.0,
        cached_share: cached as f64 / prompt.max(1) as f64,
    });
    let _ = std::fs::remove_dir_all(scratch);
    Ok(CellBench {
        cell,
        model: model.name,
        batched_secs,
        sequential_secs,
        identical,
        arms,
    })
}

/// A grid in one process against its cells one after another.
#[derive(Debug, Clone)]
pub struct GridBench {
    pub cells: Vec<CellConfig>,
    pub model: String,
    /// Episode-arms in flight at most, in both runs.
    pub live: usize,
    pub grid_secs: f64,
    pub sequence_secs: f64,
    /// Episode-arms in the grid.
    pub episode_arms: usize,
    /// Whether both runs wrote the same replies and bookings.
    pub identical: bool,
}

impl GridBench {
    pub fn grid_per_hour(&self) -> f64 {
        self.episode_arms as f64 / self.grid_secs * 3600.0
    }
    pub fn sequence_per_hour(&self) -> f64 {
        self.episode_arms as f64 / self.sequence_secs * 3600.0
    }
}

/// Runs `cells` as one grid (one pool of `live` workers over every cell),
/// then as a sequence of cells (each with its own pool of `live`), in run
/// directories under `scratch` (removed afterwards).
pub fn grid(
    client: Client,
    model: ModelIdentity,
    cells: Vec<CellConfig>,
    live: usize,
    scratch: &Path,
) -> Result<GridBench, CellError> {
    let parts: Vec<CellParts> = cells
        .iter()
        .map(|c| CellParts::model(client.clone(), model.clone(), c.thinking))
        .collect();
    let dir = |run: &str, i: usize| scratch.join(run).join(format!("cell{i}"));
    let _ = std::fs::remove_dir_all(scratch);
    let t = Instant::now();
    let jobs: Vec<CellJob> = cells
        .iter()
        .zip(&parts)
        .enumerate()
        .map(|(i, (c, p))| CellJob {
            name: format!("cell{i}"),
            cfg: c.clone(),
            parts: p,
            out: dir("grid", i),
            seeds: None,
            locking: Locking::Own,
        })
        .collect();
    let bar = progress_bar(true);
    run_cells(&jobs, None, live, &bar)?;
    bar.finish();
    let grid_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for (i, (c, p)) in cells.iter().zip(&parts).enumerate() {
        run_cell(c, p, None, &dir("sequence", i), live, true)?;
    }
    let sequence_secs = t.elapsed().as_secs_f64();
    let mut identical = true;
    for i in 0..cells.len() {
        identical &= transcripts(&dir("grid", i))? == transcripts(&dir("sequence", i))?;
    }
    let _ = std::fs::remove_dir_all(scratch);
    Ok(GridBench {
        episode_arms: cells
            .iter()
            .map(|c| c.episodes as usize * c.arms.len())
            .sum(),
        cells,
        model: model.name,
        live,
        grid_secs,
        sequence_secs,
        identical,
    })
}
