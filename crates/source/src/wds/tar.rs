//! Scanning a tar archive's headers into its member table, without reading the members.
//!
//! Reads the three header dialects WebDataset tars are written in: ustar (POSIX.1-1988, with the
//! 155-byte name prefix), GNU (`L` long-name records) and pax (POSIX.1-2001: `x` records whose
//! `path` and `size` override the next header's). Python's `tarfile` writes pax by default;
//! GNU tar writes GNU; `webdataset`'s `TarWriter` goes through `tarfile`.
//!
//! Invariants:
//! - Every [`Member`]'s `offset + size` was checked against the archive's length, except for the
//!   last member of an archive cut short, which is kept with its declared size and flagged by
//!   [`Scan::end`] (its sample then fails when it is read, naming the cut).
//! - The scan never reads past the archive's end and never allocates more than the archive's
//!   own headers say (a pax or long-name record larger than [`MAX_META`] is refused).

use std::ops::Range;

/// Tar block size.
pub const BLOCK: u64 = 512;
/// Largest pax or GNU long-name record read (a name is at most a few KiB in practice).
pub const MAX_META: u64 = 1 << 20;

/// One regular file of the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its path in the archive, as stored (bytes; UTF-8 from pax).
    pub name: Vec<u8>,
    /// Offset of its data in the archive.
    pub offset: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// How a scan ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// An end-of-archive block, or the file's end exactly after a member.
    Complete,
    /// The archive stops inside a member or a header, at byte `at`: members after it, if any,
    /// are lost. `member` is the cut member's name, when the cut is inside one.
    Truncated { at: u64, member: Option<Vec<u8>> },
    /// The header block at `at` is not a tar header (checksum mismatch, bad number): at offset 0,
    /// the file is not a tar.
    BadHeader { at: u64, reason: String },
}

/// A scanned archive: its members in order, and how the scan ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    pub members: Vec<Member>,
    pub end: End,
}

impl End {
    /// The problem, in words, for a listing problem; `None` when complete.
    pub fn problem(&self, members: usize) -> Option<String> {
        match self {
            End::Complete => None,
            End::Truncated { at, member } => Some(format!(
                "the tar is cut short at byte {at}{}; samples after it cannot be found (a partial download? copy it again)",
                member
                    .as_ref()
                    .map(|m| format!(", inside member {:?}", String::from_utf8_lossy(m)))
                    .unwrap_or_default()
            )),
            End::BadHeader { at: 0, reason } if members == 0 => {
                Some(format!("not a tar file ({reason} in its first header)"))
            }
            End::BadHeader { at, reason } => Some(format!(
                "corrupt tar header at byte {at} ({reason}) after {members} members; the rest of the tar cannot be read"
            )),
        }
    }
}

