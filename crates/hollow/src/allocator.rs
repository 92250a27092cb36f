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
/// freed pages on jemalloc's decay schedule even where the fleet's own threads have stopped allocating, which
/// after a pod burst otherwise leaves the freed pages resident (what that saves: docs/density.md, "The
/// allocator").
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

/// jemalloc's own figures on `/metrics`, read at every scrape: `hollow_heap_bytes{kind=...}` with `allocated`
/// (live allocations), `active` (the pages those allocations' size classes occupy), `metadata` (jemalloc's own
/// bookkeeping), `resident` (pages jemalloc holds in memory: active, dirty pages not yet returned, metadata) and
/// `retained` (address space kept for reuse, not resident). Beside the process's resident memory they split it
/// into live heap, allocator overhead and the rest (code pages, stacks).
#[cfg(all(feature = "jemalloc", not(feature = "dhat-heap")))]
#[derive(Debug)]
pub(crate) struct HeapCollector;

#[cfg(all(feature = "jemalloc", not(feature = "dhat-heap")))]
impl HeapCollector {
    /// Each figure by name, after jemalloc refreshed its statistics (`None`: jemalloc did not answer).
    fn read() -> Option<[(&'static str, usize); 5]> {
        use tikv_jemalloc_ctl::{epoch, stats};
        epoch::advance().ok()?;
        Some([
            ("allocated", stats::allocated::read().ok()?),
            ("active", stats::active::read().ok()?),
            ("metadata", stats::metadata::read().ok()?),
            ("resident", stats::resident::read().ok()?),
            ("retained", stats::retained::read().ok()?),
        ])
    }
}

#[cfg(all(feature = "jemalloc", not(feature = "dhat-heap")))]
impl prometheus_client::collector::Collector for HeapCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let Some(figures) = Self::read() else {
            return Ok(());
        };
        let mut family = encoder.encode_descriptor(
            "hollow_heap_bytes",
            "The fleet's heap as its allocator (jemalloc) counts it, by kind",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (kind, bytes) in figures {
            let labels = [("kind", kind)];
            prometheus_client::metrics::gauge::ConstGauge::new(bytes as i64)
                .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
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

    #[test]
    fn the_heap_figures_are_on_metrics_in_order() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(super::HeapCollector));
        let keep = std::hint::black_box(vec![1u8; 1 << 20]);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        drop(std::hint::black_box(keep));
        let value = |kind: &str| -> u64 {
            let prefix = format!("hollow_heap_bytes{{kind=\"{kind}\"}} ");
            let line = text
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("{kind} in {text}"));
            line[prefix.len()..].parse().expect("a number")
        };
        // a megabyte held while the figures were read is among the allocated bytes
        assert!(value("allocated") >= 1 << 20, "{text}");
        assert!(value("active") >= value("allocated"), "{text}");
        assert!(value("resident") >= value("active"), "{text}");
        assert!(value("metadata") > 0, "{text}");
    }
}
