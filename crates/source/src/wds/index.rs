//! Index files: a tar's member table saved beside it (`TAR.rfidx`, `proto/webdataset.md`), so
//! that opening a large WebDataset again reads one small file per tar instead of every header.
//!
//! Invariants:
//! - An index is used only if its magic, version and CRC-32C are right, it was made from a file
//!   of the tar's current length and modification time, its members lie inside the tar in
//!   increasing order, and the headers of its first and last members, read from the tar, agree
//!   with it. Anything else rebuilds it from the tar: a stale or tampered index is never
//!   trusted.
//! - An index is written to a temporary name and renamed into place, so a reader never sees a
//!   partial one.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::tar::{BLOCK, End, Member, Scan};

/// The index file's magic.
pub const MAGIC: &[u8; 8] = b"RFWDSIDX";
/// The format version written (1.1: the tar's ETag, for tars on object storage).
pub const VERSION: (u16, u16) = (1, 1);
/// What is appended to a tar's file name.
pub const SUFFIX: &str = ".rfidx";

/// The identity of a tar file an index was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub len: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

impl Stamp {
    /// The stamp of the file at `path` now.
    pub fn of(path: &Path) -> std::io::Result<Stamp> {
        let m = std::fs::metadata(path)?;
        let mtime_ns = match m.modified()?.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i64,
            Err(e) => -(e.duration().as_nanos() as i64),
        };
        Ok(Stamp { len: m.len(), mtime_ns })
    }
}

/// The index file of the tar at `tar`.
pub fn path_for(tar: &Path) -> PathBuf {
    let mut p = tar.as_os_str().to_owned();
    p.push(SUFFIX);
    PathBuf::from(p)
}

/// Encodes the scan of a local tar with `stamp`.
pub fn encode(scan: &Scan, stamp: Stamp) -> Vec<u8> {
    encode_with(scan, stamp, None)
}

/// Encodes the scan of a tar with `stamp` and, for an object in a store, its ETag (1.1).
pub fn encode_with(scan: &Scan, stamp: Stamp, etag: Option<&[u8]>) -> Vec<u8> {
    let etag = etag.unwrap_or_default();
    let mut out = Vec::with_capacity(64 + scan.members.len() * 32 + etag.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.0.to_le_bytes());
    out.extend_from_slice(&VERSION.1.to_le_bytes());
    out.extend_from_slice(&(etag.len() as u32).to_le_bytes());
    out.extend_from_slice(&stamp.len.to_le_bytes());
    out.extend_from_slice(&stamp.mtime_ns.to_le_bytes());
    out.extend_from_slice(&(scan.members.len() as u64).to_le_bytes());
    let (kind, at, detail): (u8, u64, Vec<u8>) = match &scan.end {
        End::Complete => (0, 0, Vec::new()),
        End::Truncated { at, member } => (1, *at, member.clone().unwrap_or_default()),
        End::BadHeader { at, reason } => (2, *at, reason.as_bytes().to_vec()),
    };
    out.push(kind);
    out.push(u8::from(matches!(&scan.end, End::Truncated { member: Some(_), .. })));
    out.extend_from_slice(&[0u8; 2]);
    out.extend_from_slice(&(detail.len() as u32).to_le_bytes());
    out.extend_from_slice(&at.to_le_bytes());
    out.extend_from_slice(&detail);
    for m in &scan.members {
        out.extend_from_slice(&m.offset.to_le_bytes());
        out.extend_from_slice(&m.size.to_le_bytes());
        out.extend_from_slice(&(m.name.len() as u32).to_le_bytes());
        out.extend_from_slice(&m.name);
    }
    out.extend_from_slice(etag);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Why an index file cannot be used for its tar (it is then rebuilt from the tar).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("not a ringfeed tar index")]
    NotIndex,
    #[error("its checksum does not match")]
    Checksum,
    /// A major version this reader does not know.
    #[error("it is version {major}.{minor}, this server reads {}.x", VERSION.0)]
    Version { major: u16, minor: u16 },
    #[error("its ETag is longer than the file")]
    Etag,
    #[error("it is cut short")]
    Short,
    #[error("unknown end kind {0}")]
    EndKind(u8),
    #[error("its member count is larger than the file")]
    Count,
    /// Member `0` is not inside the tar, after the one before it, on a block boundary.
    #[error("member {0} lies outside the tar or out of order")]
    Member(u64),
    #[error("it has bytes after its last member")]
    Trailing,
    /// It was made for another version of the local file.
    #[error(
        "it was made for a tar of {} bytes modified at {} ns, the tar now has {} bytes, modified at {} ns",
        made.len, made.mtime_ns, now.len, now.mtime_ns
    )]
    Stale { made: Stamp, now: Stamp },
    /// Reading rule 5: no regular file's header before a member.
    #[error("the tar has no member header at byte {at}")]
    NoHeader { at: u64 },
    /// Reading rule 5 with `same_member`: the header names another member.
    #[error("the member header at byte {at} is {name:?} of {size} bytes, the index says {indexed:?} of {indexed_size}")]
    OtherMember {
        at: u64,
        name: String,
        size: u64,
        indexed: String,
        indexed_size: u64,
    },
}