/// Scans `data`, the whole archive, calling `progress(members)` every 4096 members.
pub fn scan(data: &[u8], progress: &mut dyn FnMut(u64)) -> Scan {
    let len = data.len() as u64;
    let mut members = Vec::new();
    let mut at = 0u64;
    // Overrides for the next header, from pax `x` and GNU `L` records.
    let mut next_name: Option<Vec<u8>> = None;
    let mut next_size: Option<u64> = None;
    let end = loop {
        if at == len {
            // No end-of-archive blocks: accepted (some writers omit them) when no record is
            // pending.
            break if next_name.is_none() && next_size.is_none() {
                End::Complete
            } else {
                End::Truncated { at, member: None }
            };
        }
        if at + BLOCK > len {
            break End::Truncated { at: len, member: None };
        }
        let h = &data[at as usize..(at + BLOCK) as usize];
        if h.iter().all(|&b| b == 0) {
            break End::Complete;
        }
        if let Err(reason) = check_sum(h) {
            break End::BadHeader {
                at,
                reason: reason.to_string(),
            };
        }
        let size = match next_size.take() {
            Some(s) => s,
            None => match number(&h[124..136]) {
                Ok(s) => s,
                Err(reason) => {
                    break End::BadHeader {
                        at,
                        reason: format!("size field: {reason}"),
                    };
                }
            },
        };
        let data_at = at + BLOCK;
        let kind = h[156];
        let name = next_name.take().unwrap_or_else(|| header_name(h));
        if data_at.saturating_add(size) > len {
            let member = matches!(kind, b'0' | 0 | b'7').then(|| name.clone());
            if let Some(name) = &member {
                members.push(Member {
                    name: name.clone(),
                    offset: data_at,
                    size,
                });
            }
            break End::Truncated { at: len, member };
        }
        let body = &data[data_at as usize..(data_at + size) as usize];
        match kind {
            b'0' | 0 | b'7' => {
                members.push(Member {
                    name,
                    offset: data_at,
                    size,
                });
                if members.len() % 4096 == 0 {
                    progress(members.len() as u64);
                }
            }
            b'x' | b'L' if size > MAX_META => {
                break End::BadHeader {
                    at,
                    reason: format!("a {size}-byte extended header record"),
                };
            }
            b'x' => match pax(body) {
                Ok((path, psize)) => {
                    next_name = path.or(next_name);
                    next_size = psize;
                }
                Err(reason) => {
                    break End::BadHeader {
                        at,
                        reason: reason.to_string(),
                    };
                }
            },
            b'L' => {
                let n = body.iter().position(|&b| b == 0).unwrap_or(body.len());
                next_name = Some(body[..n].to_vec());
            }
            // Directories, links, devices, global pax records, GNU long link names: skipped.
            _ => {}
        }
        at = data_at + size.div_ceil(BLOCK) * BLOCK;
    };
    progress(members.len() as u64);
    Scan { members, end }
}

/// The header's path: `prefix/name` for POSIX ustar, `name` otherwise.
fn header_name(h: &[u8]) -> Vec<u8> {
    let name = cstr(&h[0..100]);
    if &h[257..263] == b"ustar\0" {
        let prefix = cstr(&h[345..500]);
        if !prefix.is_empty() {
            let mut p = prefix.to_vec();
            p.push(b'/');
            p.extend_from_slice(name);
            return p;
        }
    }
    name.to_vec()
}

fn cstr(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

/// Why a header cannot be read: the reason recorded in [`End::BadHeader`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum HeaderError {
    #[error("checksum field: {0}")]
    ChecksumField(#[source] NumberError),
    #[error("checksum {stored} but the header sums to {sum}")]
    Checksum { stored: u64, sum: u64 },
    #[error("a pax record without a length")]
    PaxNoLength,
    #[error("a pax record with a bad length")]
    PaxBadLength,
    #[error("a pax record whose length does not match")]
    PaxLengthMismatch,
    #[error("a pax record without '='")]
    PaxNoEquals,
    #[error("a pax size that is not a number")]
    PaxSize,
}

/// Why a numeric header field cannot be read ([`number`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum NumberError {
    #[error("a negative base-256 number")]
    NegativeBase256,
    #[error("a base-256 number over 2^64")]
    Base256Overflow,
    /// Holds the field's digits, as text.
    #[error("{0:?} is not an octal number")]
    NotOctal(String),
    #[error("an octal number over 2^64")]
    OctalOverflow,
}

/// The header checksum: the sum of its bytes with the checksum field as spaces (unsigned, or
/// signed as some old writers computed it).
fn check_sum(h: &[u8]) -> Result<(), HeaderError> {
    let stored = number(&h[148..156]).map_err(HeaderError::ChecksumField)?;
    let field = 148..156;
    let (mut unsigned, mut signed) = (0u64, 0i64);
    for (i, &b) in h.iter().enumerate() {
        let b = if field.contains(&i) { b' ' } else { b };
        unsigned += u64::from(b);
        signed += i64::from(b as i8);
    }
    if stored == unsigned || i64::try_from(stored).is_ok_and(|s| s == signed) {
        Ok(())
    } else {
        Err(HeaderError::Checksum { stored, sum: unsigned })
    }
}

