//! Where a sample field comes from, and its value in one sample (control.md, "Sample fields
//! (1.9)"): a WebDataset sample's member `EXT` (its bytes), the member `KEY` of the JSON object
//! in its member `EXT` (`EXT:KEY`, a dotted path), or a manifest's column.
//!
//! Values are found in an [`Extra`], which borrows the sample's members or row from the same read
//! as its image: a member's bytes are not copied; a JSON member is parsed once per sample however
//! many fields read it ([`values`]). What is missing or malformed is an error string for that
//! sample and field, which the caller names and puts under `on_error`.

use std::borrow::Cow;

use crate::wds::tar;
use crate::{Extra, FieldKind};

/// Where a field comes from, parsed from its `source` string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldFrom {
    /// A WebDataset member, by extension (lowercase): its whole bytes.
    Member(Vec<u8>),
    /// The member at `path` (dotted) of the JSON object in the WebDataset member `ext`.
    JsonKey { ext: Vec<u8>, path: Vec<String> },
    /// A manifest's column (CSV) or member (JSONL), or a Parquet column.
    Column(String),
    /// The member at `path` (dotted) of the Parquet struct column `column` (`COLUMN:KEY`).
    StructKey { column: String, path: Vec<String> },
}

impl FieldFrom {
    /// Parses `source` for a source of `kind`; the error says what is wrong with it.
    pub fn parse(source: &str, kind: FieldKind) -> Result<Self, String> {
        if source.is_empty() {
            return Err("source is empty".to_owned());
        }
        match kind {
            FieldKind::Columns => Ok(FieldFrom::Column(source.to_owned())),
            FieldKind::Parquet => match source.split_once(':') {
                None => Ok(FieldFrom::Column(source.to_owned())),
                Some((column, key)) => {
                    let path: Vec<String> = key.split('.').map(str::to_owned).collect();
                    if column.is_empty() || path.iter().any(String::is_empty) {
                        return Err(format!(
                            "source {source:?}: give COLUMN or COLUMN:KEY (a member of a struct column), each part non-empty"
                        ));
                    }
                    Ok(FieldFrom::StructKey {
                        column: column.to_owned(),
                        path,
                    })
                }
            },
            FieldKind::Members => {
                let (ext, key) = match source.split_once(':') {
                    Some((e, k)) => (e, Some(k)),
                    None => (source, None),
                };
                let ext = ext.trim_start_matches('.').to_ascii_lowercase().into_bytes();
                if ext.is_empty() {
                    return Err(format!(
                        "source {source:?} names no member extension (e.g. \"txt\" or \"json:caption\")"
                    ));
                }
                match key {
                    None => Ok(FieldFrom::Member(ext)),
                    Some(key) => {
                        let json = ext == b"json" || ext.ends_with(b".json");
                        // 1.10: `EXT:EXT` of a member that is not JSON is the whole member (what
                        // `Meta("aesthetic", {"aesthetic": "float32"})` sends): such a member has
                        // no keys, so this names nothing else.
                        if !json && key.as_bytes().eq_ignore_ascii_case(&ext) {
                            return Ok(FieldFrom::Member(ext));
                        }
                        if !json {
                            let e = String::from_utf8_lossy(&ext);
                            return Err(format!(
                                "source {source:?}: a key can be read only from a JSON member (extension json or *.json); the whole member .{e} is source {e:?} (Meta(None, {{\"{e}\": ...}}) or Meta({e:?}, {{\"{e}\": ...}}))"
                            ));
                        }
                        let path: Vec<String> = key.split('.').map(str::to_owned).collect();
                        if path.iter().any(String::is_empty) {
                            return Err(format!("source {source:?}: the key {key:?} has an empty part"));
                        }
                        Ok(FieldFrom::JsonKey { ext, path })
                    }
                }
            }
        }
    }

