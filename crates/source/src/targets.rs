//! 1.10: where a sample's detection and segmentation targets come from, and reading them
//! (control.md, "Detection and segmentation targets (1.10)").
//!
//! A packed dataset packed with targets holds them in its `targets.rft` ([`Source::stored_targets`]:
//! `"stored"`); a WebDataset sample holds them in its members, read from the same
//! [`Extra`] as its image (boxes: a JSON member `EXT` or `EXT:KEY` whose value is a list of COCO
//! annotation objects; mask: a PNG member). Other sources have none. What is missing or malformed
//! is an error string for that sample, which the caller names and puts under `on_error`.
//!
//! A WebDataset annotation's instance mask (its `segmentation`: polygons, or RLE compressed or
//! not) and keypoints (`[x, y, v] * K`) are read by the code `ringfeed pack --coco` stores them
//! with ([`crate::instances`], [`coco_keypoints`]): the mask is rasterised at the stored image's
//! size (the caller probes the image's header, decoding nothing) and painted into the bit planes
//! a stored record's runs are painted into, so both paths deliver the same targets.
//!
//! Boxes come out as xyxy (`[x, y, x + w, y + h]` in `f32`, as torchvision converts COCO's
//! `bbox`); the mask comes out as its PNG bytes, which the caller decodes (this crate decodes no
//! images).

use crate::fields::{FieldFrom, Value, values};
use crate::{Extra, FieldKind, Source};
use ringfeed_format::targets::Targets;

/// The `open.targets` value that means "the packed dataset's `targets.rft`".
pub const STORED: &str = "stored";

/// Where a stream's boxes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoxesFrom {
    /// A packed dataset's `targets.rft`.
    Stored,
    /// A WebDataset JSON member (or a key of one) holding a list of COCO annotations.
    Annotations(FieldFrom),
}

/// Where a stream's label maps come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaskFrom {
    /// A packed dataset's `targets.rft`.
    Stored,
    /// A WebDataset member (a PNG), by extension.
    Member(FieldFrom),
}

/// Where a stream's targets come from, checked against its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetsFrom {
    pub boxes: Option<BoxesFrom>,
    pub mask: Option<MaskFrom>,
    /// Whether to read the stored boxes' instance masks (1.1 files; set by the caller, which
    /// checked that the file has them).
    pub instances: bool,
    /// Keypoints per box to read (0: none; the caller checked that stored boxes have this many,
    /// and each WebDataset annotation must).
    pub keypoints: u32,
}

impl TargetsFrom {
    /// Parses `open.targets`' `boxes` and `mask` for `source`. The error is a `bad_request`
    /// message naming the member.
    pub fn parse(boxes: Option<&str>, mask: Option<&str>, source: &dyn Source) -> Result<Self, String> {
        if boxes.is_none() && mask.is_none() {
            return Err("targets: give `boxes`, `mask` or both".to_owned());
        }
        let stored = source.stored_targets();
        let members = source.field_kind() == Some(FieldKind::Members);
        let refuse = |member: &str, value: &str| -> String {
            if value == STORED {
                format!(
                    "targets.{member} \"stored\": {} has no stored {member}s (pack it with `ringfeed pack --coco FILE`{} to store them)",
                    source.describe(),
                    if member == "mask" { " --masks DIR" } else { "" }
                )
            } else {
                format!(
                    "targets.{member} {value:?}: {} cannot serve targets from members; targets come from a packed dataset (\"stored\") or WebDataset members",
                    source.describe()
                )
            }
        };
        let boxes = match boxes {
            None => None,
            Some(STORED) if stored.is_some_and(|t| t.header.has_boxes()) => Some(BoxesFrom::Stored),
            Some(v) if v != STORED && members => {
                let from = FieldFrom::parse(v, FieldKind::Members).map_err(|e| format!("targets.boxes: {e}"))?;
                let json = match &from {
                    FieldFrom::Member(ext) | FieldFrom::JsonKey { ext, .. } => {
                        ext == b"json" || ext.ends_with(b".json")
                    }
                    _ => false,
                };
                if !json {
                    return Err(format!(
                        "targets.boxes {v:?}: boxes come from a JSON member (\"json\" or \"json:KEY\") holding a list of COCO annotations"
                    ));
                }
                Some(BoxesFrom::Annotations(from))
            }
            Some(v) => return Err(refuse("boxes", v)),
        };
        let mask = match mask {
            None => None,
            Some(STORED) if stored.is_some_and(|t| t.header.has_masks()) => Some(MaskFrom::Stored),
            Some(v) if v != STORED && members => match FieldFrom::parse(v, FieldKind::Members) {
                Ok(from @ FieldFrom::Member(_)) => Some(MaskFrom::Member(from)),
                Ok(_) => {
                    return Err(format!(
                        "targets.mask {v:?}: a mask is a whole member, named by its extension (\"png\")"
                    ));
                }
                Err(e) => return Err(format!("targets.mask: {e}")),
            },
            Some(v) => return Err(refuse("mask", v)),
        };
        Ok(TargetsFrom {
            boxes,
            mask,
            instances: false,
            keypoints: 0,
        })
    }

