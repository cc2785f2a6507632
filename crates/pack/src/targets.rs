//! Detection and segmentation targets for `pack --coco FILE` and `--masks DIR`
//! (`proto/targets.md`): COCO instances JSON and per-image PNG label maps in, each packed sample's
//! record of `targets.rft` out.
//!
//! - `--coco`: the samples are the JSON's `images`, in ascending `id` (torchvision's
//!   `CocoDetection` order), each `IMAGES/file_name`; its `annotations`' `bbox` (`[x, y, w, h]`)
//!   become xyxy boxes, computed in `f32` as torchvision's `convert_bounding_box_format` does
//!   (`x + w` of two `f32`s), with `category_id` as the label. `iscrowd: 1` annotations are
//!   left out (torchvision's detection references drop crowds). An image without annotations
//!   has no boxes. Targets 1.1: when the annotations have a `segmentation` (polygons or RLE),
//!   each box's instance mask is stored as runs at the stored image's size ([`ringfeed_source::instances`]);
//!   when they have `keypoints` (`[x, y, v] * K`), each box's `K` points. Either is all or
//!   nothing: an annotation without what the others have, or with another `K`, stops the pack.
//! - `--masks DIR`: each sample's label map is `DIR/<stem>.png` (VOC style: the stem of the
//!   image's file name), an 8-bit grey or palette PNG (palette indices are the labels) of the
//!   stored image's size; it is stored re-encoded as 8-bit grey.
//!
//! Everything is checked where it is read: a malformed annotation stops the pack before any
//! image is read, naming the file and the annotation; a missing or mis-sized mask is a
//! per-sample failure naming the image and the mask file (`--on-error`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ringfeed_decode::Decoder;
use ringfeed_decode::labels::{decode_labels, encode_grey_png};
use ringfeed_source::listing::{InputKind, Item, Origin, Plan};

use crate::PackError;

/// What `pack` reads targets from (both `None`: a dataset without `targets.rft`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetsInput {
    /// A COCO instances JSON: the samples and their boxes.
    pub coco: Option<PathBuf>,
    /// A directory of `<stem>.png` label maps, one per image.
    pub masks: Option<PathBuf>,
}

impl TargetsInput {
    pub fn is_some(&self) -> bool {
        self.coco.is_some() || self.masks.is_some()
    }
}

/// One sample's targets as read from the inputs, before they are checked against its image.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampleBoxes {
    pub boxes: Vec<[f32; 4]>,
    pub labels: Vec<i64>,
    /// Each box's `segmentation` (checked in form; rasterised once the image's size is known).
    pub segmentations: Vec<serde_json::Value>,
    /// Each box's keypoints, box by box (`K` each).
    pub keypoints: Vec<[f32; 3]>,
    /// Each box's annotation, named for a per-sample error (`annotations[k] (id i)`).
    pub names: Vec<String>,
}

/// A COCO instances file, read and checked.
#[derive(Debug)]
pub struct Coco {
    /// `(id, file_name)` in ascending id.
    pub images: Vec<(i64, String)>,
    /// Each image's boxes, in the order of `images`.
    pub boxes: Vec<SampleBoxes>,
    /// The `categories` array as given (compact JSON), or `""` when absent.
    pub categories: String,
    /// Crowd annotations left out.
    pub crowds: u64,
    /// Whether the annotations have instance masks (`segmentation`).
    pub instances: bool,
    /// Keypoints per annotation (0: none).
    pub keypoints: u32,
}

fn malformed(path: &Path, what: String) -> PackError {
    PackError::Setting(format!(
        "{}: {what} (--coco takes a COCO instances file: `images` with `id` and `file_name`, `annotations` with `image_id`, `bbox` [x, y, w, h] and `category_id`)",
        path.display()
    ))
}

