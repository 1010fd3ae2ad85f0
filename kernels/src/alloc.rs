//! The process's allocator, for the weights' sake: buffers of 2 MiB and more
//! start on a 2 MiB boundary, and those allocated inside [`huge_pages`] are
//! advised onto Linux's transparent huge pages before their first touch.
//!
//! Decode reads every weight once a step. On 4 KiB pages that is a TLB miss
//! and a page walk every 4 KiB (seven blocks of sixteen rows), which the
//! prefetches wait on; on 2 MiB pages the walks all but vanish (decode
//! measured 1.10–1.15× at batch 1 and 1.07–1.14× at batch 4 on an Intel
//! Xeon). Most distributions hand out huge pages only where a program asks
//! (`transparent_hugepage/enabled` is `madvise`), so the engine asks for
//! its weights. Other buffers stay on small pages: a KV cache grows a
//! little at a time, and each of its buffers would hold up to 2 MiB more
//! memory than it uses.
//!
//! A binary opts in with
//! `#[global_allocator] static A: statebench_kernels::alloc::HugePages = HugePages;`;
//! without it (or off Linux) [`huge_pages`] changes nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A transparent huge page on x86-64 and most aarch64 kernels.
const HUGE: usize = 2 << 20;

/// Open [`huge_pages`] scopes, on any thread.
static ADVISING: AtomicUsize = AtomicUsize::new(0);

/// [`System`], with large buffers placed and advised for huge pages.
pub struct HugePages;

/// Runs `f` with the buffers of 2 MiB and more that any thread allocates
/// meanwhile advised onto huge pages (where [`HugePages`] is the allocator).
pub fn huge_pages<R>(f: impl FnOnce() -> R) -> R {
    struct Open;
    impl Drop for Open {
        fn drop(&mut self) {
            ADVISING.fetch_sub(1, Ordering::Relaxed);
        }
    }
    ADVISING.fetch_add(1, Ordering::Relaxed);
    let _open = Open;
    f()
}

/// The layout asked of [`System`] for `l`: a function of `l` alone, so that
/// a buffer is freed with the layout it was allocated with.
fn placed(l: Layout) -> Layout {
    if cfg!(target_os = "linux") && l.size() >= HUGE && l.align() < HUGE {
        Layout::from_size_align(l.size(), HUGE).unwrap_or(l)
    } else {
        l
    }
}

/// Advises `p` (allocated as `l`, already [`placed`]) onto huge pages if a
/// [`huge_pages`] scope is open; advice only, so a refusal is ignored.
fn advise(p: *mut u8, l: Layout) {
    #[cfg(target_os = "linux")]
    if !p.is_null() && l.align() >= HUGE && ADVISING.load(Ordering::Relaxed) > 0 {
        // SAFETY: `p` starts a live allocation of `l.size()` bytes on a
        // page boundary; the advice covers its whole pages and changes no
        // contents. A partial last page is shared only with memory the
        // allocator keeps, where the advice is as harmless.
        unsafe {
            libc::madvise(
                p as *mut libc::c_void,
                l.size().next_multiple_of(4096),
                libc::MADV_HUGEPAGE,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, l);
}

// SAFETY: every block comes from `System` with the layout `placed` gives,
// and goes back to it with the same (a function of the caller's layout).
unsafe impl GlobalAlloc for HugePages {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let big = placed(l);
        let p = System.alloc(big);
        advise(p, big);
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let big = placed(l);
        if big == l {
            return System.alloc_zeroed(l);
        }
        // Advised before the zeros touch it, so it faults in huge pages.
        let p = self.alloc(l);
        if !p.is_null() {
            std::ptr::write_bytes(p, 0, l.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, placed(l))
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        let new = Layout::from_size_align_unchecked(new_size, l.align());
        if placed(l) == l && placed(new) == new {
            return System.realloc(p, l, new_size);
        }
        // Across or above the 2 MiB line: a new block, placed as its size
        // asks, and the old one freed as it was placed.
        let q = self.alloc(new);
        if !q.is_null() {
            std::ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
            self.dealloc(p, l);
        }
        q
    }
}

/// This process's memory on transparent huge pages, in bytes, and the
/// host's setting for them (`always`, `madvise` or `never`); `None` where
/// Linux does not say.
pub fn huge_page_use() -> Option<(u64, String)> {
    let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let setting = setting.split_once('[')?.1.split_once(']')?.0.to_string();
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let kb: u64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some((kb << 10, setting))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every size class go back with the layout they came with,
    /// zeroed where asked, and keep their contents across a move over the
    /// 2 MiB line either way.
    #[test]
    fn blocks_round_trip_across_the_line() {
        let a = HugePages;
        for size in [1, 4096, HUGE - 1, HUGE, 3 * HUGE + 5] {
            let l = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: a valid, non-zero layout; the block is freed once.
            unsafe {
                let p = huge_pages(|| a.alloc_zeroed(l));
                assert!(!p.is_null());
                assert!(std::slice::from_raw_parts(p, size).iter().all(|&b| b == 0));
                if cfg!(target_os = "linux") && size >= HUGE {
                    assert_eq!(p as usize % HUGE, 0, "{size} bytes on a huge page boundary");
                }
                for i in 0..size.min(4096) {
                    *p.add(i) = i as u8;
                }
                let grown = 2 * HUGE + size;
                let q = a.realloc(p, l, grown);
                assert!((0..size.min(4096)).all(|i| *q.add(i) == i as u8));
                let back = a.realloc(
                    q,
                    Layout::from_size_align(grown, 8).unwrap(),
                    size.min(4096),
                );
                assert!((0..size.min(4096)).all(|i| *back.add(i) == i as u8));
                a.dealloc(back, Layout::from_size_align(size.min(4096), 8).unwrap());
            }
        }
    }
}