    /// Reads sample `index`'s targets into `targets` (boxes and labels, with [`TargetsFrom::instances`]
    /// and [`TargetsFrom::keypoints`] their instance masks and keypoints; the mask is left `None`)
    /// and its mask's PNG bytes into `mask_png` (cleared when the stream has no mask). `extra`
    /// is the sample's, from the same read as its image; `check_crc` checks a stored record's CRC;
    /// `size` gives the stored image's `(width, height)` (called only for WebDataset instance
    /// masks, which are rasterised at it).
    #[allow(clippy::too_many_arguments)]
    pub fn read(
        &self,
        source: &dyn Source,
        index: u64,
        extra: &Extra<'_>,
        check_crc: bool,
        size: &mut dyn FnMut() -> Result<(u32, u32), String>,
        targets: &mut Targets,
        mask_png: &mut Vec<u8>,
    ) -> Result<(), String> {
        targets.clear();
        mask_png.clear();
        let wants_stored = matches!(self.boxes, Some(BoxesFrom::Stored)) || matches!(self.mask, Some(MaskFrom::Stored));
        if wants_stored {
            let file = source
                .stored_targets()
                .ok_or_else(|| "the dataset has no targets.rft any more".to_owned())?;
            let s = file.get(index, check_crc).map_err(|e| e.to_string())?;
            if matches!(self.boxes, Some(BoxesFrom::Stored)) {
                targets.boxes.extend_from_slice(&s.boxes);
                targets.labels.extend_from_slice(&s.labels);
                if self.keypoints > 0 {
                    targets.keypoints.extend_from_slice(&s.keypoints);
                }
                if let (true, Some(inst)) = (self.instances, &s.instances) {
                    paint_instances(inst, &mut targets.instances)?;
                }
            }
            if matches!(self.mask, Some(MaskFrom::Stored)) {
                mask_png.extend_from_slice(s.mask_png);
            }
            if let Some(at) = file.fault() {
                return Err(format!(
                    "{} at byte {at}: the file changed on disk after it was opened; re-pack or restore the dataset",
                    file.path().display()
                ));
            }
        }
        if let Some(BoxesFrom::Annotations(from)) = &self.boxes {
            let v = values(extra, std::slice::from_ref(from)).remove(0);
            let v = v.map_err(|e| format!("targets.boxes {}: {e}", from.describe()))?;
            let json = match v {
                Value::Json(j) => j,
                Value::Text(bytes) => serde_json::from_slice(&bytes)
                    .map_err(|e| format!("targets.boxes {}: not JSON: {e}", from.describe()))?,
            };
            let want = Wanted {
                instances: self.instances,
                keypoints: self.keypoints,
            };
            annotation_targets(&json, want, size, targets)
                .map_err(|e| format!("targets.boxes {}: {e}", from.describe()))?;
        }
        if let Some(MaskFrom::Member(from)) = &self.mask {
            match values(extra, std::slice::from_ref(from)).remove(0) {
                Ok(Value::Text(bytes)) => mask_png.extend_from_slice(&bytes),
                Ok(Value::Json(_)) => return Err(format!("targets.mask {}: not a whole member", from.describe())),
                Err(e) => return Err(format!("targets.mask {}: {e}", from.describe())),
            }
        }
        Ok(())
    }
}

