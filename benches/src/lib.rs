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

/// The benches' 224×224 picture as packed RGB8: smooth gradients with noise (so equalize and
/// autocontrast see a spread, and no op meets a flat image).
pub fn photo_224() -> Vec<u8> {
    let (w, h) = (224usize, 224usize);
    let mut out = Vec::with_capacity(w * h * 3);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for y in 0..h {
        for x in 0..w {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let n = (state % 32) as usize;
            out.extend_from_slice(&[
                ((x + n) % 256) as u8,
                ((y * 2 + n) % 256) as u8,
                ((x + y + n) % 256) as u8,
            ]);
        }
    }
    out
}
