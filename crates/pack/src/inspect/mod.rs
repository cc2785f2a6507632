//! `ringfeed inspect`: what is in a packed dataset (or an LMDB), in a form a person can read.
//!
//! Counts and sizes come from the index and record tables alone; formats and image sizes are
//! probed from at most [`FORMAT_PROBES`] evenly spaced samples, so inspecting a million-sample
//! dataset touches only a small part of its data.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

#[cfg(feature = "text")]
pub mod tokens;

use ringfeed_decode as codec;
use ringfeed_decode::{Decoder, Limits};
use ringfeed_format::shard::{Dataset, ShardError};
use ringfeed_source::lmdb::{LmdbOptions, LmdbSource};
use ringfeed_source::{Source, SourceError};

/// How many samples are probed for their format.
pub const FORMAT_PROBES: u64 = 2000;

/// Summary statistics of sample sizes, in bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SizeStats {
    pub min: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: f64,
    pub total: u64,
}

impl SizeStats {
    pub(crate) fn from(mut sizes: Vec<u64>) -> Self {
        if sizes.is_empty() {
            return SizeStats::default();
        }
        sizes.sort_unstable();
        let at = |q: f64| sizes[((sizes.len() - 1) as f64 * q).round() as usize];
        let total: u64 = sizes.iter().sum();
        SizeStats {
            min: sizes[0],
            p50: at(0.5),
            p99: at(0.99),
            max: sizes[sizes.len() - 1],
            mean: total as f64 / sizes.len() as f64,
            total,
        }
    }
}

/// One sample, described.
#[derive(Debug)]
pub struct SampleInfo {
    pub index: u64,
    pub key: String,
    pub label: i64,
    pub class: Option<String>,
    pub bytes: u64,
    /// The image's format, size, colour and depth, as probed; or why it does not probe.
    pub image: Result<String, codec::CodecError>,
    pub meta: Option<String>,
    /// Shard file, byte offset and CRC (packed datasets only).
    pub location: Option<(String, u64, u32)>,
    /// WebDataset: the tar, and every member of the sample (name, data offset, size).
    pub tar: Option<String>,
    pub members: Vec<(String, u64, u64)>,
}

/// What a WebDataset's member tables say, beyond the samples (`inspect` of tars).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WdsSummary {
    /// Regular members of every tar.
    pub members: u64,
    /// Extension (lowercase, after the key's first dot) → members with it.
    pub extensions: BTreeMap<String, u64>,
    /// The image extensions looked for, in order, and the label's extension (if any).
    pub image: String,
    pub label: Option<String>,
    /// Samples with an image member, and with a label member.
    pub with_image: u64,
    pub with_label: u64,
    /// The keys of the first and the last sample.
    pub first_key: String,
    pub last_key: String,
    /// Tars in a store: those whose member table came from their index file (`TAR.rfidx`),
    /// and those read whole to scan them.
    pub from_index: Option<(u64, u64)>,
}

impl WdsSummary {
    /// The summary of `cat`'s member tables.
    pub fn of(cat: &ringfeed_source::wds::Catalog) -> Self {
        let opts = cat.options();
        let mut out = WdsSummary {
            image: opts.image.iter().map(|e| lossy(e)).collect::<Vec<_>>().join(";"),
            label: opts.label.as_deref().map(lossy),
            first_key: cat.key_text(0),
            last_key: cat.key_text(cat.len().saturating_sub(1)),
            ..WdsSummary::default()
        };
        for t in 0..cat.tar_count() {
            for m in cat.members(t) {
                out.members += 1;
                let ext = ringfeed_source::wds::tar::split_key(&m.name)
                    .map_or_else(String::new, |(_, e)| lossy(&m.name[e]).to_ascii_lowercase());
                *out.extensions.entry(ext).or_insert(0) += 1;
            }
        }
        for i in 0..cat.len() {
            let m = cat.sample_members(i).expect("in range");
            out.with_image += u64::from(m.image.is_some());
            out.with_label += u64::from(m.label.is_some());
        }
        out
    }
}

