//! 1.10 detection and segmentation targets of an image stream (control.md, "Detection and
//! segmentation targets (1.10)"; ring.md): `open.targets` checked once, each sample's targets
//! read from its source, and their ring bytes.
//!
//! [`StreamTargets::parse`] checks `open.targets` against the source (where boxes and masks come
//! from: `ringfeed_source::targets`) and the pipeline (one view of one image), and fixes the ring
//! fields `boxes`, `box_labels`, `box_count`, `mask`, `instance_masks` (each box's mask, eight to
//! a byte: bit `b` of plane `p` is box `8p + b`'s) and `keypoints`. The pool calls [`StreamTargets::read`]
//! with the sample's [`Extra`] (from the same read as its image, so targets follow their sample
//! through the order, ranks, skips and resume), has the ops move the targets with the image, and
//! writes [`StreamTargets::encode`]'s bytes. What is missing or malformed is an error for that
//! sample (the pool puts it under `on_error`), naming the sample's value and the setting.

use ringfeed_decode::labels::decode_labels;
use ringfeed_format::control::TargetsRequest;
use ringfeed_format::ring::{DType, FieldDesc, FieldSpec};
use ringfeed_format::targets::{LabelMap, Targets};
use ringfeed_ops::{Pipeline, TargetOptions};
use ringfeed_source::targets::TargetsFrom;
use ringfeed_source::{Extra, Source};

/// `open.targets.max_boxes`' bound.
pub const MAX_MAX_BOXES: u32 = 4096;
/// The ring fields, in [`StreamTargets::specs`] order (those a stream has).
pub const BOXES: &str = "boxes";
pub const BOX_LABELS: &str = "box_labels";
pub const BOX_COUNT: &str = "box_count";
pub const MASK: &str = "mask";
pub const INSTANCE_MASKS: &str = "instance_masks";
pub const KEYPOINTS: &str = "keypoints";

/// Where [`StreamTargets::write`] puts a sample's bytes: `field(k)` is its `sample_bytes` of
/// desc `k` of [`StreamTargets::descs`] (the pool: the sample's part of the slot's field).
pub trait FieldBytes {
    /// The sample's bytes of desc `k`.
    fn field(&mut self, k: usize) -> &mut [u8];
}

/// A stream's targets, checked, with their places in the ring once it exists.
#[derive(Debug)]
pub struct StreamTargets {
    from: TargetsFrom,
    /// Room per sample for boxes (0: the stream has no boxes).
    max_boxes: u32,
    /// The view's output `(height, width)`: the mask's shape.
    size: (u32, u32),
    /// Whether the stream delivers each box's instance mask.
    instances: bool,
    /// Keypoints per box the stream delivers (0: none).
    keypoints: u32,

    /// How the ops' last step sanitises the moved boxes, and what uncovered mask pixels become.
    pub options: TargetOptions,
    check_crc: bool,
    max_pixels: u64,
    /// The ring fields, in [`StreamTargets::specs`] order (set by [`StreamTargets::bind`]).
    descs: Vec<FieldDesc>,
}

