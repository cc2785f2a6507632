//! Which tars a WebDataset `dataset` names: a directory, one `.tar`, or a brace/glob pattern
//! (control.md, "WebDataset shards").
//!
//! Braces are expanded first, anywhere in the path: `{000..099}` (numbers; zero-padded to the
//! first number's width when it has a leading zero, as `braceexpand` does) and `{a,b,c}`, nested
//! or not. Then `*` and `?` may match in the file name only, against the directory's entries,
//! sorted bytewise.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Most paths one pattern may expand to.
pub const MAX_PATHS: usize = 1 << 20;

/// Why a dataset path or pattern names no tars ([`tars`], [`expand_braces`]).
#[derive(Debug, thiserror::Error)]
pub enum PatternError {
    /// The directory the dataset names cannot be listed.
    #[error("listing {}: {source}", path.display())]
    List { path: PathBuf, source: std::io::Error },
    /// A glob in a directory of the pattern, not its file name.
    #[error("{dataset}: `*` and `?` may only match in the file name, not in {}", dir.display())]
    GlobInDirectory { dataset: String, dir: PathBuf },
    /// The directory a glob matches in cannot be listed.
    #[error("{dataset}: listing {}: {source}", dir.display())]
    ListGlob {
        dataset: String,
        dir: PathBuf,
        source: std::io::Error,
    },
    /// A path the braces expand to is not a file.
    #[error("{dataset}: {} does not exist or is not a file", path.display())]
    Missing { dataset: String, path: PathBuf },
    /// More than [`MAX_PATHS`] files match.
    #[error("{dataset} matches more than {MAX_PATHS} files")]
    TooMany { dataset: String },
    /// Nothing matches.
    #[error("{dataset} matches no file")]
    NoMatch { dataset: String },
    /// A `{` is never closed.
    #[error("{pattern}: a `{{` without its `}}`")]
    Unclosed { pattern: String },
    /// `{a..b}` whose ends do not parse as numbers.
    #[error("{pattern}: {{{inner}}} is not a range of numbers")]
    NotNumbers { pattern: String, inner: String },
    /// `{a..b}` with `a > b`, or too many numbers.
    #[error("{pattern}: the range {{{inner}}} is empty or too long")]
    BadRange { pattern: String, inner: String },
    /// The braces expand to more than [`MAX_PATHS`] paths.
    #[error("{pattern} expands to more than {MAX_PATHS} paths")]
    Expands { pattern: String },
}

/// Whether `s` is a pattern rather than a path.
pub fn is_pattern(s: &str) -> bool {
    s.contains(['{', '*', '?'])
}

/// The tar files a dataset path names: a directory's `*.tar` files (sorted bytewise), a file,
/// or a pattern's matches. Every result exists; an error says what matched nothing.
pub fn tars(dataset: &str) -> Result<Vec<PathBuf>, PatternError> {
    let path = Path::new(dataset);
    if !is_pattern(dataset) || path.exists() {
        if path.is_dir() {
            let mut tars = tars_in(path).map_err(|source| PatternError::List {
                path: path.to_owned(),
                source,
            })?;
            tars.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
            return Ok(tars);
        }
        return Ok(vec![path.to_owned()]);
    }
    let mut out = Vec::new();
    for p in expand_braces(dataset)? {
        let p = PathBuf::from(p);
        let name = p.file_name().map(|n| n.as_bytes().to_vec()).unwrap_or_default();
        if name.iter().any(|b| matches!(b, b'*' | b'?')) {
            let dir = p.parent().unwrap_or(Path::new("/"));
            if dir.as_os_str().as_bytes().iter().any(|b| matches!(b, b'*' | b'?')) {
                return Err(PatternError::GlobInDirectory {
                    dataset: dataset.to_owned(),
                    dir: dir.to_owned(),
                });
            }
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|source| PatternError::ListGlob {
                    dataset: dataset.to_owned(),
                    dir: dir.to_owned(),
                    source,
                })?
                .flatten()
                .filter(|e| glob_match(&name, e.file_name().as_bytes()))
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect();
            found.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
            out.extend(found);
        } else if p.is_file() {
            out.push(p);
        } else {
            return Err(PatternError::Missing {
                dataset: dataset.to_owned(),
                path: p,
            });
        }
        if out.len() > MAX_PATHS {
            return Err(PatternError::TooMany {
                dataset: dataset.to_owned(),
            });
        }
    }
    if out.is_empty() {
        return Err(PatternError::NoMatch {
            dataset: dataset.to_owned(),
        });
    }
    Ok(out)
}

/// The regular `*.tar` files directly in `dir`.
pub fn tars_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "tar") && p.is_file())
        .collect())
}