/// An index file's contents, read and structurally checked but not yet matched to a tar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub scan: Scan,
    /// The tar's length and modification time when it was indexed.
    pub made: Stamp,
    /// 1.1: the tar's ETag when it was indexed as an object of a store; `None` for a local file.
    pub etag: Option<Vec<u8>>,
}

/// Decodes an index file made for a tar of `stamp` whose bytes are `tar` (a local file: reading
/// rules 1 to 5 of `proto/webdataset.md`); `Err` says why it cannot be used (it is then rebuilt).
pub fn decode(bytes: &[u8], stamp: Stamp, tar: &[u8]) -> Result<Scan, IndexError> {
    let parsed = parse(bytes)?;
    let made = parsed.made;
    if made != stamp {
        return Err(IndexError::Stale { made, now: stamp });
    }
    spot_check(&parsed.scan.members, false, &mut |at| {
        tar.get(at as usize..(at + BLOCK) as usize).map(<[u8]>::to_vec)
    })?;
    Ok(parsed.scan)
}

/// Reads an index file: reading rules 1, 3 (against the length it records) and 4; rule 2 (or,
/// for a tar in a store, its ETag) and rule 5 are the caller's ([`decode`], [`spot_check`]).
pub fn parse(bytes: &[u8]) -> Result<Parsed, IndexError> {
    if bytes.len() < 60 || &bytes[..8] != MAGIC {
        return Err(IndexError::NotIndex);
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err(IndexError::Checksum);
    }
    let u16_at = |i: usize| u16::from_le_bytes(body[i..i + 2].try_into().expect("2 bytes"));
    let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
    if u16_at(8) != VERSION.0 {
        return Err(IndexError::Version {
            major: u16_at(8),
            minor: u16_at(10),
        });
    }
    let made = Stamp {
        len: u64_at(16),
        mtime_ns: u64_at(24) as i64,
    };
    // 1.1: the ETag's length (1.0: reserved, 0); its bytes end the body.
    let etag_len = u32_at(12) as usize;
    if etag_len > body.len() - 56 {
        return Err(IndexError::Etag);
    }
    let (body, etag) = body.split_at(body.len() - etag_len);
    let count = u64_at(32);
    let (kind, has_member, detail_len, at) = (body[40], body[41], u32_at(44) as usize, u64_at(48));
    let mut pos = 56;
    let take = |pos: &mut usize, n: usize| -> Result<std::ops::Range<usize>, IndexError> {
        let end = pos
            .checked_add(n)
            .filter(|&e| e <= body.len())
            .ok_or(IndexError::Short)?;
        let r = *pos..end;
        *pos = end;
        Ok(r)
    };
    let detail = body[take(&mut pos, detail_len)?].to_vec();
    let end = match kind {
        0 => End::Complete,
        1 => End::Truncated {
            at,
            member: (has_member != 0).then_some(detail),
        },
        2 => End::BadHeader {
            at,
            reason: String::from_utf8_lossy(&detail).into_owned(),
        },
        k => return Err(IndexError::EndKind(k)),
    };
    if count > (body.len() as u64) / 20 {
        return Err(IndexError::Count);
    }
    let mut members = Vec::with_capacity(count as usize);
    let mut next = BLOCK;
    for i in 0..count {
        let head = take(&mut pos, 20)?;
        let (offset, size, n) = (u64_at(head.start), u64_at(head.start + 8), u32_at(head.start + 16));
        let name = body[take(&mut pos, n as usize)?].to_vec();
        let cut = i + 1 == count && matches!(end, End::Truncated { member: Some(_), .. });
        let fits = offset.checked_add(size).is_some_and(|e| e <= made.len) || cut;
        if offset < next || offset % BLOCK != 0 || !fits {
            return Err(IndexError::Member(i));
        }
        next = offset.saturating_add(size).saturating_add(BLOCK);
        members.push(Member { name, offset, size });
    }
    if pos != body.len() {
        return Err(IndexError::Trailing);
    }
    Ok(Parsed {
        scan: Scan { members, end },
        made,
        etag: (etag_len > 0).then(|| etag.to_vec()),
    })
}