/// A numeric field: octal ASCII (leading spaces, NUL or space terminated), or GNU base-256 when
/// the first byte's high bit is set.
fn number(f: &[u8]) -> Result<u64, NumberError> {
    if f.first().is_some_and(|&b| b & 0x80 != 0) {
        if f[0] & 0x40 != 0 {
            return Err(NumberError::NegativeBase256);
        }
        let mut v: u64 = u64::from(f[0] & 0x3F);
        for &b in &f[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or(NumberError::Base256Overflow)?;
        }
        return Ok(v);
    }
    let digits: &[u8] = {
        let start = f.iter().position(|&b| b != b' ').unwrap_or(f.len());
        let rest = &f[start..];
        &rest[..rest.iter().position(|&b| b == 0 || b == b' ').unwrap_or(rest.len())]
    };
    if digits.is_empty() {
        return Ok(0);
    }
    let mut v = 0u64;
    for &d in digits {
        if !(b'0'..=b'7').contains(&d) {
            return Err(NumberError::NotOctal(String::from_utf8_lossy(digits).into_owned()));
        }
        v = v.checked_mul(8).ok_or(NumberError::OctalOverflow)? + u64::from(d - b'0');
    }
    Ok(v)
}

/// A pax extended header's `path` and `size` (records `"LEN KEY=VALUE\n"`).
fn pax(mut body: &[u8]) -> Result<(Option<Vec<u8>>, Option<u64>), HeaderError> {
    let (mut path, mut size) = (None, None);
    while !body.is_empty() && body[0] != 0 {
        let sp = body.iter().position(|&b| b == b' ').ok_or(HeaderError::PaxNoLength)?;
        let n: usize = std::str::from_utf8(&body[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(HeaderError::PaxBadLength)?;
        if n <= sp + 1 || n > body.len() || body[n - 1] != b'\n' {
            return Err(HeaderError::PaxLengthMismatch);
        }
        let record = &body[sp + 1..n - 1];
        let eq = record.iter().position(|&b| b == b'=').ok_or(HeaderError::PaxNoEquals)?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        match key {
            b"path" => path = Some(value.to_vec()),
            b"size" => {
                size = Some(
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or(HeaderError::PaxSize)?,
                );
            }
            _ => {}
        }
        body = &body[n..];
    }
    Ok((path, size))
}

/// WebDataset's split of a member path into key and extension: the key is the path up to the
/// first dot of the base name, the extension the rest. `None` for names without an extension.
pub fn split_key(name: &[u8]) -> Option<(Range<usize>, Range<usize>)> {
    let base = name.iter().rposition(|&b| b == b'/').map_or(0, |p| p + 1);
    let dot = base + name[base..].iter().position(|&b| b == b'.')?;
    if dot == base || dot + 1 == name.len() {
        // ".hidden" has no key; "name." no extension.
        return None;
    }
    Some((0..dot, dot + 1..name.len()))
}

/// Tar writing for the unit tests of this module and its siblings.
#[cfg(test)]
pub(crate) mod tests_support {
    /// A ustar header for `name` of `size` bytes, type `kind`, with a correct checksum.
    pub(crate) fn header(name: &[u8], size: u64, kind: u8) -> [u8; 512] {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name);
        h[100..107].copy_from_slice(b"0000644");
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[136..147].copy_from_slice(b"00000000000");
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].fill(b' ');
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::header;
    use super::*;

    fn archive(members: &[(&[u8], &[u8], u8)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data, kind) in members {
            out.extend_from_slice(&header(name, data.len() as u64, *kind));
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    #[test]
    fn members_long_names_and_pax_paths() {
        let long = b"d/".repeat(80);
        let mut long_name = long.clone();
        long_name.extend_from_slice(b"x.jpg");
        let pax_body = {
            let rec = |k: &str, v: &str| {
                let body = format!(" {k}={v}\n");
                let mut n = body.len() + 1;
                while n != body.len() + n.to_string().len() {
                    n = body.len() + n.to_string().len();
                }
                format!("{n}{body}")
            };
            rec("path", "p/\u{e9}t\u{e9}.cls")
        };
        let a = archive(&[
            (b"a.jpg", b"JPEG", b'0'),
            (b"dir/", b"", b'5'),
            (b"././@LongLink", &long_name, b'L'),
            (b"short", b"123", b'0'),
            (b"PaxHeaders/x", pax_body.as_bytes(), b'x'),
            (b"ignored-name", b"7", b'0'),
        ]);
        let s = scan(&a, &mut |_| {});
        assert_eq!(s.end, End::Complete);
        let names: Vec<&[u8]> = s.members.iter().map(|m| m.name.as_slice()).collect();
        // The `L` record names the member after it ("short", whose own name is cut to 100
        // bytes by writers); the pax record overrides "ignored-name".
        assert_eq!(names, [&b"a.jpg"[..], &long_name, "p/\u{e9}t\u{e9}.cls".as_bytes()]);
        assert_eq!(
            (s.members[1].size, &a[s.members[1].offset as usize..][..3]),
            (3, &b"123"[..])
        );
        assert_eq!(&a[s.members[0].offset as usize..][..4], b"JPEG");
        assert_eq!((s.members[2].size, a[s.members[2].offset as usize]), (1, b'7'));
    }

    #[test]
    fn cuts_and_bad_headers_are_reported_where_they_are() {
        let a = archive(&[(b"k.jpg", &[1u8; 1000], b'0'), (b"k.cls", b"3", b'0')]);
        // Cut inside the second member's header, then inside the first member's data.
        let s = scan(&a[..1536 + 100], &mut |_| {});
        assert_eq!(
            (s.members.len(), &s.end),
            (1, &End::Truncated { at: 1636, member: None })
        );
        let s = scan(&a[..700], &mut |_| {});
        assert_eq!(
            (s.members.len(), &s.end),
            (
                1,
                &End::Truncated {
                    at: 700,
                    member: Some(b"k.jpg".to_vec())
                }
            )
        );
        assert!(s.end.problem(1).unwrap().contains("inside member \"k.jpg\""));
        // Not a tar at all; a corrupted second header.
        let s = scan(&[b'x'; 2048], &mut |_| {});
        assert!(matches!(s.end, End::BadHeader { at: 0, .. }), "{:?}", s.end);
        assert!(s.end.problem(0).unwrap().starts_with("not a tar file"));
        let mut b = a.clone();
        b[1536 + 10] ^= 0x55;
        let s = scan(&b, &mut |_| {});
        assert!(matches!(s.end, End::BadHeader { at: 1536, .. }), "{:?}", s.end);
        assert_eq!(s.members.len(), 1);
        // Exactly at the end of a member, with no end-of-archive blocks: complete.
        let s = scan(&a[..1536 + 512 + 512], &mut |_| {});
        assert_eq!((s.members.len(), s.end), (2, End::Complete));
    }

    #[test]
    fn keys_are_the_path_up_to_the_base_names_first_dot() {
        let k = |n: &[u8]| split_key(n).map(|(k, e)| (n[k].to_vec(), n[e].to_vec()));
        assert_eq!(k(b"a/b.c/x.seg.jpg"), Some((b"a/b.c/x".to_vec(), b"seg.jpg".to_vec())));
        assert_eq!(k(b"000123.cls"), Some((b"000123".to_vec(), b"cls".to_vec())));
        assert_eq!(k(b"noext"), None);
        assert_eq!(k(b"d/.hidden"), None);
        assert_eq!(k(b"trailing."), None);
        assert_eq!(number(b"0000644\0").unwrap(), 0o644);
        assert_eq!(number(&[0x80, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]).unwrap(), 1 << 32);
        assert!(number(b"12389\0").is_err());
    }
}