impl Coco {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, PackError> {
        let text = std::fs::read(path).map_err(|e| PackError::Io {
            path: path.to_owned(),
            source: e,
        })?;
        let doc: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| malformed(path, format!("not JSON: {e}")))?;
        let list = |name: &str| -> Result<&Vec<serde_json::Value>, PackError> {
            match doc.get(name) {
                Some(serde_json::Value::Array(a)) => Ok(a),
                None if name == "annotations" => Ok(const { &Vec::new() }),
                _ => Err(malformed(path, format!("`{name}` is not an array"))),
            }
        };
        let mut by_id: BTreeMap<i64, (String, SampleBoxes)> = BTreeMap::new();
        for (k, img) in list("images")?.iter().enumerate() {
            let id = img.get("id").and_then(serde_json::Value::as_i64);
            let name = img.get("file_name").and_then(serde_json::Value::as_str);
            let (Some(id), Some(name)) = (id, name) else {
                return Err(malformed(
                    path,
                    format!("images[{k}] has no integer `id` and string `file_name`"),
                ));
            };
            if by_id.insert(id, (name.to_owned(), SampleBoxes::default())).is_some() {
                return Err(malformed(path, format!("images[{k}]: image id {id} appears twice")));
            }
        }
        let mut crowds = 0;
        // What the first kept annotation has (its name, segmentation, keypoints per box): the
        // others must have the same.
        let mut first: Option<(String, bool, Option<usize>)> = None;
        for (k, ann) in list("annotations")?.iter().enumerate() {
            let at = || {
                let id = ann.get("id").map_or(String::new(), |id| format!(" (id {id})"));
                format!("annotations[{k}]{id}")
            };
            let image_id = ann
                .get("image_id")
                .and_then(serde_json::Value::as_i64)
                .ok_or_else(|| malformed(path, format!("{} has no integer `image_id`", at())))?;
            let Some((name, target)) = by_id.get_mut(&image_id) else {
                return Err(malformed(
                    path,
                    format!("{}: image_id {image_id} is not in `images`", at()),
                ));
            };
            match ringfeed_source::targets::coco_box(ann) {
                Ok(Some((b, label))) => {
                    let seg = ann.get("segmentation");
                    if let Some(seg) = seg {
                        ringfeed_source::instances::check(seg)
                            .map_err(|e| malformed(path, format!("{} of image {name:?}: {e}", at())))?;
                    }
                    let kps = match ann.get("keypoints") {
                        None => None,
                        Some(v) => Some(
                            ringfeed_source::targets::coco_keypoints(v)
                                .map_err(|e| malformed(path, format!("{} of image {name:?}: {e}", at())))?,
                        ),
                    };
                    let has = (seg.is_some(), kps.as_ref().map(Vec::len));
                    match &first {
                        None => first = Some((at(), has.0, has.1)),
                        Some((f, s0, k0)) if (*s0, *k0) != has => {
                            let say = |s: bool, k: Option<usize>| {
                                format!(
                                    "{} and {}",
                                    if s { "a `segmentation`" } else { "no `segmentation`" },
                                    k.map_or("no `keypoints`".to_owned(), |k| format!("{k} keypoints"))
                                )
                            };
                            return Err(malformed(
                                path,
                                format!(
                                    "{} of image {name:?} has {}, {f} has {} (keypoint count mismatch or a missing segmentation: every annotation has the same)",
                                    at(),
                                    say(has.0, has.1),
                                    say(*s0, *k0)
                                ),
                            ));
                        }
                        Some(_) => {}
                    }
                    target.boxes.push(b);
                    target.labels.push(label);
                    target.segmentations.extend(seg.cloned());
                    target.keypoints.extend(kps.unwrap_or_default());
                    target.names.push(at());
                }
                Ok(None) => crowds += 1,
                Err(e) => return Err(malformed(path, format!("{} of image {name:?}: {e}", at()))),
            }
        }
        let categories = match doc.get("categories") {
            None => String::new(),
            Some(c @ serde_json::Value::Array(a)) if a.iter().all(serde_json::Value::is_object) => c.to_string(),
            Some(_) => return Err(malformed(path, "`categories` is not an array of objects".to_owned())),
        };
        let (images, boxes) = by_id.into_iter().map(|(id, (name, b))| ((id, name), b)).unzip();
        let (instances, keypoints) = first.map_or((false, 0), |(_, s, k)| (s, k.unwrap_or(0) as u32));
        Ok(Coco {
            images,
            boxes,
            categories,
            crowds,
            instances,
            keypoints,
        })
    }

    /// The samples to pack: `images_dir/file_name` for each image, key `file_name`, no label,
    /// metadata `{"image_id": id}`.
    pub fn plan(&self, images_dir: &Path) -> Plan {
        let items = self
            .images
            .iter()
            .map(|(id, name)| Item {
                key: name.as_bytes().to_vec(),
                label: -1,
                meta: serde_json::json!({ "image_id": id }).to_string().into_bytes(),
                origin: Origin::File(images_dir.join(name)),
            })
            .collect();
        Plan {
            kind: InputKind::Manifest,
            items,
            classes: Vec::new(),
            problems: Vec::new(),
            ignored: 0,
            lmdb: None,
            rows: None,
        }
    }
}

/// Each box's instance mask of `sample` as encoded runs on its `width`×`height` stored image;
/// the error is the sample's failure reason, naming the annotation.
pub fn instance_runs(sample: &SampleBoxes, width: u32, height: u32) -> Result<Vec<Vec<u8>>, String> {
    sample
        .segmentations
        .iter()
        .zip(&sample.names)
        .map(|(seg, name)| {
            let runs = ringfeed_source::instances::runs(seg, width, height).map_err(|e| format!("{name}: {e}"))?;
            let mut out = Vec::new();
            ringfeed_format::targets::rle::encode_runs(&runs, &mut out);
            Ok(out)
        })
        .collect()
}

