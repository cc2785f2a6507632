//! WebDataset tar shards read in place (control.md, "WebDataset shards"; docs/webdataset.md).
//!
//! Each tar is mapped read-only; its member table comes from its index file when that is valid
//! ([`index`]), else from a scan of its headers ([`tar`]), done for all tars in parallel at open.
//! Samples are WebDataset's: consecutive members sharing a key ([`tar::split_key`]). A sample's
//! image is borrowed straight from the mapping, as a packed record is; its label is parsed from
//! its label member when it is read.
//!
//! Invariants (besides [`Source`]'s):
//! - Sample order is the tars' order, then archive order inside each tar; one tar is one shard
//!   of the `shard_blocks` order ([`Source::shard_sizes`]).
//! - Where the bytes come from is the caller's: [`WdsSource::open`] takes local paths (a local
//!   data set, or files a cache has already made whole and checked), and the index beside each
//!   tar is validated against that file, never assumed.
//! - What cannot be listed (a file that is not a tar, a corrupt header, a tar cut short) is a
//!   listing problem, which `on_error` decides about at open; what is wrong with one sample (no
//!   image, no label, a label that is not an integer, a member cut off by the end of the file)
//!   is an error for that sample when it is read, naming the tar, the member and the key.
//! - A tar truncated or rewritten while mapped is reported, never served ([`ringfeed_format::fault`]).

use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::{Extra, FieldKind, Sample, SampleReader, Source, SourceError};
use crate::listing::Problem;
use ringfeed_format::control::WdsRequest;
use ringfeed_format::shard::reader::Mapped;

pub mod index;
pub mod pattern;
pub mod tar;

/// WebDataset's default image extensions.
pub const DEFAULT_IMAGE: &str = "jpg;jpeg;png;webp";

/// Why a WebDataset cannot be opened, or one of its samples read.
#[derive(Debug, thiserror::Error)]
pub enum WdsError {
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// `open.webdataset.image` names no extension.
    #[error("open.webdataset.image names no extension (e.g. \"jpg;png\")")]
    NoImageExtension,
    #[error("listing was cancelled: every stream that asked for it has gone")]
    Cancelled,
    /// One sample cannot be served.
    #[error("{}: sample {key:?}{}: {reason}", tar.display(), member.as_ref().map(|m| format!(" (member {m:?})")).unwrap_or_default())]
    Sample {
        tar: PathBuf,
        key: String,
        member: Option<String>,
        reason: String,
    },
}

/// What a stream's `open.webdataset` chooses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WdsOptions {
    /// Image extensions, in order of preference (lowercase).
    pub image: Vec<Vec<u8>>,
    /// The label's extension (lowercase); `None`: no labels.
    pub label: Option<Vec<u8>>,
    /// The JSON member of a `json` label.
    pub label_key: String,
    /// Write index files beside the tars when the directory is writable.
    pub write_index: bool,
}

impl Default for WdsOptions {
    fn default() -> Self {
        WdsOptions::from_request(&WdsRequest::default()).expect("the defaults are valid")
    }
}

impl WdsOptions {
    /// The options of an `open`, checked; errors name the member.
    pub fn from_request(r: &WdsRequest) -> Result<Self, WdsError> {
        let image: Vec<Vec<u8>> = r
            .image
            .as_deref()
            .unwrap_or(DEFAULT_IMAGE)
            .split(';')
            .map(|e| e.trim().trim_start_matches('.').to_ascii_lowercase().into_bytes())
            .filter(|e| !e.is_empty())
            .collect();
        if image.is_empty() {
            return Err(WdsError::NoImageExtension);
        }
        let label = match r.label.as_deref().unwrap_or("cls").trim().trim_start_matches('.') {
            "" => None,
            l => Some(l.to_ascii_lowercase().into_bytes()),
        };
        Ok(WdsOptions {
            image,
            label,
            label_key: r.label_key.clone().unwrap_or_else(|| "label".to_owned()),
            write_index: r.write_index.unwrap_or(true),
        })
    }

    fn json_label(&self) -> bool {
        self.label
            .as_deref()
            .is_some_and(|l| l == b"json" || l.ends_with(b".json"))
    }
}