    /// How a message names it: `.txt`, `.json:caption`, or the column `caption`.
    pub fn describe(&self) -> String {
        match self {
            FieldFrom::Member(ext) => format!(".{}", String::from_utf8_lossy(ext)),
            FieldFrom::JsonKey { ext, path } => format!(".{}:{}", String::from_utf8_lossy(ext), path.join(".")),
            FieldFrom::Column(c) => format!("column {c:?}"),
            FieldFrom::StructKey { column, path } => format!("column {column:?} member {:?}", path.join(".")),
        }
    }

    /// The top-level column it reads (a Parquet column, a manifest's), if it reads one.
    pub fn column(&self) -> Option<&str> {
        match self {
            FieldFrom::Column(c) | FieldFrom::StructKey { column: c, .. } => Some(c),
            FieldFrom::Member(_) | FieldFrom::JsonKey { .. } => None,
        }
    }
}

/// One field's value in one sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// Text: a member's bytes (not checked to be UTF-8), or a CSV cell.
    Text(Cow<'a, [u8]>),
    /// A JSON value (a key of a JSON member, a JSONL manifest's member).
    Json(serde_json::Value),
}

/// The values of `wanted` in one sample's `extra`, in order: each one, or why it is not there.
/// Each JSON member (or manifest row) is parsed at most once.
pub fn values<'a>(extra: &Extra<'a>, wanted: &[FieldFrom]) -> Vec<Result<Value<'a>, String>> {
    match *extra {
        Extra::None => wanted
            .iter()
            .map(|_| Err("this source has no sample fields".to_owned()))
            .collect(),
        Extra::Members { members, data, base } => {
            // The JSON members parsed so far, by extension.
            let mut parsed: Vec<(&[u8], Result<serde_json::Value, String>)> = Vec::new();
            let member = |ext: &[u8]| -> Result<&'a [u8], String> {
                let m = members
                    .iter()
                    .find(|m| tar::split_key(&m.name).is_some_and(|(_, e)| m.name[e].eq_ignore_ascii_case(ext)))
                    .ok_or_else(|| format!("the sample has no member .{}", String::from_utf8_lossy(ext)))?;
                let end = base + data.len() as u64;
                match m.offset.checked_add(m.size) {
                    Some(stop) if m.offset >= base && stop <= end => {
                        Ok(&data[(m.offset - base) as usize..(stop - base) as usize])
                    }
                    _ => Err(format!(
                        "the member {:?} is cut off: {} bytes at offset {}, the file ends at {end}",
                        String::from_utf8_lossy(&m.name),
                        m.size,
                        m.offset
                    )),
                }
            };
            wanted
                .iter()
                .map(|w| match w {
                    FieldFrom::Member(ext) => member(ext).map(|b| Value::Text(Cow::Borrowed(b))),
                    FieldFrom::JsonKey { ext, path } => {
                        let i = match parsed.iter().position(|(e, _)| *e == ext.as_slice()) {
                            Some(i) => i,
                            None => {
                                let doc = member(ext).and_then(|b| {
                                    serde_json::from_slice::<serde_json::Value>(b).map_err(|e| {
                                        format!("the member .{} is not JSON: {e}", String::from_utf8_lossy(ext))
                                    })
                                });
                                parsed.push((ext.as_slice(), doc));
                                parsed.len() - 1
                            }
                        };
                        let doc = parsed[i].1.as_ref().map_err(Clone::clone)?;
                        lookup(doc, path).cloned().map(Value::Json).ok_or_else(|| {
                            format!(
                                "the member .{} has no key {:?}",
                                String::from_utf8_lossy(ext),
                                path.join(".")
                            )
                        })
                    }
                    FieldFrom::Column(_) | FieldFrom::StructKey { .. } => Err(format!(
                        "{}: a WebDataset sample has members, not columns",
                        w.describe()
                    )),
                })
                .collect()
        }
        Extra::Row { json, text } => {
            let row = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(json)
                .map_err(|e| format!("the manifest row's columns are not a JSON object: {e}"));
            wanted
                .iter()
                .map(|w| {
                    let row = row.as_ref().map_err(Clone::clone)?;
                    let FieldFrom::Column(c) = w else {
                        return Err(format!("{}: a manifest row has columns, not members", w.describe()));
                    };
                    match row.get(c) {
                        None => Err(format!("the manifest has no column {c:?} for this row")),
                        // A CSV cell is text whatever it looks like.
                        Some(serde_json::Value::String(s)) if text => {
                            Ok(Value::Text(Cow::Owned(s.clone().into_bytes())))
                        }
                        Some(v) => Ok(Value::Json(v.clone())),
                    }
                })
                .collect()
        }
        Extra::Cells { names, cells } => wanted
            .iter()
            .map(|w| {
                let cell = |c: &str| -> Result<&'a Value<'static>, String> {
                    names
                        .iter()
                        .position(|n| n == c)
                        .and_then(|i| cells.get(i))
                        .ok_or_else(|| format!("the row has no column {c:?}"))
                };
                match w {
                    FieldFrom::Column(c) => Ok(match cell(c)? {
                        Value::Text(t) => Value::Text(Cow::Borrowed(t)),
                        Value::Json(j) => Value::Json(j.clone()),
                    }),
                    FieldFrom::StructKey { column, path } => match cell(column)? {
                        Value::Json(doc @ serde_json::Value::Object(_)) => lookup(doc, path)
                            .cloned()
                            .map(Value::Json)
                            .ok_or_else(|| format!("the column {column:?} has no member {:?}", path.join("."))),
                        Value::Json(serde_json::Value::Null) => Err(format!("the column {column:?} is null")),
                        _ => Err(format!("the column {column:?} is not a struct")),
                    },
                    _ => Err(format!("{}: a Parquet row has columns, not members", w.describe())),
                }
            })
            .collect(),
    }
}