/// Labels read: how many, their range and how many distinct values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelStats {
    pub read: u64,
    pub min: i64,
    pub max: i64,
    pub distinct: u64,
}

impl LabelStats {
    pub(crate) fn from(labels: &[i64]) -> Self {
        let distinct: std::collections::BTreeSet<i64> = labels.iter().copied().collect();
        LabelStats {
            read: labels.len() as u64,
            min: distinct.first().copied().unwrap_or(0),
            max: distinct.last().copied().unwrap_or(0),
            distinct: distinct.len() as u64,
        }
    }
}

/// Sample `index` of `cat` described, from `data`, its tar's bytes from byte `base` on (the
/// whole tar, or a ranged read of the sample's members): its key, label, image, members, and
/// its `json` member as metadata.
pub fn wds_sample_info(
    cat: &ringfeed_source::wds::Catalog,
    index: u64,
    data: &[u8],
    base: u64,
) -> Result<SampleInfo, InspectError> {
    let s = cat.lookup_window(index, data, base)?;
    let mut info = SampleInfo::new(index, s.key, s.label, s.data, &[]);
    let m = cat.sample_members(index).expect("looked up above");
    info.members = m.members.iter().map(|x| (lossy(&x.name), x.offset, x.size)).collect();
    info.tar = Some(cat.tar_name(m.tar as usize).display().to_string());
    info.meta = m
        .members
        .iter()
        .find(|x| x.name.ends_with(b".json"))
        .and_then(|x| {
            let from = usize::try_from(x.offset.checked_sub(base)?).ok()?;
            data.get(from..from + x.size as usize)
        })
        .map(lossy);
    Ok(info)
}

/// Everything `inspect` prints.
#[derive(Debug)]
pub struct Inspection {
    pub kind: String,
    pub path: String,
    pub samples: u64,
    pub shards: Option<u32>,
    pub files_bytes: Option<u64>,
    pub classes: Vec<(String, u64)>,
    pub sizes: SizeStats,
    /// Format name → count, over the probed samples.
    pub formats: BTreeMap<String, u64>,
    pub probed: u64,
    pub info: Option<serde_json::Value>,
    pub sample: Option<SampleInfo>,
    /// WebDataset tars: what their member tables say, and the labels read.
    pub webdataset: Option<WdsSummary>,
    pub labels: Option<LabelStats>,
    /// A packed dataset's `targets.rft` (`proto/targets.md`), when it has one.
    pub targets: Option<TargetsInspection>,
}

/// What a packed dataset's targets file holds, and the described sample's targets.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetsInspection {
    pub boxes: u64,
    /// The most boxes one sample has (read from the records, not the header).
    pub max_boxes: u32,
    /// Samples whose record holds a label map.
    pub masks: u64,
    /// Whether the boxes have instance masks (targets file 1.1).
    pub instances: bool,
    /// Keypoints per box (0: none).
    pub keypoints: u32,
    /// The stored categories (COCO's), as given.
    pub categories: Option<serde_json::Value>,
    /// The described sample's boxes, labels, and mask PNG bytes (0: none).
    pub sample: Option<(Vec<[f32; 4]>, Vec<i64>, usize)>,
}

/// The targets of the packed dataset in `dir`, if it has a `targets.rft`.
fn inspect_targets(dir: &Path, sample: Option<u64>) -> Result<Option<TargetsInspection>, ShardError> {
    let Some(t) = ringfeed_format::targets::TargetsFile::open_in(dir)? else {
        return Ok(None);
    };
    let (mut boxes, mut max_boxes, mut masks) = (0, 0, 0);
    for i in 0..t.len() {
        let s = t.get(i, false)?;
        boxes += s.boxes.len() as u64;
        max_boxes = max_boxes.max(s.boxes.len() as u32);
        masks += u64::from(!s.mask_png.is_empty());
    }
    let sample = match sample {
        Some(i) if i < t.len() => {
            let s = t.get(i, false)?;
            Some((s.boxes, s.labels, s.mask_png.len()))
        }
        _ => None,
    };
    let info = TargetsInspection {
        boxes,
        max_boxes,
        masks,
        instances: t.header.has_instances(),
        keypoints: t.header.keypoints,
        categories: serde_json::from_slice(t.categories()).ok(),
        sample,
    };
    if let Some(at) = t.fault() {
        return Err(ShardError::corrupt(
            t.path(),
            at,
            "the file changed on disk while it was read",
        ));
    }
    Ok(Some(info))
}