/// One tar, mapped, with its member table.
struct Tar {
    path: PathBuf,
    /// `None` for an empty file (nothing to map).
    map: Option<Mapped>,
    members: Vec<tar::Member>,
}

/// A tar with its member table, how its scan ended, and whether its index file was used.
type Indexed = (Tar, tar::End, bool);

/// One sample: a run of members of one tar.
#[derive(Debug, Clone, Copy)]
struct Entry {
    tar: u32,
    /// Its first member (in the tar's member table), whose name holds the key.
    first: u32,
    members: u32,
    key_len: u32,
    image: Option<u32>,
    label: Option<u32>,
}

/// The samples of a set of tars, from their member tables alone: where each sample's members
/// are, its key, which member is its image and which its label. Where the tars' bytes come
/// from (a local mapping, a cached download) is the owner's: [`Catalog::lookup`] takes them.
#[derive(Debug)]
pub struct Catalog {
    /// What the client named (a directory, a file, a pattern, a URL).
    name: String,
    /// Each tar's name (its path, or its URL) and member table.
    tars: Vec<(PathBuf, Vec<tar::Member>)>,
    entries: Vec<Entry>,
    /// Samples per tar, for the `shard_blocks` order.
    sizes: Vec<u64>,
    problems: Vec<Problem>,
    opts: WdsOptions,
}

impl Catalog {
    /// No tars yet.
    pub fn new(name: &str, opts: &WdsOptions) -> Self {
        Catalog {
            name: name.to_owned(),
            tars: Vec::new(),
            entries: Vec::new(),
            sizes: Vec::new(),
            problems: Vec::new(),
            opts: opts.clone(),
        }
    }

    /// Groups the next tar's members (named `path`) into samples; how its scan ended is a
    /// listing problem unless it is complete.
    pub fn add(&mut self, path: PathBuf, members: Vec<tar::Member>, end: &tar::End) {
        if let Some(reason) = end.problem(members.len()) {
            self.problems.push(Problem {
                key: path.as_os_str().as_bytes().to_vec(),
                reason,
            });
        }
        let t = self.tars.len() as u32;
        let before = self.entries.len();
        let mut current: Option<(Entry, &[u8])> = None;
        for (m, member) in members.iter().enumerate() {
            let Some((key, ext)) = tar::split_key(&member.name) else {
                continue;
            };
            let (key, ext) = (&member.name[key], member.name[ext].to_ascii_lowercase());
            let same = current.as_ref().is_some_and(|(_, k)| *k == key);
            if !same {
                if let Some((e, _)) = current.take() {
                    self.entries.push(e);
                }
                current = Some((
                    Entry {
                        tar: t,
                        first: m as u32,
                        members: 0,
                        key_len: key.len() as u32,
                        image: None,
                        label: None,
                    },
                    key,
                ));
            }
            let (e, _) = current.as_mut().expect("set above");
            e.members = m as u32 + 1 - e.first;
            // The first image extension in the option's order wins, whatever the member order.
            if let Some(rank) = self.opts.image.iter().position(|x| *x == ext) {
                let better = e.image.is_none_or(|i| {
                    let have = member_ext(&members[i as usize].name);
                    self.opts.image.iter().position(|x| *x == have).is_none_or(|r| rank < r)
                });
                if better {
                    e.image = Some(m as u32);
                }
            }
            if self.opts.label.as_deref() == Some(ext.as_slice()) && e.label.is_none() {
                e.label = Some(m as u32);
            }
        }
        if let Some((e, _)) = current {
            self.entries.push(e);
        }
        self.sizes.push((self.entries.len() - before) as u64);
        self.tars.push((path, members));
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of tars.
    pub fn tar_count(&self) -> usize {
        self.tars.len()
    }

    /// Samples per tar, in order.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// What the member tables could not list (tars cut short, corrupt headers).
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// What the client named.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The member table of tar `t`.
    pub fn members(&self, t: usize) -> &[tar::Member] {
        &self.tars[t].1
    }

    /// "WebDataset NAME (T tars, N samples, WHERE)".
    pub fn describe(&self, place: &str) -> String {
        format!(
            "WebDataset {} ({} tars, {} samples, {place})",
            self.name,
            self.tars.len(),
            self.len()
        )
    }

    fn entry(&self, index: u64, place: &str) -> Result<&Entry, SourceError> {
        self.entries.get(index as usize).ok_or_else(|| SourceError::OutOfRange {
            index,
            len: self.len(),
            source_desc: self.describe(place),
        })
    }

    /// The tar sample `index` is in (`place`: for the message of an index out of range).
    pub fn tar_of(&self, index: u64, place: &str) -> Result<u32, SourceError> {
        Ok(self.entry(index, place)?.tar)
    }

    /// Sample `index`'s key, as text, for messages.
    pub fn key_text(&self, index: u64) -> String {
        self.entries.get(index as usize).map_or_else(String::new, |e| {
            let name = &self.tars[e.tar as usize].1[e.first as usize].name;
            String::from_utf8_lossy(&name[..e.key_len as usize]).into_owned()
        })
    }

    /// The options the samples were grouped with.
    pub fn options(&self) -> &WdsOptions {
        &self.opts
    }

    /// Sample `index`'s members (consecutive in its tar's member table), its image member and
    /// its label member, when it has them.
    pub fn sample_members(&self, index: u64) -> Option<SampleMembers<'_>> {
        let e = self.entries.get(index as usize)?;
        let members = &self.tars[e.tar as usize].1;
        Some(SampleMembers {
            tar: e.tar,
            members: &members[e.first as usize..(e.first + e.members) as usize],
            image: e.image.map(|i| &members[i as usize]),
            label: e.label.map(|i| &members[i as usize]),
        })
    }