/// Paints a stored record's instance masks into bit planes of its size (box `k` is bit `k % 8`
/// of plane `k / 8`); the error names the box.
fn paint_instances(
    inst: &ringfeed_format::targets::StoredInstances<'_>,
    planes: &mut Vec<ringfeed_format::targets::LabelMap>,
) -> Result<(), String> {
    use ringfeed_format::targets::{LabelMap, rle};
    planes.clear();
    planes.extend((0..inst.runs.len().div_ceil(8)).map(|_| LabelMap::filled(inst.width, inst.height, 0)));
    let mut runs = Vec::new();
    for (k, r) in inst.runs.iter().enumerate() {
        rle::decode_runs(r, &mut runs)
            .and_then(|()| rle::paint_runs(&runs, &mut planes[k / 8], (k % 8) as u8))
            .map_err(|e| format!("targets.rft: box {k}'s instance mask: {e}"))?;
    }
    Ok(())
}

/// What [`annotation_targets`] reads besides boxes and labels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Each box's instance mask, from its annotation's `segmentation`.
    pub instances: bool,
    /// Keypoints per box, from its annotation's `keypoints` (0: none).
    pub keypoints: u32,
}

/// Appends what `want` asks for of a list of COCO annotation objects to `targets`: the boxes
/// and labels ([`coco_box`]; crowds are left out, with their masks and keypoints), each kept
/// box's instance mask (bit `k % 8` of plane `k / 8`, rasterised by [`crate::instances`] at
/// `size()`, the stored image's `(width, height)`, asked once and only when there is a mask to
/// paint) and its `want.keypoints` keypoints ([`coco_keypoints`]). The error names the
/// annotation (its place in the list, and its `id` when it has one).
pub fn annotation_targets(
    json: &serde_json::Value,
    want: Wanted,
    size: &mut dyn FnMut() -> Result<(u32, u32), String>,
    targets: &mut Targets,
) -> Result<(), String> {
    use ringfeed_format::targets::{LabelMap, rle};
    let list = json
        .as_array()
        .ok_or_else(|| "not a list of COCO annotation objects".to_owned())?;
    let mut image: Option<(u32, u32)> = None;
    for (k, ann) in list.iter().enumerate() {
        let name = || match ann.get("id") {
            Some(id) => format!("annotation {k} (id {id})"),
            None => format!("annotation {k}"),
        };
        let Some((b, label)) = coco_box(ann).map_err(|e| format!("{}: {e}", name()))? else {
            continue;
        };
        let j = targets.boxes.len();
        if want.instances {
            let seg = ann.get("segmentation").ok_or_else(|| {
                format!(
                    "{}: no `segmentation` (targets.instance_masks needs one in every annotation but crowds)",
                    name()
                )
            })?;
            crate::instances::check(seg).map_err(|e| format!("{}: {e}", name()))?;
            let (w, h) = match image {
                Some(s) => s,
                None => *image.insert(size()?),
            };
            let runs = crate::instances::runs(seg, w, h).map_err(|e| format!("{}: {e}", name()))?;
            if j.is_multiple_of(8) {
                targets.instances.push(LabelMap::filled(w, h, 0));
            }
            let plane = targets.instances.last_mut().expect("a plane per eight boxes");
            rle::paint_runs(&runs, plane, (j % 8) as u8).map_err(|e| format!("{}: {e}", name()))?;
        }
        if want.keypoints > 0 {
            let kps = ann.get("keypoints").ok_or_else(|| {
                format!(
                    "{}: no `keypoints` (targets.keypoints = {} needs them in every annotation but crowds)",
                    name(),
                    want.keypoints
                )
            })?;
            let kps = coco_keypoints(kps).map_err(|e| format!("{}: {e}", name()))?;
            if kps.len() != want.keypoints as usize {
                return Err(format!(
                    "{}: {} keypoints, targets.keypoints is {} (keypoint count mismatch)",
                    name(),
                    kps.len(),
                    want.keypoints
                ));
            }
            targets.keypoints.extend(kps);
        }
        targets.boxes.push(b);
        targets.labels.push(label);
    }
    Ok(())
}

