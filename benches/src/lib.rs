//! Shared helpers for ringfeed's benchmarks.

/// Memory of this process, in KiB, from `/proc/self/status`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rss {
    /// Resident set size.
    pub total: u64,
    /// Private anonymous memory (heap, stacks): what a process really costs.
    pub anon: u64,
    /// Resident pages of mapped files: shared page cache, reclaimable.
    pub file: u64,
    /// Peak resident set size.
    pub peak: u64,
}

impl Rss {
    pub fn now() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Rss {
            total: field("VmRSS:"),
            anon: field("RssAnon:"),
            file: field("RssFile:"),
            peak: field("VmHWM:"),
        }
    }
}