    /// The name of tar `t` (its path, or its URL).
    pub fn tar_name(&self, t: usize) -> &Path {
        &self.tars[t].0
    }

    /// Sample `index`'s key, image bytes and label, from `data`, the bytes of its tar.
    pub fn lookup<'a>(&'a self, index: u64, data: &'a [u8]) -> Result<Sample<'a>, SourceError> {
        self.lookup_window(index, data, 0)
    }

    /// [`Catalog::lookup`] from `data`, the bytes of its tar from byte `base` on (a ranged read
    /// of the sample's members).
    pub fn lookup_window<'a>(&'a self, index: u64, data: &'a [u8], base: u64) -> Result<Sample<'a>, SourceError> {
        self.lookup_extra_window(index, data, base).map(|(s, _)| s)
    }

    /// [`Catalog::lookup_window`], with the sample's members (1.9, its other fields) beside it:
    /// borrowed, nothing is read from them here.
    pub fn lookup_extra_window<'a>(
        &'a self,
        index: u64,
        data: &'a [u8],
        base: u64,
    ) -> Result<(Sample<'a>, Extra<'a>), SourceError> {
        let e = self.entry(index, "")?;
        let (path, members) = &self.tars[e.tar as usize];
        let key = &members[e.first as usize].name[..e.key_len as usize];
        let fail = |member: Option<&tar::Member>, reason: String| {
            SourceError::Wds(WdsError::Sample {
                tar: path.clone(),
                key: String::from_utf8_lossy(key).into_owned(),
                member: member.map(|m| String::from_utf8_lossy(&m.name).into_owned()),
                reason,
            })
        };
        let bytes = |m: &tar::Member| -> Result<&'a [u8], SourceError> {
            let end = base + data.len() as u64;
            match m.offset.checked_add(m.size) {
                Some(stop) if m.offset >= base && stop <= end => {
                    Ok(&data[(m.offset - base) as usize..(stop - base) as usize])
                }
                _ => Err(fail(
                    Some(m),
                    format!(
                        "the member is cut off: {} bytes at offset {}, the file ends at {end}",
                        m.size, m.offset,
                    ),
                )),
            }
        };
        let Some(image) = e.image else {
            let have: Vec<String> = members[e.first as usize..(e.first + e.members) as usize]
                .iter()
                .map(|m| String::from_utf8_lossy(&member_ext(&m.name)).into_owned())
                .collect();
            return Err(fail(
                None,
                format!(
                    "no image member (looked for {}; it has {}); set webdataset={{\"image\": ...}} to the extension it uses",
                    self.opts
                        .image
                        .iter()
                        .map(|x| String::from_utf8_lossy(x))
                        .collect::<Vec<_>>()
                        .join(", "),
                    have.join(", ")
                ),
            ));
        };
        let whole = data;
        let data = bytes(&members[image as usize])?;
        let label = match (&self.opts.label, e.label) {
            (None, _) => super::NO_LABEL,
            (Some(ext), None) => {
                return Err(fail(
                    None,
                    format!(
                        "no label member `.{}`; set webdataset={{\"label\": \"\"}} to serve without labels, or name the label's extension",
                        String::from_utf8_lossy(ext)
                    ),
                ));
            }
            (Some(_), Some(l)) => {
                let m = &members[l as usize];
                parse_label(
                    bytes(m)?,
                    self.opts.json_label().then_some(self.opts.label_key.as_str()),
                )
                .map_err(|reason| fail(Some(m), reason.to_string()))?
            }
        };
        let extra = Extra::Members {
            members: &members[e.first as usize..(e.first + e.members) as usize],
            data: whole,
            base,
        };
        Ok((
            Sample {
                index,
                key,
                label,
                data,
            },
            extra,
        ))
    }
}

