//! The fleet's global allocator: jemalloc by default (the `jemalloc` feature), dhat's recording allocator
//! with `dhat-heap`, the system's with neither.

/// With the `dhat-heap` feature every allocation is recorded (slow: for profiling only); the profile of what is
/// live when the fleet is told to stop is written to `dhat-heap.json` (view it with dhat's viewer, or
/// `hack/dhat-top.py`).
#[cfg(feature = "dhat-heap")]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// jemalloc (the default `jemalloc` feature), see `Cargo.toml`.
#[cfg(all(feature = "jemalloc", not(feature = "dhat-heap")))]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Turns on jemalloc's background threads, unless `_RJEM_MALLOC_CONF` sets `background_thread` itself: they return
/// freed pages on jemalloc's decay schedule even where the fleet's own threads no longer allocate, which after a
/// pod burst otherwise leaves the freed pages resident (1,000 nodes × 5 pods: 3.3–3.6 KiB resident per running pod
/// with them, 3.9–4.0 without; docs/benchmarks.md).
#[cfg(all(feature = "jemalloc", not(feature = "dhat-heap")))]
pub(crate) fn background_threads() {
    let conf = std::env::var("_RJEM_MALLOC_CONF").unwrap_or_default();
    if conf.contains("background_thread") {
        return;
    }
    if let Err(error) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(%error, "jemalloc's background threads did not start: freed memory is returned only as the fleet allocates");
    }
}

#[cfg(all(test, feature = "jemalloc", not(feature = "dhat-heap")))]
mod tests {
    #[test]
    fn the_fleet_returns_freed_pages_through_jemallocs_background_threads() {
        let conf = std::env::var("_RJEM_MALLOC_CONF").unwrap_or_default();
        super::background_threads();
        let on = tikv_jemalloc_ctl::background_thread::read().expect("jemalloc answers");
        // a `background_thread` the user set in `_RJEM_MALLOC_CONF` is left as it is
        let want = !conf.contains("background_thread") || conf.contains("background_thread:true");
        assert_eq!(on, want, "_RJEM_MALLOC_CONF={conf:?}");
    }
}