/// An annotation's `keypoints`: `[x, y, v] * K` finite numbers, `K >= 1`, as `f32`.
/// `ringfeed pack --coco` reads them with it too.
pub fn coco_keypoints(v: &serde_json::Value) -> Result<Vec<[f32; 3]>, String> {
    let nums: Option<Vec<f64>> = v
        .as_array()
        .and_then(|a| a.iter().map(serde_json::Value::as_f64).collect());
    match nums {
        Some(n) if !n.is_empty() && n.len() % 3 == 0 && n.iter().all(|x| x.is_finite()) => Ok(n
            .chunks_exact(3)
            .map(|c| [c[0] as f32, c[1] as f32, c[2] as f32])
            .collect()),
        _ => Err("`keypoints` is not [x, y, v] * K finite numbers".to_owned()),
    }
}

/// One COCO annotation's box and label: its `bbox` `[x, y, w, h]` as xyxy `[x, y, x + w, y +
/// h]` (in `f32`, as torchvision's `convert_bounding_box_format` computes it) and its
/// `category_id`; `Ok(None)` for a crowd (`iscrowd: 1`, which torchvision's detection
/// references leave out). `ringfeed pack --coco` reads annotations with it too.
pub fn coco_box(ann: &serde_json::Value) -> Result<Option<([f32; 4], i64)>, String> {
    if ann.get("iscrowd").and_then(serde_json::Value::as_i64) == Some(1) {
        return Ok(None);
    }
    let category = ann
        .get("category_id")
        .and_then(serde_json::Value::as_i64)
        .ok_or_else(|| "no integer `category_id`".to_owned())?;
    let bbox: Option<Vec<f64>> = ann
        .get("bbox")
        .and_then(serde_json::Value::as_array)
        .filter(|b| b.len() == 4)
        .and_then(|b| b.iter().map(serde_json::Value::as_f64).collect());
    let b = bbox.ok_or_else(|| "`bbox` is not four numbers [x, y, w, h]".to_owned())?;
    let (x, y, w, h) = (b[0] as f32, b[1] as f32, b[2] as f32, b[3] as f32);
    if ![x, y, w, h].iter().all(|v| v.is_finite()) || w < 0.0 || h < 0.0 {
        return Err(format!("bbox {b:?} is not finite or has a negative width or height"));
    }
    Ok(Some(([x, y, x + w, y + h], category)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_size() -> Result<(u32, u32), String> {
        panic!("boxes alone need no image size")
    }

    #[test]
    fn annotations_become_xyxy_and_crowds_are_left_out() {
        let mut t = Targets::default();
        let json = serde_json::json!([
            {"bbox": [1.5, 2, 3, 4.25], "category_id": 7, "area": 3},
            {"bbox": [0, 0, 1, 1], "category_id": 3, "iscrowd": 1},
            {"bbox": [10, 20, 0, 5], "category_id": 1, "iscrowd": 0},
        ]);
        annotation_targets(&json, Wanted::default(), &mut no_size, &mut t).unwrap();
        assert_eq!(t.boxes, vec![[1.5, 2.0, 4.5, 6.25], [10.0, 20.0, 10.0, 25.0]]);
        assert_eq!(t.labels, vec![7, 1]);
    }

    #[test]
    fn malformed_annotations_are_named() {
        for (json, want) in [
            (serde_json::json!({"bbox": [0, 0, 1, 1]}), "not a list"),
            (
                serde_json::json!([{"bbox": [0, 0, 1, 1]}]),
                "annotation 0: no integer `category_id`",
            ),
            (
                serde_json::json!([{"bbox": [0, 0, 1], "category_id": 1}]),
                "annotation 0: `bbox` is not four numbers",
            ),
            (
                serde_json::json!([{"bbox": [0, 0, 1, -1], "category_id": 1}]),
                "negative width or height",
            ),
        ] {
            let e = annotation_targets(&json, Wanted::default(), &mut no_size, &mut Targets::default()).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn instance_masks_and_keypoints_follow_their_boxes() {
        // A square polygon (the pixels x 1..=3, y 1..=2), a crowd (left out with its mask and
        // keypoints), and an uncompressed RLE marking column 0 (runs in column-major order).
        let json = serde_json::json!([
            {"bbox": [1, 1, 3, 2], "category_id": 1, "segmentation": [[1, 1, 4, 1, 4, 3, 1, 3]],
             "keypoints": [1, 1, 2, 3, 2, 1]},
            {"bbox": [0, 0, 1, 1], "category_id": 9, "iscrowd": 1, "segmentation": {"counts": [30], "size": [5, 6]}},
            {"id": 12, "bbox": [0, 0, 1, 5], "category_id": 2, "segmentation": {"counts": [0, 5, 25], "size": [5, 6]},
             "keypoints": [0, 4, 2, 0.5, 0.5, 0]},
        ]);
        let mut t = Targets::default();
        let mut asked = 0;
        let mut size = || {
            asked += 1;
            Ok((6, 5))
        };
        let want = Wanted {
            instances: true,
            keypoints: 2,
        };
        annotation_targets(&json, want, &mut size, &mut t).unwrap();
        assert_eq!(asked, 1, "the image's size is asked once");
        assert_eq!(t.labels, [1, 2]);
        assert_eq!(
            t.keypoints,
            [[1.0, 1.0, 2.0], [3.0, 2.0, 1.0], [0.0, 4.0, 2.0], [0.5, 0.5, 0.0]]
        );
        assert_eq!(t.instances.len(), 1);
        let rows: Vec<String> = (0..5)
            .map(|y| (0..6).map(|x| char::from(b'0' + t.instances[0].get(x, y))).collect())
            .collect();
        assert_eq!(rows, ["200000", "211100", "211100", "200000", "200000"]);
    }

    #[test]
    fn bad_instance_annotations_are_named() {
        let want = Wanted {
            instances: true,
            keypoints: 1,
        };
        for (ann, msg) in [
            (
                serde_json::json!({"id": 4, "bbox": [0, 0, 1, 1], "category_id": 1, "keypoints": [0, 0, 2]}),
                "annotation 0 (id 4): no `segmentation`",
            ),
            (
                serde_json::json!({"bbox": [0, 0, 1, 1], "category_id": 1, "keypoints": [0, 0, 2],
                                   "segmentation": {"counts": [6], "size": [2, 3]}}),
                "annotation 0: its RLE `size` is [2, 3] (height, width), the image is 6x5",
            ),
            (
                serde_json::json!({"bbox": [0, 0, 1, 1], "category_id": 1, "keypoints": [0, 0, 2, 1, 1, 2],
                                   "segmentation": [[0, 0, 2, 0, 2, 2]]}),
                "annotation 0: 2 keypoints, targets.keypoints is 1",
            ),
            (
                serde_json::json!({"bbox": [0, 0, 1, 1], "category_id": 1, "keypoints": [0, 0],
                                   "segmentation": [[0, 0, 2, 0, 2, 2]]}),
                "annotation 0: `keypoints` is not [x, y, v] * K",
            ),
            (
                serde_json::json!({"bbox": [0, 0, 1, 1], "category_id": 1, "segmentation": [[0, 0, 2]]}),
                "annotation 0: `segmentation` polygon 0",
            ),
        ] {
            let e = annotation_targets(
                &serde_json::json!([ann]),
                want,
                &mut || Ok((6, 5)),
                &mut Targets::default(),
            )
            .unwrap_err();
            assert!(e.contains(msg), "{e}");
        }
    }
}