/// One sample's members ([`Catalog::sample_members`]).
#[derive(Debug, Clone, Copy)]
pub struct SampleMembers<'a> {
    /// Its tar.
    pub tar: u32,
    /// Every member of the sample, in archive order.
    pub members: &'a [tar::Member],
    pub image: Option<&'a tar::Member>,
    pub label: Option<&'a tar::Member>,
}

/// WebDataset tars on local disk, indexed and mapped.
pub struct WdsSource {
    catalog: Catalog,
    /// Each tar's mapping (`None`: an empty file).
    maps: Vec<Option<Mapped>>,
    /// Index files read, and tars scanned (written or not), at open.
    pub indexes_read: u64,
    pub scanned: u64,
}

impl fmt::Debug for WdsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WdsSource")
            .field("name", &self.catalog.name)
            .field("tars", &self.catalog.tar_count())
            .field("samples", &self.catalog.len())
            .field("problems", &self.catalog.problems.len())
            .finish_non_exhaustive()
    }
}

impl WdsSource {
    /// Opens the tars at `paths` (local files, in order) as one dataset named `name`: indexes
    /// each (its index file, or a scan, on up to `threads` threads), adding the members listed
    /// to `listed` as it goes, and stopping early when `cancel` is set.
    pub fn open(
        name: &str,
        paths: &[PathBuf],
        opts: &WdsOptions,
        threads: usize,
        cancel: &AtomicBool,
        listed: &AtomicU64,
    ) -> Result<Self, WdsError> {
        ringfeed_format::fault::install().map_err(|source| WdsError::Io {
            path: PathBuf::from(name),
            source,
        })?;
        let next = AtomicUsize::new(0);
        let slots: Vec<std::sync::Mutex<Option<Result<Indexed, WdsError>>>> =
            paths.iter().map(|_| std::sync::Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..threads.clamp(1, paths.len().max(1)) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= paths.len() || cancel.load(Ordering::Relaxed) {
                            return;
                        }
                        let r = index_tar(&paths[i], opts.write_index, listed);
                        *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                    }
                });
            }
        });
        if cancel.load(Ordering::Relaxed) {
            return Err(WdsError::Cancelled);
        }
        let mut source = WdsSource {
            catalog: Catalog::new(name, opts),
            maps: Vec::with_capacity(paths.len()),
            indexes_read: 0,
            scanned: 0,
        };
        for slot in slots {
            let (tar, end, from_index) = slot
                .into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .expect("every tar was indexed unless cancelled")?;
            if from_index {
                source.indexes_read += 1;
            } else {
                source.scanned += 1;
            }
            source.catalog.add(tar.path, tar.members, &end);
            source.maps.push(tar.map);
        }
        Ok(source)
    }

    /// Number of tars.
    pub fn tar_count(&self) -> usize {
        self.catalog.tar_count()
    }

    /// The samples and their members.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The bytes of tar `t` (empty for an empty file).
    pub fn data(&self, tar: u32) -> &[u8] {
        self.maps[tar as usize].as_ref().map_or(&[], |m| &m.map)
    }

    /// Sample `index`'s key, image bytes and label, from the mapping.
    fn lookup(&self, index: u64) -> Result<Sample<'_>, SourceError> {
        let t = self.catalog.tar_of(index, &self.describe())?;
        self.catalog.lookup(index, self.data(t))
    }

    /// [`WdsSource::lookup`] with the sample's members (1.9).
    fn lookup_extra(&self, index: u64) -> Result<(Sample<'_>, Extra<'_>), SourceError> {
        let t = self.catalog.tar_of(index, &self.describe())?;
        self.catalog.lookup_extra_window(index, self.data(t), 0)
    }

    /// A tar that changed on disk since it was mapped fails every later read of it.
    fn check_fault(&self, index: u64) -> Result<(), SourceError> {
        let t = self.catalog.tar_of(index, &self.describe())?;
        match self.maps[t as usize].as_ref().and_then(|m| m.fault().map(|at| (m, at))) {
            Some((m, at)) => Err(m
                .changed(at, format!("sample {index} (key {:?})", self.catalog.key_text(index)))
                .into()),
            None => Ok(()),
        }
    }
}