/// The mask file of the sample keyed `key`: `masks/<stem of the key's file name>.png`.
pub fn mask_path(masks: &Path, key: &[u8]) -> PathBuf {
    let key = String::from_utf8_lossy(key);
    let name = key.rsplit(['/', '\\']).next().unwrap_or(&key);
    let stem = Path::new(name)
        .file_stem()
        .map_or_else(|| name.into(), |s| s.to_string_lossy());
    masks.join(format!("{stem}.png"))
}

/// Reads, checks and re-encodes the mask of the sample keyed `key` whose stored image is
/// `data`; the error is the sample's failure reason, naming the mask file.
pub fn read_mask(
    decoder: &mut Decoder,
    masks: &Path,
    key: &[u8],
    data: &[u8],
    max_pixels: u64,
    scratch: &mut Vec<u8>,
) -> Result<Vec<u8>, String> {
    let path = mask_path(masks, key);
    let png = std::fs::read(&path).map_err(|e| {
        format!(
            "its mask {}: {e} (--masks DIR holds DIR/<stem>.png for every image)",
            path.display()
        )
    })?;
    let (w, h) = decode_labels(&png, max_pixels, scratch).map_err(|e| format!("its mask {}: {e}", path.display()))?;
    let image = decoder.probe(data).map_err(|e| e.to_string())?;
    if (w, h) != (image.width, image.height) {
        return Err(format!(
            "its mask {} is {w}x{h} pixels, the image is {}x{} (a label map has the image's size)",
            path.display(),
            image.width,
            image.height
        ));
    }
    Ok(encode_grey_png(w, h, scratch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(json: &str) -> Result<Coco, PackError> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        std::fs::write(&p, json).unwrap();
        Coco::load(&p)
    }

    #[test]
    fn boxes_become_xyxy_in_id_order_and_crowds_are_dropped() {
        let c = load(
            r#"{"images": [{"id": 9, "file_name": "b.jpg"}, {"id": 2, "file_name": "a.jpg"}, {"id": 5, "file_name": "c.jpg"}],
                "annotations": [
                  {"id": 1, "image_id": 9, "bbox": [1.5, 2, 3, 4.25], "category_id": 7},
                  {"id": 2, "image_id": 9, "bbox": [0, 0, 1, 1], "category_id": 3, "iscrowd": 1},
                  {"id": 3, "image_id": 2, "bbox": [10, 20, 0, 5], "category_id": 1}],
                "categories": [{"id": 1, "name": "a"}]}"#,
        )
        .unwrap();
        assert_eq!(
            c.images,
            vec![(2, "a.jpg".into()), (5, "c.jpg".into()), (9, "b.jpg".into())]
        );
        assert_eq!(c.boxes[0].boxes, vec![[10.0, 20.0, 10.0, 25.0]]);
        assert!(c.boxes[1].boxes.is_empty(), "an image without annotations has no boxes");
        assert_eq!(
            (c.boxes[2].boxes.clone(), c.boxes[2].labels.clone()),
            (vec![[1.5, 2.0, 4.5, 6.25]], vec![7])
        );
        assert_eq!(c.crowds, 1);
        assert_eq!(c.categories, r#"[{"id":1,"name":"a"}]"#);
    }

    #[test]
    fn malformed_annotations_name_the_file_and_the_annotation() {
        let imgs = r#""images": [{"id": 1, "file_name": "x.jpg"}]"#;
        for (ann, want) in [
            (
                r#"{"id": 4, "image_id": 1, "bbox": [0, 0, -1, 2], "category_id": 1}"#,
                "annotations[0] (id 4) of image \"x.jpg\"",
            ),
            (
                r#"{"image_id": 1, "bbox": [0, 0, 1], "category_id": 1}"#,
                "`bbox` is not four numbers",
            ),
            (
                r#"{"image_id": 3, "bbox": [0, 0, 1, 1], "category_id": 1}"#,
                "image_id 3 is not in `images`",
            ),
            (r#"{"image_id": 1, "bbox": [0, 0, 1, 1]}"#, "no integer `category_id`"),
        ] {
            let e = load(&format!(r#"{{{imgs}, "annotations": [{ann}]}}"#))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && e.contains("a.json"), "{e}");
        }
    }

    #[test]
    fn mask_paths_use_the_stem() {
        assert_eq!(
            mask_path(Path::new("/m"), b"sub/2007_000032.jpg"),
            Path::new("/m/2007_000032.png")
        );
    }
}