/// `*` any run of bytes, `?` any one byte, everything else itself.
pub fn glob_match(pat: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while n < name.len() {
        if p < pat.len() && (pat[p] == b'?' || pat[p] == name[n]) {
            p += 1;
            n += 1;
        } else if p < pat.len() && pat[p] == b'*' {
            star = Some(p);
            mark = n;
            p += 1;
        } else if let Some(s) = star {
            p = s + 1;
            mark += 1;
            n = mark;
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// Expands every brace group of `s`, left to right.
pub fn expand_braces(s: &str) -> Result<Vec<String>, PatternError> {
    let Some(open) = s.find('{') else {
        return Ok(vec![s.to_owned()]);
    };
    let mut depth = 0;
    let close = s[open..]
        .char_indices()
        .find_map(|(i, c)| {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(open + i);
                    }
                }
                _ => {}
            }
            None
        })
        .ok_or_else(|| PatternError::Unclosed { pattern: s.to_owned() })?;
    let (head, inner, tail) = (&s[..open], &s[open + 1..close], &s[close + 1..]);
    let alternatives: Vec<String> = if let Some((a, b)) = numeric_range(inner) {
        let (lo, hi) = (a.parse::<u64>().ok(), b.parse::<u64>().ok());
        let (Some(lo), Some(hi)) = (lo, hi) else {
            return Err(PatternError::NotNumbers {
                pattern: s.to_owned(),
                inner: inner.to_owned(),
            });
        };
        if lo > hi || hi - lo >= MAX_PATHS as u64 {
            return Err(PatternError::BadRange {
                pattern: s.to_owned(),
                inner: inner.to_owned(),
            });
        }
        let width = if a.len() > 1 && a.starts_with('0') { a.len() } else { 0 };
        (lo..=hi).map(|v| format!("{v:0width$}")).collect()
    } else {
        split_top(inner)
    };
    let mut out = Vec::new();
    for alt in alternatives {
        for rest in expand_braces(&format!("{alt}{tail}"))? {
            out.push(format!("{head}{rest}"));
            if out.len() > MAX_PATHS {
                return Err(PatternError::Expands { pattern: s.to_owned() });
            }
        }
    }
    Ok(out)
}

/// `"a..b"` with two runs of digits.
fn numeric_range(inner: &str) -> Option<(&str, &str)> {
    let (a, b) = inner.split_once("..")?;
    let digits = |x: &str| !x.is_empty() && x.bytes().all(|c| c.is_ascii_digit());
    (digits(a) && digits(b)).then_some((a, b))
}

/// `inner` split at its commas outside nested braces.
fn split_top(inner: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in inner.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_and_globs_expand_as_webdataset_users_write_them() {
        assert_eq!(
            expand_braces("/d/s-{000..002}.tar").unwrap(),
            ["/d/s-000.tar", "/d/s-001.tar", "/d/s-002.tar"]
        );
        assert_eq!(expand_braces("/{a,b{1,2}}/x{8..10}").unwrap().len(), 9);
        assert_eq!(expand_braces("{a,b}{c,d}").unwrap(), ["ac", "ad", "bc", "bd"]);
        assert!(expand_braces("/d/{1..").is_err());
        assert!(expand_braces("/d/{5..1}").is_err());
        assert!(glob_match(b"s-*.tar", b"s-0001.tar"));
        assert!(glob_match(b"s-??.tar", b"s-01.tar"));
        assert!(!glob_match(b"s-??.tar", b"s-001.tar"));
        assert!(!glob_match(b"*.tar", b"x.tar.rfidx"));

        let tmp = tempfile::tempdir().unwrap();
        for n in ["b.tar", "a.tar", "c.txt", "a.tar.rfidx"] {
            std::fs::write(tmp.path().join(n), b"").unwrap();
        }
        let d = tmp.path().display();
        let names = |v: Vec<PathBuf>| -> Vec<String> {
            v.iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(names(tars(&d.to_string()).unwrap()), ["a.tar", "b.tar"]);
        assert_eq!(names(tars(&format!("{d}/*.tar")).unwrap()), ["a.tar", "b.tar"]);
        assert_eq!(names(tars(&format!("{d}/{{b,a}}.tar")).unwrap()), ["b.tar", "a.tar"]);
        assert!(
            tars(&format!("{d}/{{a,z}}.tar"))
                .unwrap_err()
                .to_string()
                .contains("z.tar does not exist")
        );
        assert!(
            tars(&format!("{d}/q*.tar"))
                .unwrap_err()
                .to_string()
                .contains("matches no file")
        );
    }
}