/// A member name's extension (lowercase), or nothing.
fn member_ext(name: &[u8]) -> Vec<u8> {
    tar::split_key(name).map_or_else(Vec::new, |(_, e)| name[e].to_ascii_lowercase())
}

/// Why a sample's label member gives no label ([`parse_label`]).
#[derive(Debug, thiserror::Error)]
enum LabelError {
    /// A `cls`-style member that is not an integer; holds its first 40 bytes, as text.
    #[error("the label {0:?} is not an integer")]
    NotInteger(String),
    #[error("the label member is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("the JSON label has no member {key:?}; set webdataset={{\"label_key\": ...}}")]
    NoMember { key: String },
    #[error("the JSON label's {key:?} is {value}, not an integer")]
    JsonNotInteger { key: String, value: serde_json::Value },
    #[error("the label {0} is negative; labels are class indices from 0")]
    Negative(i64),
}

/// A label member: an ASCII integer (`cls`), or the integer member `key` of a JSON object.
fn parse_label(bytes: &[u8], json_key: Option<&str>) -> Result<i64, LabelError> {
    let value = match json_key {
        None => {
            let text = std::str::from_utf8(bytes).map(str::trim).unwrap_or("");
            text.parse::<i64>().map_err(|_| {
                LabelError::NotInteger(String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned())
            })?
        }
        Some(key) => {
            let v: serde_json::Value = serde_json::from_slice(bytes).map_err(LabelError::NotJson)?;
            let field = v.get(key).ok_or_else(|| LabelError::NoMember { key: key.to_owned() })?;
            field.as_i64().ok_or_else(|| LabelError::JsonNotInteger {
                key: key.to_owned(),
                value: field.clone(),
            })?
        }
    };
    if value < 0 {
        return Err(LabelError::Negative(value));
    }
    Ok(value)
}