/// Why `inspect` failed.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Lmdb(#[from] ringfeed_source::lmdb::LmdbError),
    #[error("sample {index} is out of range: the dataset has {len} samples")]
    NoSuchSample { index: u64, len: u64 },
    /// The dataset path or pattern names no tars.
    #[error(transparent)]
    Pattern(#[from] ringfeed_source::wds::pattern::PatternError),
    /// A tar of the dataset is damaged where sample `key` is.
    #[error("{key}: {reason}")]
    Damaged { key: String, reason: String },
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn describe_image(data: &[u8]) -> Result<String, codec::CodecError> {
    let mut decoder = Decoder::new(Limits::default())?;
    let info = decoder.probe(data)?;
    Ok(format!(
        "{} {}x{} {:?} {}-bit{}",
        info.format,
        info.width,
        info.height,
        info.color,
        info.bits_per_channel,
        if info.progressive { " progressive" } else { "" }
    ))
}

impl SampleInfo {
    pub(crate) fn new(index: u64, key: &[u8], label: i64, data: &[u8], classes: &[(String, u64)]) -> Self {
        SampleInfo {
            index,
            key: lossy(key),
            label,
            class: usize::try_from(label)
                .ok()
                .and_then(|l| classes.get(l))
                .map(|c| c.0.clone()),
            bytes: data.len() as u64,
            image: describe_image(data),
            meta: None,
            location: None,
            tar: None,
            members: Vec::new(),
        }
    }
}

/// Inspects the packed dataset in `dir`, describing sample `sample` (if any).
///
/// A file cut while it is read raises SIGBUS on its mapping; with the handler of
/// [`ringfeed_format::fault`] installed here, that is reported as [`ShardError::Changed`] naming the file
/// and offset, instead of a crash.
pub fn inspect_packed(dir: &Path, sample: Option<u64>) -> Result<Inspection, InspectError> {
    ringfeed_format::fault::install().map_err(|e| ShardError::io(dir, e))?;
    let ds = Dataset::open(dir)?;
    inspect_opened(&ds, dir, sample)
}

/// [`inspect_packed`] of an opened dataset; a fault in any of its files is the error.
fn inspect_opened(ds: &Dataset, dir: &Path, sample: Option<u64>) -> Result<Inspection, InspectError> {
    let result = inspect_mapped(ds, dir, sample);
    // The root cause, whether the result is Ok (then built partly from zeros) or an error.
    ds.check_faults(0, None)?;
    result
}

fn inspect_mapped(ds: &Dataset, dir: &Path, sample: Option<u64>) -> Result<Inspection, InspectError> {
    let sample_index = sample;
    let n = ds.len();
    let mut per_class = vec![0u64; ds.class_count() as usize];
    let mut sizes = Vec::with_capacity(n as usize);
    for i in 0..n {
        let s = ds.sample(i)?;
        sizes.push(s.data.len() as u64);
        if let Some(c) = usize::try_from(s.label).ok().and_then(|l| per_class.get_mut(l)) {
            *c += 1;
        }
    }
    let classes = (0..ds.class_count())
        .map(|c| Ok((lossy(ds.class_name(c)?), per_class[c as usize])))
        .collect::<Result<Vec<_>, ShardError>>()?;
    let mut formats = BTreeMap::new();
    let step = n.div_ceil(FORMAT_PROBES).max(1);
    let mut probed = 0;
    for i in (0..n).step_by(step as usize) {
        let s = ds.sample(i)?;
        let name = codec::sniff(s.data).map_or("unknown".to_owned(), |f| f.to_string());
        *formats.entry(name).or_insert(0) += 1;
        probed += 1;
    }
    let files_bytes = ds.index.len()
        + (0..ds.shard_count())
            .filter_map(|s| ds.shard_info(s))
            .map(|(_, _, l)| l)
            .sum::<u64>();
    let sample = match sample {
        None => None,
        Some(i) if i >= n => return Err(InspectError::NoSuchSample { index: i, len: n }),
        Some(i) => {
            let s = ds.sample(i)?;
            let mut info = SampleInfo::new(i, s.key, s.label, s.data, &classes);
            info.meta = (!s.meta.is_empty()).then(|| lossy(s.meta));
            info.location = ds
                .shard_info(s.shard)
                .map(|(p, _, _)| (p.display().to_string(), s.offset, s.crc));
            Some(info)
        }
    };
    Ok(Inspection {
        kind: "packed".to_owned(),
        path: dir.display().to_string(),
        samples: n,
        shards: Some(ds.shard_count()),
        files_bytes: Some(files_bytes),
        classes,
        sizes: SizeStats::from(sizes),
        formats,
        probed,
        info: ds.info().ok().and_then(|i| serde_json::from_str(i).ok()),
        sample,
        webdataset: None,
        labels: None,
        targets: inspect_targets(dir, sample_index)?,
    })
}

/// Inspects an LMDB read in place.
pub fn inspect_lmdb(path: &Path, opts: &LmdbOptions, sample: Option<u64>) -> Result<Inspection, InspectError> {
    let src = LmdbSource::open(path, opts)?;
    let kind = format!("lmdb ({:?} layout)", src.layout()).to_lowercase();
    inspect_source(&src, kind, path.display().to_string(), None, sample)
}

/// Inspects WebDataset tars (a directory, a `.tar`, a pattern: control.md, "WebDataset shards")
/// with the default options, describing sample `sample` (if any). A damaged tar or sample is an
/// error naming it.
pub fn inspect_webdataset(dataset: &str, sample: Option<u64>) -> Result<Inspection, InspectError> {
    use ringfeed_source::wds::{WdsOptions, WdsSource, pattern};
    use std::sync::atomic::{AtomicBool, AtomicU64};
    let tars = pattern::tars(dataset)?;
    let opts = WdsOptions {
        write_index: false,
        ..WdsOptions::default()
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let src = WdsSource::open(
        dataset,
        &tars,
        &opts,
        threads,
        &AtomicBool::new(false),
        &AtomicU64::new(0),
    )
    .map_err(SourceError::from)?;
    if let Some(p) = src.listing_problems().first() {
        return Err(InspectError::Damaged {
            key: lossy(&p.key),
            reason: p.reason.clone(),
        });
    }
    let cat = src.catalog();
    let n = cat.len();
    let mut sizes = Vec::with_capacity(n as usize);
    let mut labels = Vec::with_capacity(n as usize);
    let mut formats = BTreeMap::new();
    let step = n.div_ceil(FORMAT_PROBES).max(1);
    let mut probed = 0;
    // Through a reader: a tar cut while it is read is reported, not read as zeros.
    let mut reader = src.reader()?;
    for i in 0..n {
        let s = reader.get(i)?;
        sizes.push(s.data.len() as u64);
        if cat.options().label.is_some() {
            labels.push(s.label);
        }
        if i % step == 0 {
            let name = codec::sniff(s.data).map_or("unknown".to_owned(), |f| f.to_string());
            *formats.entry(name).or_insert(0) += 1;
            probed += 1;
        }
    }
    let sample = match sample {
        None => None,
        Some(i) if i >= n => return Err(InspectError::NoSuchSample { index: i, len: n }),
        Some(i) => {
            let info = wds_sample_info(cat, i, src.data(cat.tar_of(i, "")?), 0)?;
            src.with_sample(i, &mut |_| ())?;
            Some(info)
        }
    };
    let files_bytes = (0..src.tar_count() as u32).map(|t| src.data(t).len() as u64).sum();
    Ok(Inspection {
        kind: "webdataset".into(),
        path: dataset.to_owned(),
        samples: n,
        shards: Some(src.tar_count() as u32),
        files_bytes: Some(files_bytes),
        classes: Vec::new(),
        sizes: SizeStats::from(sizes),
        formats,
        probed,
        info: None,
        sample,
        webdataset: Some(WdsSummary::of(cat)),
        labels: (!labels.is_empty()).then(|| LabelStats::from(&labels)),
        targets: None,
    })
}

/// Counts, sizes and formats of any source, read sample by sample.
fn inspect_source(
    src: &dyn Source,
    kind: String,
    path: String,
    shards: Option<u32>,
    sample: Option<u64>,
) -> Result<Inspection, InspectError> {
    let n = src.len();
    let names = src.class_names();
    let mut per_class = vec![0u64; names.len()];
    let mut sizes = Vec::with_capacity(n as usize);
    let mut formats = BTreeMap::new();
    let mut reader = src.reader()?;
    let step = n.div_ceil(FORMAT_PROBES).max(1);
    let mut probed = 0;
    for i in 0..n {
        let s = reader.get(i)?;
        sizes.push(s.data.len() as u64);
        if let Some(c) = usize::try_from(s.label).ok().and_then(|l| per_class.get_mut(l)) {
            *c += 1;
        }
        if i % step == 0 {
            let name = codec::sniff(s.data).map_or("unknown".to_owned(), |f| f.to_string());
            *formats.entry(name).or_insert(0) += 1;
            probed += 1;
        }
    }
    let classes: Vec<(String, u64)> = names.iter().map(|n| lossy(n)).zip(per_class).collect();
    let sample = match sample {
        None => None,
        Some(i) if i >= n => return Err(InspectError::NoSuchSample { index: i, len: n }),
        Some(i) => {
            let s = reader.get(i)?;
            Some(SampleInfo::new(i, s.key, s.label, s.data, &classes))
        }
    };
    Ok(Inspection {
        kind,
        path,
        samples: n,
        shards,
        files_bytes: None,
        classes,
        sizes: SizeStats::from(sizes),
        formats,
        probed,
        info: None,
        sample,
        webdataset: None,
        labels: None,
        targets: None,
    })
}

/// Longest class list printed in full; longer lists are summarised.
const CLASSES_SHOWN: usize = 20;

impl Inspection {
    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let mb = |b: u64| b as f64 / 1e6;
        let _ = writeln!(o, "{}: {} dataset", self.path, self.kind);
        let _ = writeln!(o, "  samples:  {}", self.samples);
        if let (Some(s), Some(b)) = (self.shards, self.files_bytes) {
            let _ = writeln!(o, "  shards:   {s} ({:.1} MB on disk)", mb(b));
        }
        if let Some(info) = &self.info {
            if let Some(enc) = info.get("encoding") {
                let _ = writeln!(o, "  encoding: {enc}");
            }
            if let Some(src) = info.get("source_kind").and_then(|v| v.as_str()) {
                let _ = writeln!(o, "  packed from: {src}");
            }
        }
        let z = &self.sizes;
        let _ = writeln!(
            o,
            "  sample bytes: min {}, median {}, mean {:.0}, p99 {}, max {}, total {:.1} MB",
            z.min,
            z.p50,
            z.mean,
            z.p99,
            z.max,
            mb(z.total)
        );
        if let Some(w) = &self.webdataset {
            let exts: Vec<String> = w.extensions.iter().map(|(e, c)| format!(".{e} {c}")).collect();
            let _ = writeln!(o, "  members:  {} ({})", w.members, exts.join(", "));
            let _ = writeln!(
                o,
                "  image:    {} ({} samples have one); label: {} ({} samples have one)",
                w.image,
                w.with_image,
                w.label.as_deref().map_or("none".to_owned(), |l| format!(".{l}")),
                w.with_label
            );
            let _ = writeln!(o, "  keys:     {} .. {}", w.first_key, w.last_key);
            if let Some((indexed, read)) = w.from_index {
                let _ = writeln!(
                    o,
                    "  read:     {indexed} tars from their index files, {read} read whole (`ringfeed index` writes the missing ones)"
                );
            }
        }
        if let Some(l) = &self.labels {
            let _ = writeln!(
                o,
                "  labels (of {} read): min {}, max {}, {} distinct",
                l.read, l.min, l.max, l.distinct
            );
        }
        let formats: Vec<String> = self.formats.iter().map(|(f, c)| format!("{f} {c}")).collect();
        let _ = writeln!(o, "  formats (of {} probed): {}", self.probed, formats.join(", "));
        if self.classes.is_empty() {
            let _ = writeln!(o, "  classes:  none (integer labels)");
        } else {
            let counts: Vec<u64> = self.classes.iter().map(|c| c.1).collect();
            let (min, max) = (
                counts.iter().min().copied().unwrap_or(0),
                counts.iter().max().copied().unwrap_or(0),
            );
            let _ = writeln!(
                o,
                "  classes:  {} (samples per class: min {min}, max {max})",
                self.classes.len()
            );
            for (i, (name, count)) in self.classes.iter().enumerate().take(CLASSES_SHOWN) {
                let _ = writeln!(o, "    {i:>5}  {name}  {count}");
            }
            if self.classes.len() > CLASSES_SHOWN {
                let _ = writeln!(
                    o,
                    "    ... {} more (--json lists all)",
                    self.classes.len() - CLASSES_SHOWN
                );
            }
        }
        if let Some(t) = &self.targets {
            let cats = t.categories.as_ref().and_then(|c| c.as_array()).map_or(0, Vec::len);
            let _ = writeln!(
                o,
                "  targets:  {} boxes (at most {} per sample), {} samples with masks, {}, {} keypoints per box, {cats} categories",
                t.boxes,
                t.max_boxes,
                t.masks,
                if t.instances {
                    "instance masks"
                } else {
                    "no instance masks"
                },
                t.keypoints,
            );
        }
        if let Some(s) = &self.sample {
            let _ = writeln!(o, "  sample {}:", s.index);
            let _ = writeln!(o, "    key:   {}", s.key);
            match &s.class {
                Some(c) => {
                    let _ = writeln!(o, "    label: {} ({c})", s.label);
                }
                None => {
                    let _ = writeln!(o, "    label: {}", s.label);
                }
            }
            let _ = writeln!(o, "    bytes: {}", s.bytes);
            match &s.image {
                Ok(d) => {
                    let _ = writeln!(o, "    image: {d}");
                }
                Err(e) => {
                    let _ = writeln!(o, "    image: does not probe: {e}");
                }
            }
            if let Some((file, off, crc)) = &s.location {
                let _ = writeln!(o, "    stored: {file} at byte {off}, crc32c {crc:#010x}");
            }
            if let Some(t) = &s.tar {
                let _ = writeln!(o, "    tar:   {t}");
            }
            for (name, at, size) in &s.members {
                let _ = writeln!(o, "    member: {name} ({size} bytes at byte {at})");
            }
            if let Some(m) = &s.meta {
                let _ = writeln!(o, "    metadata: {m}");
            }
            if let Some((boxes, labels, mask)) = self.targets.as_ref().and_then(|t| t.sample.as_ref()) {
                let _ = writeln!(o, "    boxes: {} (xyxy, stored-image pixels)", boxes.len());
                for (b, l) in boxes.iter().zip(labels) {
                    let _ = writeln!(o, "      {b:?} label {l}");
                }
                if *mask > 0 {
                    let _ = writeln!(o, "    mask:  {mask} bytes of PNG");
                }
            }
        }
        o
    }

    /// The report as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "kind": self.kind,
            "path": self.path,
            "samples": self.samples,
            "shards": self.shards,
            "bytes_on_disk": self.files_bytes,
            "classes": self.classes.iter().map(|(n, c)| serde_json::json!({"name": n, "samples": c})).collect::<Vec<_>>(),
            "sample_bytes": {"min": self.sizes.min, "p50": self.sizes.p50, "mean": self.sizes.mean, "p99": self.sizes.p99, "max": self.sizes.max, "total": self.sizes.total},
            "formats": self.formats,
            "probed": self.probed,
            "info": self.info,
            "webdataset": self.webdataset.as_ref().map(|w| serde_json::json!({
                "members": w.members, "extensions": w.extensions, "image": w.image, "label": w.label,
                "with_image": w.with_image, "with_label": w.with_label,
                "first_key": w.first_key, "last_key": w.last_key,
                "tars_from_index": w.from_index.map(|f| f.0), "tars_read_whole": w.from_index.map(|f| f.1),
            })),
            "labels": self.labels.as_ref().map(|l| serde_json::json!({
                "read": l.read, "min": l.min, "max": l.max, "distinct": l.distinct,
            })),
            "targets": self.targets.as_ref().map(|t| serde_json::json!({
                "boxes": t.boxes, "max_boxes": t.max_boxes, "masks": t.masks, "instance_masks": t.instances,
                "keypoints": t.keypoints, "categories": t.categories,
                "sample": t.sample.as_ref().map(|(b, l, m)| serde_json::json!({"boxes": b, "labels": l, "mask_bytes": m})),
            })),
            "sample": self.sample.as_ref().map(|s| serde_json::json!({
                "index": s.index, "key": s.key, "label": s.label, "class": s.class, "bytes": s.bytes,
                "image": s.image.as_ref().ok(), "image_error": s.image.as_ref().err().map(ToString::to_string),
                "metadata": s.meta.as_ref().and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok()),
                "shard": s.location.as_ref().map(|l| &l.0), "offset": s.location.as_ref().map(|l| l.1),
                "crc32c": s.location.as_ref().map(|l| l.2),
                "tar": s.tar,
                "members": s.members.iter().map(|(n, at, size)| serde_json::json!({"name": n, "offset": at, "size": size})).collect::<Vec<_>>(),
            })),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_stats_quantiles() {
        let s = SizeStats::from((1..=100).collect());
        assert_eq!((s.min, s.p50, s.p99, s.max, s.total), (1, 51, 99, 100, 5050));
    }

    /// A shard cut under an open dataset is an error naming it, not a SIGBUS or zeros: with
    /// the handler installed (as `inspect_packed` does first), the fault is the error.
    #[test]
    fn a_shard_cut_while_inspected_is_an_error_not_a_sigbus() {
        let tmp = tempfile::tempdir().unwrap();
        let opts = ringfeed_format::shard::WriterOptions {
            target_shard_bytes: 64 << 10,
            record_align: 4096,
        };
        let mut w = ringfeed_format::shard::DatasetWriter::create(tmp.path(), opts).unwrap();
        for i in 0..8u8 {
            w.push(&[b'k', i], 0, b"", &vec![i | 1; 20_000]).unwrap();
        }
        w.finish(&[b"c".to_vec()], "{}").unwrap();
        ringfeed_format::fault::install().unwrap();
        let ds = Dataset::open(tmp.path()).unwrap();
        let (path, _, len) = ds.shard_info(0).unwrap();
        let path = path.to_owned();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len / 3)
            .unwrap();
        let err = inspect_opened(&ds, tmp.path(), Some(0)).unwrap_err().to_string();
        assert!(
            err.contains(&path.display().to_string()) && err.contains("changed on disk"),
            "{err}"
        );
    }
}