/// Reading rule 5: the 512 bytes before the first and the last member are the header of a
/// regular file (`header(at)`: the tar's 512 bytes at `at`, `None` past its end); with
/// `same_member` (1.1, a tar in a store without a matching ETag), a header whose own name and
/// size fields are the member's. A tar that changed length since it was indexed has no header
/// there either.
pub fn spot_check(
    members: &[Member],
    same_member: bool,
    header: &mut dyn FnMut(u64) -> Option<Vec<u8>>,
) -> Result<(), IndexError> {
    let mut seen = None;
    for m in [members.first(), members.last()].into_iter().flatten() {
        let at = m.offset - BLOCK;
        if seen == Some(at) {
            continue;
        }
        seen = Some(at);
        let no = || IndexError::NoHeader { at };
        let Some(h) = header(at).filter(|h| h.len() == BLOCK as usize) else {
            return Err(no());
        };
        let ok = super::tar::scan(&h, &mut |_| {});
        let plain = matches!(h[156], b'0' | 0 | b'7');
        if !matches!(ok.end, End::Complete | End::Truncated { .. }) || !plain {
            return Err(no());
        }
        if !same_member {
            continue;
        }
        // The header is this member's: its own name and size fields (a member a pax or GNU
        // record named or sized fails this, and the tar is indexed again: a cost, never a
        // wrong table).
        let Some(h) = ok.members.first() else {
            return Err(no());
        };
        if h.size != m.size || h.name != m.name {
            return Err(IndexError::OtherMember {
                at,
                name: String::from_utf8_lossy(&h.name).into_owned(),
                size: h.size,
                indexed: String::from_utf8_lossy(&m.name).into_owned(),
                indexed_size: m.size,
            });
        }
    }
    Ok(())
}

/// The byte ranges [`spot_check`] reads, for a reader that fetches them first (a tar in a store).
pub fn spot_ranges(members: &[Member]) -> Vec<std::ops::Range<u64>> {
    let mut out: Vec<std::ops::Range<u64>> = [members.first(), members.last()]
        .into_iter()
        .flatten()
        .map(|m| m.offset - BLOCK..m.offset)
        .collect();
    out.dedup();
    out
}

/// Writes `bytes` as the index of `tar`, atomically. Errors are the caller's to report.
pub fn write(tar: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dest = path_for(tar);
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dest.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let result = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, &dest));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(members: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in members {
            out.extend_from_slice(&super::super::tar::tests_support::header(name, data.len() as u64, b'0'));
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    #[test]
    fn an_index_round_trips_and_is_refused_when_stale_or_tampered() {
        let tar = tar_of(&[(b"a.jpg", &[7u8; 700]), (b"a.cls", b"1")]);
        let scan = super::super::tar::scan(&tar, &mut |_| {});
        let stamp = Stamp {
            len: tar.len() as u64,
            mtime_ns: 1_700_000_000_123_456_789,
        };
        let bytes = encode(&scan, stamp);
        assert_eq!(decode(&bytes, stamp, &tar).unwrap(), scan);
        let other = Stamp {
            mtime_ns: stamp.mtime_ns + 1,
            ..stamp
        };
        assert!(
            decode(&bytes, other, &tar)
                .unwrap_err()
                .to_string()
                .contains("modified at")
        );
        let mut flipped = bytes.clone();
        flipped[60] ^= 1;
        assert!(
            decode(&flipped, stamp, &tar)
                .unwrap_err()
                .to_string()
                .contains("checksum")
        );
        assert!(decode(&bytes[..bytes.len() - 9], stamp, &tar).is_err());
        // A well-formed index whose offsets point at data, not at a header.
        let mut moved = scan.clone();
        moved.members[1].offset += 512;
        let e = decode(&encode(&moved, stamp), stamp, &tar).unwrap_err().to_string();
        assert!(e.contains("no member header") || e.contains("outside"), "{e}");
        assert_eq!(path_for(Path::new("/d/s-001.tar")), Path::new("/d/s-001.tar.rfidx"));
    }
}