/// Maps the tar at `path` and finds its members: from its index file if that is valid, else by
/// a scan (then writing the index file when allowed and possible). Returns the tar, how its
/// scan ended, and whether the index file was used.
fn index_tar(path: &Path, write: bool, listed: &AtomicU64) -> Result<Indexed, WdsError> {
    let io = |source| WdsError::Io {
        path: path.to_owned(),
        source,
    };
    let stamp = index::Stamp::of(path).map_err(io)?;
    if !std::fs::metadata(path).map_err(io)?.is_file() {
        return Err(io(std::io::Error::other("not a regular file")));
    }
    let map = if stamp.len == 0 {
        None
    } else {
        Some(Mapped::open(path).map_err(|e| io(std::io::Error::other(e.to_string())))?)
    };
    let data: &[u8] = map.as_ref().map_or(&[], |m| &m.map);
    let index_path = index::path_for(path);
    if let Ok(bytes) = std::fs::read(&index_path) {
        match index::decode(&bytes, stamp, data) {
            Ok(scan) => {
                listed.fetch_add(scan.members.len() as u64, Ordering::Relaxed);
                let tar = Tar {
                    path: path.to_owned(),
                    map,
                    members: scan.members,
                };
                return Ok((tar, scan.end, true));
            }
            Err(why) => tracing::info!("rebuilding {}: {why}", index_path.display()),
        }
    }
    let mut reported = 0;
    let scan = tar::scan(data, &mut |n| {
        listed.fetch_add(n - reported, Ordering::Relaxed);
        reported = n;
    });
    if write
        && writable(path.parent().unwrap_or(Path::new(".")))
        && let Err(e) = index::write(path, &index::encode(&scan, stamp))
    {
        tracing::info!(
            "could not write {}: {e}; the next open scans the tar again",
            index_path.display()
        );
    }

    let tar = Tar {
        path: path.to_owned(),
        map,
        members: scan.members,
    };
    Ok((tar, scan.end, false))
}

/// Whether this process may create files in `dir`.
fn writable(dir: &Path) -> bool {
    rustix::fs::access(dir, rustix::fs::Access::WRITE_OK).is_ok()
}

/// What `ringfeed index` did with one tar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexReport {
    pub tar: PathBuf,
    /// Regular members listed.
    pub members: usize,
    /// The index file was already valid (nothing written).
    pub fresh: bool,
    /// What the scan found wrong with the tar (it is indexed up to there).
    pub problem: Option<String>,
}

/// Writes (or refreshes) the index file of the tar at `path` (`ringfeed index`), counting its
/// members in `listed`.
pub fn write_index(path: &Path, listed: &AtomicU64) -> Result<IndexReport, WdsError> {
    let (tar, end, fresh) = index_tar(path, false, listed)?;
    if !fresh {
        let stamp = index::Stamp::of(path).map_err(|source| WdsError::Io {
            path: path.to_owned(),
            source,
        })?;
        let scan = tar::Scan {
            members: tar.members.clone(),
            end: end.clone(),
        };
        index::write(path, &index::encode(&scan, stamp)).map_err(|source| WdsError::Io {
            path: index::path_for(path),
            source,
        })?;
    }
    Ok(IndexReport {
        tar: path.to_owned(),
        members: tar.members.len(),
        fresh,
        problem: end.problem(tar.members.len()),
    })
}

impl Source for WdsSource {
    fn len(&self) -> u64 {
        self.catalog.len()
    }

    fn class_names(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }

    fn describe(&self) -> String {
        self.catalog.describe("read in place")
    }

    fn reader(&self) -> Result<Box<dyn SampleReader + '_>, SourceError> {
        Ok(Box::new(WdsReader { source: self }))
    }

    fn listing_problems(&self) -> &[Problem] {
        self.catalog.problems()
    }

    fn shard_sizes(&self) -> Option<Vec<u64>> {
        Some(self.catalog.sizes().to_vec())
    }

    fn with_sample(&self, index: u64, f: &mut dyn FnMut(Sample<'_>)) -> Result<(), SourceError> {
        let got = self.lookup(index);
        // Bytes read after a fault are zeros: report the fault, not what the zeros look like.
        self.check_fault(index)?;
        f(got?);
        self.check_fault(index)
    }

    fn field_kind(&self) -> Option<FieldKind> {
        Some(FieldKind::Members)
    }

    fn with_sample_extra(&self, index: u64, f: &mut dyn FnMut(Sample<'_>, Extra<'_>)) -> Result<(), SourceError> {
        let got = self.lookup_extra(index);
        self.check_fault(index)?;
        let (sample, extra) = got?;
        f(sample, extra);
        // The fields are read inside `f`: a fault while they were read is reported too.
        self.check_fault(index)
    }
}

/// Readers hold no state: the maps are shared and immutable.
struct WdsReader<'a> {
    source: &'a WdsSource,
}

impl SampleReader for WdsReader<'_> {
    fn get(&mut self, index: u64) -> Result<Sample<'_>, SourceError> {
        let s = self.source.lookup(index);
        self.source.check_fault(index)?;
        s
    }
}
