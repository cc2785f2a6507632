//! A sample's detection and segmentation targets as plain data (control.md, "Detection and
//! segmentation targets (1.10)"): what a source reads (a packed dataset's `targets.rft`, a
//! WebDataset sample's members), what the ops move with the image, and what the server writes
//! into the ring's `boxes`, `box_labels`, `box_count`, `mask` (1.11: `instance_masks`,
//! `keypoints`) fields.
//!
//! # Layout
//! - [`file`]: the packed dataset's `targets.rft` (`proto/targets.md`): writer, reader, verifier.
//! - [`rle`]: (targets 1.1) the instance masks' run-length encoding, and painting a run-length
//!   mask into a bit plane.

pub mod file;
pub mod rle;

pub use file::{InstancesIn, StoredInstances, TARGETS_FILE, TargetsFile, TargetsReport, TargetsWriter, verify_targets};

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
    /// Each box's instance mask, as bit planes the size of the image: bit `b` of plane `p` is
    /// box `8p + b`'s mask (`ceil(boxes.len() / 8)` planes; empty: no instance masks). Eight
    /// masks share one `u8` map so that the ops move them with the label map's own nearest
    /// kernels (each output pixel copies one source pixel or is fill), eight at a time.
    pub instances: Vec<LabelMap>,
    /// Each box's keypoints `[x, y, v]` (COCO's visibility `v`), box by box: `boxes.len() * K`
    /// (empty: no keypoints).
    pub keypoints: Vec<[f32; 3]>,
}

impl Targets {
    /// Removes every box, its label and the mask, keeping the allocations.
    pub fn clear(&mut self) {
        self.boxes.clear();
        self.labels.clear();
        self.mask = None;
        self.instances.clear();
        self.keypoints.clear();
    }

    /// Keypoints per box (0 without keypoints or boxes).
    pub fn keypoints_per_box(&self) -> usize {
        self.keypoints.len().checked_div(self.boxes.len()).unwrap_or(0)
    }

    /// Keeps the boxes for which `keep(box)` holds, in order, with their labels, keypoints and
    /// instance masks (whose bits are renumbered: the `k`-th kept box's mask becomes bit `k`).
    pub fn retain(&mut self, mut keep: impl FnMut(&[f32; 4]) -> bool) {
        // The common case keeps every box and allocates nothing (`keep` is a pure test).
        if self.boxes.iter().all(&mut keep) {
            return;
        }
        let kpb = self.keypoints_per_box();
        let n = self.boxes.len();
        let kept: Vec<usize> = (0..n).filter(|&i| keep(&self.boxes[i])).collect();
        for (k, &i) in kept.iter().enumerate() {
            self.boxes[k] = self.boxes[i];
            self.labels[k] = self.labels[i];
            if kpb > 0 {
                self.keypoints.copy_within(i * kpb..(i + 1) * kpb, k * kpb);
            }
        }
        self.boxes.truncate(kept.len());
        self.labels.truncate(kept.len());
        self.keypoints.truncate(kept.len() * kpb);
        if !self.instances.is_empty() {
            let (w, h) = (self.instances[0].width, self.instances[0].height);
            let mut planes: Vec<LabelMap> = (0..kept.len().div_ceil(8)).map(|_| LabelMap::filled(w, h, 0)).collect();
            for (k, &i) in kept.iter().enumerate() {
                let src = &self.instances[i / 8].data;
                let (sb, db) = (i % 8, k % 8);
                for (d, &s) in planes[k / 8].data.iter_mut().zip(src) {
                    *d |= ((s >> sb) & 1) << db;
                }
            }
            self.instances = planes;
        }
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