impl StreamTargets {
    /// Checks `open.targets` (absent: `Ok(None)`) for `source` and `pipeline`; `taken`: the
    /// stream's other ring fields. The error is a `bad_request` message naming the member.
    pub fn parse(
        req: Option<&TargetsRequest>,
        source: &dyn Source,
        pipeline: &Pipeline,
        taken: &[String],
        check_crc: bool,
        max_pixels: u64,
    ) -> Result<Option<Self>, String> {
        let Some(req) = req else {
            return Ok(None);
        };
        if pipeline.views.len() != 1 || pipeline.views[0].count != 1 {
            return Err(format!(
                "targets go with a pipeline of one view of one image; this one makes {} images per sample (views and their count)",
                pipeline.outputs()
            ));
        }
        let from = TargetsFrom::parse(req.boxes.as_deref(), req.mask.as_deref(), source)?;
        let max_boxes = match (&from.boxes, req.max_boxes) {
            (None, Some(_)) => return Err("targets.max_boxes is for boxes; give targets.boxes".to_owned()),
            (None, None) => 0,
            (Some(_), Some(m)) => m,
            (Some(ringfeed_source::targets::BoxesFrom::Stored), None) => {
                source.stored_targets().map_or(1, |t| t.header.max_boxes.max(1))
            }
            (Some(_), None) => {
                return Err(
                    "targets.max_boxes: give the room per sample for boxes (1..=4096); only a packed dataset's targets know their largest count"
                        .to_owned(),
                );
            }
        };
        if from.boxes.is_some() && !(1..=MAX_MAX_BOXES).contains(&max_boxes) {
            return Err(format!("targets.max_boxes {max_boxes} is outside 1..={MAX_MAX_BOXES}"));
        }
        let number = |name: &str, v: Option<f64>| -> Result<f64, String> {
            match v {
                None => Ok(1.0),
                Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
                Some(x) => Err(format!("targets.{name} {x} must be a finite number >= 0")),
            }
        };
        let options = TargetOptions {
            min_size: number("min_size", req.min_size)?,
            min_area: number("min_area", req.min_area)?,
            mask_fill: match req.mask_fill {
                None => 0,
                Some(f) => u8::try_from(f).map_err(|_| format!("targets.mask_fill {f} is outside 0..=255"))?,
            },
        };
        let stored = source.stored_targets().map(|t| t.header);
        let stored_boxes = matches!(from.boxes, Some(ringfeed_source::targets::BoxesFrom::Stored));
        // WebDataset annotations carry their own segmentations and keypoints; each sample's are
        // checked as it is read (a missing one is that sample's error, naming the annotation).
        let annotations = matches!(from.boxes, Some(ringfeed_source::targets::BoxesFrom::Annotations(_)));
        let instances = req.instance_masks.unwrap_or(false);
        if instances && !annotations && !(stored_boxes && stored.is_some_and(|h| h.has_instances())) {
            return Err(format!(
                "targets.instance_masks: {} has no stored instance masks; they come with targets.boxes \"stored\" of a dataset packed with `ringfeed pack --coco FILE` whose annotations have a `segmentation`, or with WebDataset annotations (targets.boxes \"json\" or \"json:KEY\")",
                source.describe()
            ));
        }
        let keypoints = req.keypoints.unwrap_or(0);
        if keypoints > 0 && !annotations {
            let have = if stored_boxes {
                stored.map_or(0, |h| h.keypoints)
            } else {
                0
            };
            if have != keypoints {
                return Err(format!(
                    "targets.keypoints {keypoints}: {} has {}; they come with targets.boxes \"stored\" of a dataset packed with `ringfeed pack --coco FILE` whose annotations have `keypoints`, or with WebDataset annotations (targets.boxes \"json\" or \"json:KEY\")",
                    source.describe(),
                    if have == 0 {
                        "no stored keypoints".to_owned()
                    } else {
                        format!("{have} keypoints per box")
                    }
                ));
            }
        }
        let mut from = from;
        (from.instances, from.keypoints) = (instances, keypoints);
        let out = StreamTargets {
            from,
            max_boxes,
            size: pipeline.views[0].size,
            instances,
            keypoints,
            options,
            check_crc,
            max_pixels,
            descs: Vec::new(),
        };
        if let Some(name) = out
            .specs()
            .iter()
            .map(|s| s.name.to_string())
            .find(|n| taken.contains(n))
        {
            return Err(format!(
                "targets: the ring field {name:?} is taken by a view or a sample field of the stream; rename it"
            ));
        }
        Ok(Some(out))
    }

    /// Whether the stream delivers boxes.
    pub fn has_boxes(&self) -> bool {
        self.from.boxes.is_some()
    }

    /// Whether the stream delivers a mask.
    pub fn has_mask(&self) -> bool {
        self.from.mask.is_some()
    }

