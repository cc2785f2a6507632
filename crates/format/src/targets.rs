//! A sample's detection and segmentation targets as plain data (control.md, "Detection and
//! segmentation targets (1.10)"): what a source reads (a packed dataset's `targets.rft`, a
//! WebDataset sample's members), what the ops move with the image, and what the server writes
//! into the ring's `boxes`, `box_labels`, `box_count` and `mask` fields.
//!
//! # Layout
//! - [`file`]: the packed dataset's `targets.rft` (`proto/targets.md`): writer, reader, verifier.

pub mod file;

pub use file::{TARGETS_FILE, TargetsFile, TargetsReport, TargetsWriter, verify_targets};

/// Boxes and a label map of one image, in the pixel coordinates of the image they go with (the
/// stored image before the ops; the view's output after them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Targets {
    /// Boxes as `[x0, y0, x1, y1]` (xyxy, pixels, `x0 <= x1`, `y0 <= y1`).
    pub boxes: Vec<[f32; 4]>,
    /// Each box's category, `labels.len() == boxes.len()`.
    pub labels: Vec<i64>,
    /// A semantic label map the size of the image, if the sample has one.
    pub mask: Option<LabelMap>,
}

impl Targets {
    /// Removes every box, its label and the mask, keeping the allocations.
    pub fn clear(&mut self) {
        self.boxes.clear();
        self.labels.clear();
        self.mask = None;
    }
}

/// A label map: one `u8` label per pixel, row-major.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelMap {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `width * height` labels, row by row.
    pub data: Vec<u8>,
}

impl LabelMap {
    /// A map of `width x height` pixels all labelled `fill`.
    pub fn filled(width: u32, height: u32, fill: u8) -> Self {
        LabelMap {
            width,
            height,
            data: vec![fill; width as usize * height as usize],
        }
    }

    /// The label at `(x, y)`.
    #[inline]
    pub fn get(&self, x: u32, y: u32) -> u8 {
        self.data[y as usize * self.width as usize + x as usize]
    }
}