/// The member at a dotted `path` of a JSON document.
fn lookup<'v>(doc: &'v serde_json::Value, path: &[String]) -> Option<&'v serde_json::Value> {
    path.iter().try_fold(doc, |v, k| v.as_object()?.get(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, offset: u64, size: u64) -> tar::Member {
        tar::Member {
            name: name.as_bytes().to_vec(),
            offset,
            size,
        }
    }

    #[test]
    fn sources_parse_by_the_kind_of_source() {
        let m = FieldKind::Members;
        assert_eq!(FieldFrom::parse("TXT", m), Ok(FieldFrom::Member(b"txt".to_vec())));
        assert_eq!(
            FieldFrom::parse("json:meta.width", m),
            Ok(FieldFrom::JsonKey {
                ext: b"json".to_vec(),
                path: vec!["meta".into(), "width".into()]
            })
        );
        assert!(FieldFrom::parse("info.json:a", m).is_ok());
        // 1.10: a non-JSON member's own extension as its key is the whole member.
        assert_eq!(
            FieldFrom::parse("aesthetic:aesthetic", m),
            Ok(FieldFrom::Member(b"aesthetic".to_vec()))
        );
        assert_eq!(
            FieldFrom::parse("Score:score", m),
            Ok(FieldFrom::Member(b"score".to_vec()))
        );
        assert!(
            FieldFrom::parse("aesthetic:x", m)
                .unwrap_err()
                .contains("the whole member .aesthetic is source \"aesthetic\"")
        );
        // A JSON member keeps its keys, even one named as the member.
        assert_eq!(
            FieldFrom::parse("json:json", m),
            Ok(FieldFrom::JsonKey {
                ext: b"json".to_vec(),
                path: vec!["json".into()]
            })
        );
        assert!(
            FieldFrom::parse("txt:a", m)
                .unwrap_err()
                .contains("only from a JSON member")
        );
        assert!(FieldFrom::parse("json:a..b", m).unwrap_err().contains("empty part"));
        assert!(FieldFrom::parse(":a", m).is_err());
        assert_eq!(
            FieldFrom::parse("json:caption", FieldKind::Columns),
            Ok(FieldFrom::Column("json:caption".into()))
        );
    }

    #[test]
    fn members_are_borrowed_and_json_keys_found() {
        let data = br#"a caption{"caption": "hi", "meta": {"w": 3}}"#;
        let members = [member("k.jpg", 0, 0), member("k.txt", 0, 9), member("k.json", 9, 35)];
        let extra = Extra::Members {
            members: &members,
            data,
            base: 0,
        };
        let wanted = [
            FieldFrom::parse("txt", FieldKind::Members).unwrap(),
            FieldFrom::parse("json:caption", FieldKind::Members).unwrap(),
            FieldFrom::parse("json:meta.w", FieldKind::Members).unwrap(),
            FieldFrom::parse("json:nope", FieldKind::Members).unwrap(),
            FieldFrom::parse("cls", FieldKind::Members).unwrap(),
        ];
        let got = values(&extra, &wanted);
        assert!(matches!(&got[0], Ok(Value::Text(Cow::Borrowed(b))) if *b == b"a caption"));
        assert_eq!(got[1], Ok(Value::Json(serde_json::json!("hi"))));
        assert_eq!(got[2], Ok(Value::Json(serde_json::json!(3))));
        assert!(got[3].as_ref().unwrap_err().contains("no key \"nope\""));
        assert!(got[4].as_ref().unwrap_err().contains("no member .cls"));
    }

    #[test]
    fn a_cut_member_is_an_error_not_a_panic() {
        let members = [member("k.txt", 4, 100)];
        let extra = Extra::Members {
            members: &members,
            data: b"12345678",
            base: 0,
        };
        let got = values(&extra, &[FieldFrom::Member(b"txt".to_vec())]);
        assert!(got[0].as_ref().unwrap_err().contains("cut off"));
    }

    #[test]
    fn csv_cells_are_text_and_jsonl_members_json() {
        let json = br#"{"caption": "x", "w": "12"}"#;
        let wanted = [
            FieldFrom::Column("caption".into()),
            FieldFrom::Column("w".into()),
            FieldFrom::Column("z".into()),
        ];
        let csv = values(&Extra::Row { json, text: true }, &wanted);
        assert_eq!(csv[1], Ok(Value::Text(Cow::Owned(b"12".to_vec()))));
        assert!(csv[2].as_ref().unwrap_err().contains("no column \"z\""));
        let jsonl = values(&Extra::Row { json, text: false }, &wanted);
        assert_eq!(jsonl[1], Ok(Value::Json(serde_json::json!("12"))));
    }

    #[test]
    fn parquet_columns_and_struct_members() {
        let p = FieldKind::Parquet;
        assert_eq!(FieldFrom::parse("caption", p), Ok(FieldFrom::Column("caption".into())));
        let key = FieldFrom::parse("meta:size.w", p).unwrap();
        assert_eq!(
            key,
            FieldFrom::StructKey {
                column: "meta".into(),
                path: vec!["size".into(), "w".into()]
            }
        );
        assert!(FieldFrom::parse("meta:", p).unwrap_err().contains("COLUMN:KEY"));
        let names = ["caption".to_owned(), "meta".to_owned(), "gone".to_owned()];
        let cells = [
            Value::Text(Cow::Owned(b"a cat".to_vec())),
            Value::Json(serde_json::json!({"size": {"w": 3}})),
            Value::Json(serde_json::Value::Null),
        ];
        let extra = Extra::Cells {
            names: &names,
            cells: &cells,
        };
        let wanted = [
            FieldFrom::Column("caption".into()),
            key,
            FieldFrom::parse("meta:nope", p).unwrap(),
            FieldFrom::parse("gone:x", p).unwrap(),
            FieldFrom::parse("caption:x", p).unwrap(),
            FieldFrom::Column("other".into()),
        ];
        let got = values(&extra, &wanted);
        assert!(matches!(&got[0], Ok(Value::Text(Cow::Borrowed(b))) if *b == b"a cat"));
        assert_eq!(got[1], Ok(Value::Json(serde_json::json!(3))));
        assert!(got[2].as_ref().unwrap_err().contains("no member \"nope\""));
        assert!(got[3].as_ref().unwrap_err().contains("is null"));
        assert!(got[4].as_ref().unwrap_err().contains("not a struct"));
        assert!(got[5].as_ref().unwrap_err().contains("no column \"other\""));
    }
}