    /// The ring fields (ring.md): `boxes`, `box_labels`, `box_count` with boxes, `mask` with a
    /// mask.
    pub fn specs(&self) -> Vec<FieldSpec> {
        let spec = |name: &'static str, dtype, shape| FieldSpec {
            name: name.into(),
            dtype,
            shape,
        };
        let mut out = Vec::new();
        if self.has_boxes() {
            out.push(spec(BOXES, DType::F32, vec![self.max_boxes, 4]));
            out.push(spec(BOX_LABELS, DType::I64, vec![self.max_boxes]));
            out.push(spec(BOX_COUNT, DType::I32, vec![]));
        }
        if self.has_mask() {
            out.push(spec(MASK, DType::U8, vec![self.size.0, self.size.1]));
        }
        if self.instances {
            out.push(spec(
                INSTANCE_MASKS,
                DType::U8,
                vec![self.max_boxes.div_ceil(8), self.size.0, self.size.1],
            ));
        }
        if self.keypoints > 0 {
            out.push(spec(KEYPOINTS, DType::F32, vec![self.max_boxes, self.keypoints, 3]));
        }
        out
    }

    /// Finds each ring field in the made ring.
    pub fn bind(&mut self, field: &dyn Fn(&str) -> Option<FieldDesc>) {
        self.descs = self
            .specs()
            .iter()
            .map(|s| field(&s.name).expect("the ring holds every targets field"))
            .collect();
    }

    /// Every ring field of the targets (for writing and for slot compaction).
    pub fn descs(&self) -> &[FieldDesc] {
        &self.descs
    }

    /// Reads sample `index`'s targets into `out`, in the stored image's pixels: boxes (at most
    /// `max_boxes`), labels, the mask decoded, the instance masks painted into bit planes, the
    /// keypoints (the ops check the maps' sizes against the image's, which they probe anyway).
    /// `size` probes the stored image's `(width, height)` from its header (WebDataset instance
    /// masks are rasterised at it). `png` is scratch. The error names the value and the setting.
    pub fn read(
        &self,
        source: &dyn Source,
        index: u64,
        extra: &Extra<'_>,
        size: &mut dyn FnMut() -> Result<(u32, u32), String>,
        out: &mut Targets,
        png: &mut Vec<u8>,
    ) -> Result<(), String> {
        self.from.read(source, index, extra, self.check_crc, size, out, png)?;
        if self.has_boxes() && out.boxes.len() > self.max_boxes as usize {
            return Err(format!(
                "the sample has {} boxes, more than targets.max_boxes = {}; raise max_boxes",
                out.boxes.len(),
                self.max_boxes
            ));
        }
        if self.has_mask() {
            let mut labels = Vec::new();
            let (w, h) = decode_labels(png, self.max_pixels, &mut labels).map_err(|e| format!("targets.mask: {e}"))?;
            out.mask = Some(LabelMap {
                width: w,
                height: h,
                data: labels,
            });
        }
        Ok(())
    }

    /// Writes one sample's bytes of each of [`StreamTargets::descs`] from its targets moved to
    /// the view's output: boxes padded with zeros, labels with `-1`, the count, the mask (which
    /// must have the view's size), the instance-mask planes, the keypoints, each straight into
    /// `out.field(k)` (the slot: no copy of a mask is made on the way). On error some fields may
    /// be written: the sample fails.
    pub fn write(&self, moved: &Targets, out: &mut dyn FieldBytes) -> Result<(), String> {
        // The descs' order: boxes, box_labels, box_count, mask, instance_masks, keypoints, each
        // where asked for (`descs`).
        let mut k = 0;
        let mut next = || {
            k += 1;
            k - 1
        };
        if self.has_boxes() {
            let m = self.max_boxes as usize;
            if moved.boxes.len() > m || moved.labels.len() != moved.boxes.len() {
                return Err(format!(
                    "{} boxes and {} labels after the ops, for room of {m}",
                    moved.boxes.len(),
                    moved.labels.len()
                ));
            }
            let boxes = out.field(next());
            boxes.fill(0);
            for (o, b) in boxes.chunks_exact_mut(16).zip(&moved.boxes) {
                for (j, v) in b.iter().enumerate() {
                    o[4 * j..4 * j + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
            let labels = out.field(next());
            for (j, o) in labels.chunks_exact_mut(8).enumerate() {
                o.copy_from_slice(&moved.labels.get(j).copied().unwrap_or(-1i64).to_le_bytes());
            }
            out.field(next())
                .copy_from_slice(&(moved.boxes.len() as i32).to_le_bytes());
        }
        if self.has_mask() {
            let (h, w) = self.size;
            match &moved.mask {
                Some(mk) if (mk.height, mk.width) == (h, w) => out.field(next()).copy_from_slice(&mk.data),
                Some(mk) => {
                    return Err(format!(
                        "the mask is {}x{} after the ops, the view is {w}x{h}",
                        mk.width, mk.height
                    ));
                }
                None => return Err("the sample has no mask after the ops".to_owned()),
            }
        }
        if self.instances {
            let (h, w) = self.size;
            let plane = h as usize * w as usize;
            if moved.instances.len() != moved.boxes.len().div_ceil(8) {
                return Err(format!(
                    "{} instance-mask planes for {} boxes after the ops",
                    moved.instances.len(),
                    moved.boxes.len()
                ));
            }
            if let Some(m) = moved.instances.iter().find(|m| (m.height, m.width) != (h, w)) {
                return Err(format!(
                    "the instance masks are {}x{} after the ops, the view is {w}x{h}",
                    m.width, m.height
                ));
            }
            let bytes = out.field(next());
            for (p, m) in moved.instances.iter().enumerate() {
                bytes[p * plane..(p + 1) * plane].copy_from_slice(&m.data);
            }
            bytes[moved.instances.len() * plane..].fill(0);
        }
        if self.keypoints > 0 {
            let per = self.keypoints as usize;
            if moved.keypoints.len() != moved.boxes.len() * per {
                return Err(format!(
                    "{} keypoints for {} boxes after the ops, {per} per box",
                    moved.keypoints.len(),
                    moved.boxes.len()
                ));
            }
            let bytes = out.field(next());
            bytes.fill(0);
            for (o, p) in bytes.chunks_exact_mut(12).zip(&moved.keypoints) {
                for (j, v) in p.iter().enumerate() {
                    o[4 * j..4 * j + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl StreamTargets {
        /// [`StreamTargets::write`] into buffers of each field's size, as the slot's are, whose
        /// bytes start as `0xAA` (so padding the write leaves out shows).
        fn encode(&self, moved: &Targets) -> Result<Vec<Vec<u8>>, String> {
            let mut out: Vec<Vec<u8>> = self
                .specs()
                .iter()
                .map(|f| vec![0xAA; f.sample_bytes().unwrap() as usize])
                .collect();
            self.write(moved, &mut out)?;
            Ok(out)
        }
    }

    impl FieldBytes for Vec<Vec<u8>> {
        fn field(&mut self, k: usize) -> &mut [u8] {
            &mut self[k]
        }
    }

    /// The image-size probe of a stream whose targets are all stored (it is never asked).
    fn no_probe() -> Result<(u32, u32), String> {
        unreachable!("stored targets need no probe")
    }

    fn pipeline(json: serde_json::Value) -> Pipeline {
        Pipeline::parse(&json).unwrap()
    }

    fn packed_with_targets(dir: &std::path::Path, boxes: bool, masks: bool) -> ringfeed_source::PackedSource {
        let mut w = ringfeed_format::shard::DatasetWriter::create(dir, Default::default()).unwrap();
        let mut t = ringfeed_format::targets::TargetsWriter::create(&dir.join("targets.rft"), boxes, masks).unwrap();
        let png = ringfeed_decode::labels::encode_grey_png(4, 3, &[1; 12]);
        for i in 0..3u8 {
            w.push(&[b'k', i], -1, b"", &ringfeed_testkit::jpeg(4, 3, u64::from(i)))
                .unwrap();
            let n = usize::from(i);
            let b: Vec<[f32; 4]> = (0..n).map(|k| [k as f32, 0.0, k as f32 + 1.0, 2.0]).collect();
            let l: Vec<i64> = (0..n as i64).collect();
            t.push(
                if boxes { &b } else { &[] },
                if boxes { &l } else { &[] },
                masks.then_some(&png[..]),
            )
            .unwrap();
        }
        w.finish(&[], "{}").unwrap();
        t.finish("").unwrap();
        ringfeed_source::PackedSource::open(dir, true).unwrap()
    }

    fn req(json: serde_json::Value) -> TargetsRequest {
        serde_json::from_value(json).unwrap()
    }

    /// A packed dataset of three samples (0, 1 and 2 boxes) and a one-view 6x8 pipeline.
    fn setup(boxes: bool, masks: bool) -> (tempfile::TempDir, ringfeed_source::PackedSource, Pipeline) {
        let dir = tempfile::tempdir().unwrap();
        let src = packed_with_targets(dir.path(), boxes, masks);
        let p = pipeline(serde_json::json!({"views": [{"ops": [{"op": "resize", "size": [6, 8]}]}]}));
        (dir, src, p)
    }

    fn parse(
        src: &dyn Source,
        p: &Pipeline,
        j: serde_json::Value,
        taken: &[String],
    ) -> Result<Option<StreamTargets>, String> {
        StreamTargets::parse(Some(&req(j)), src, p, taken, true, 1 << 20)
    }

    #[test]
    fn stored_targets_take_max_boxes_from_the_file_and_encode_padded() {
        let (_dir, src, p) = setup(true, true);
        let t = parse(&src, &p, serde_json::json!({"boxes": "stored", "mask": "stored"}), &[])
            .unwrap()
            .unwrap();
        let names: Vec<String> = t.specs().iter().map(|s| s.name.to_string()).collect();
        assert_eq!(names, ["boxes", "box_labels", "box_count", "mask"]);
        assert_eq!(t.specs()[0].shape, vec![2, 4], "max_boxes is the file's largest count");
        assert_eq!(t.specs()[3].shape, vec![6, 8]);
        let (mut out, mut png) = (Targets::default(), Vec::new());
        t.read(&src, 2, &Extra::None, &mut no_probe, &mut out, &mut png)
            .unwrap();
        assert_eq!(out.boxes, vec![[0.0, 0.0, 1.0, 2.0], [1.0, 0.0, 2.0, 2.0]]);
        assert_eq!(out.mask.as_ref().unwrap().data, vec![1; 12]);
        // Moved to the output: one box left, the mask at the view's size.
        let moved = Targets {
            boxes: vec![[1.0, 2.0, 3.0, 4.0]],
            labels: vec![7],
            mask: Some(LabelMap::filled(8, 6, 5)),
            ..Targets::default()
        };
        let bytes = t.encode(&moved).unwrap();
        assert_eq!(bytes[0].len(), 32);
        assert_eq!(&bytes[0][..16], [1f32, 2.0, 3.0, 4.0].map(f32::to_le_bytes).concat());
        assert_eq!(&bytes[0][16..], [0u8; 16]);
        assert_eq!(bytes[1], [7i64, -1].map(i64::to_le_bytes).concat());
        assert_eq!(bytes[2], 1i32.to_le_bytes());
        assert_eq!(bytes[3], vec![5; 48]);
        let e = t
            .encode(&Targets {
                mask: Some(LabelMap::filled(6, 8, 0)),
                ..moved
            })
            .unwrap_err();
        assert!(e.contains("after the ops"), "{e}");
    }

    #[test]
    fn bad_requests_name_the_member() {
        let (_dir, src, one) = setup(true, false);
        let two = pipeline(serde_json::json!({"views": [
            {"name": "a", "ops": [{"op": "resize", "size": [4, 4]}]},
            {"name": "b", "ops": [{"op": "resize", "size": [4, 4]}]}]}));
        for (j, p, want) in [
            (serde_json::json!({"boxes": "stored"}), &two, "one view of one image"),
            (serde_json::json!({}), &one, "give `boxes`, `mask` or both"),
            (serde_json::json!({"mask": "stored"}), &one, "has no stored masks"),
            (
                serde_json::json!({"boxes": "json"}),
                &one,
                "cannot serve targets from members",
            ),
            (
                serde_json::json!({"boxes": "stored", "max_boxes": 0}),
                &one,
                "max_boxes 0 is outside 1..=4096",
            ),
            (
                serde_json::json!({"boxes": "stored", "mask_fill": 256}),
                &one,
                "mask_fill 256",
            ),
            (
                serde_json::json!({"boxes": "stored", "min_size": -1.0}),
                &one,
                "targets.min_size -1",
            ),
        ] {
            let e = parse(&src, p, j.clone(), &["label".to_owned()])
                .map(|_| ())
                .unwrap_err();
            assert!(e.contains(want), "{j}: {e}");
        }
        let e = parse(
            &src,
            &one,
            serde_json::json!({"boxes": "stored"}),
            &["box_count".to_owned()],
        )
        .unwrap_err();
        assert!(e.contains("\"box_count\" is taken"), "{e}");
    }

    /// A packed dataset of two 4x3 samples with instance masks and two keypoints per box.
    fn packed_with_instances(dir: &std::path::Path) -> ringfeed_source::PackedSource {
        use ringfeed_format::targets::{InstancesIn, rle};
        let mut w = ringfeed_format::shard::DatasetWriter::create(dir, Default::default()).unwrap();
        let mut t =
            ringfeed_format::targets::TargetsWriter::create_with(&dir.join("targets.rft"), true, false, true, 2)
                .unwrap();
        for i in 0..2u8 {
            w.push(&[b'k', i], -1, b"", &ringfeed_testkit::jpeg(4, 3, u64::from(i)))
                .unwrap();
            // Sample i has i + 1 boxes; box k's mask is pixel k (column-major).
            let n = usize::from(i) + 1;
            let runs: Vec<Vec<u8>> = (0..n as u32)
                .map(|k| {
                    let mut b = Vec::new();
                    rle::encode_runs(&[k, 1, 11 - k], &mut b);
                    b
                })
                .collect();
            let boxes: Vec<[f32; 4]> = (0..n).map(|_| [0.0, 0.0, 2.0, 2.0]).collect();
            let kps: Vec<[f32; 3]> = (0..2 * n).map(|k| [k as f32, 1.0, 2.0]).collect();
            let inst = InstancesIn {
                width: 4,
                height: 3,
                runs: &runs,
            };
            t.push_all(&boxes, &vec![1; n], None, Some(inst), &kps).unwrap();
        }
        w.finish(&[], "{}").unwrap();
        t.finish("").unwrap();
        ringfeed_source::PackedSource::open(dir, true).unwrap()
    }

    #[test]
    fn stored_instances_and_keypoints_are_read_as_bit_planes_and_encoded_padded() {
        let dir = tempfile::tempdir().unwrap();
        let src = packed_with_instances(dir.path());
        let p = pipeline(serde_json::json!({"views": [{"ops": [{"op": "resize", "size": [3, 4]}]}]}));
        let j = serde_json::json!({"boxes": "stored", "instance_masks": true, "keypoints": 2, "max_boxes": 9});
        let t = parse(&src, &p, j, &[]).unwrap().unwrap();
        let specs: Vec<(String, Vec<u32>)> = t
            .specs()
            .iter()
            .map(|s| (s.name.to_string(), s.shape.clone()))
            .collect();
        assert_eq!(
            specs[3],
            ("instance_masks".to_owned(), vec![2, 3, 4]),
            "ceil(9 / 8) planes"
        );
        assert_eq!(specs[4], ("keypoints".to_owned(), vec![9, 2, 3]));
        let (mut out, mut png) = (Targets::default(), Vec::new());
        t.read(&src, 1, &Extra::None, &mut no_probe, &mut out, &mut png)
            .unwrap();
        assert_eq!(out.instances.len(), 1);
        // Box 0 is pixel (0, 0), box 1 pixel (0, 1) (column-major 1): bits 0 and 1.
        assert_eq!(out.instances[0].get(0, 0), 1);
        assert_eq!(out.instances[0].get(0, 1), 2);
        assert_eq!(out.instances[0].data.iter().filter(|&&v| v != 0).count(), 2);
        assert_eq!(out.keypoints.len(), 4);
        let bytes = t.encode(&out).unwrap();
        assert_eq!(bytes[3].len(), 2 * 12);
        assert_eq!(&bytes[3][..12], &out.instances[0].data[..]);
        assert!(bytes[3][12..].iter().all(|&v| v == 0), "the second plane is padding");
        assert_eq!(bytes[4].len(), 9 * 2 * 12);
        assert_eq!(&bytes[4][12..24], [1f32, 1.0, 2.0].map(f32::to_le_bytes).concat());
        assert!(bytes[4][48..].iter().all(|&v| v == 0));
        // Another K, or instance masks from a file without them, are refused naming the member.
        let e = parse(&src, &p, serde_json::json!({"boxes": "stored", "keypoints": 17}), &[]).unwrap_err();
        assert!(
            e.contains("targets.keypoints 17") && e.contains("2 keypoints per box"),
            "{e}"
        );
        let (_dir2, plain, _) = setup(true, false);
        let e = parse(
            &plain,
            &p,
            serde_json::json!({"boxes": "stored", "instance_masks": true}),
            &[],
        )
        .unwrap_err();
        assert!(e.contains("targets.instance_masks") && e.contains("--coco"), "{e}");
    }

    #[test]
    fn more_boxes_than_max_boxes_is_the_samples_failure() {
        let (_dir, src, p) = setup(true, false);
        let t = parse(&src, &p, serde_json::json!({"boxes": "stored", "max_boxes": 1}), &[])
            .unwrap()
            .unwrap();
        let (mut out, mut png) = (Targets::default(), Vec::new());
        t.read(&src, 1, &Extra::None, &mut no_probe, &mut out, &mut png)
            .unwrap();
        let e = t
            .read(&src, 2, &Extra::None, &mut no_probe, &mut out, &mut png)
            .unwrap_err();
        assert!(e.contains("2 boxes, more than targets.max_boxes = 1"), "{e}");
    }
}
