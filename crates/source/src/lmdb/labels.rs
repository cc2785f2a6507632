//! Label tables for the raw layout: one label per sample key, kept apart from the images.
//!
//! A table comes from a key of the LMDB (e.g. `__labels__`) or from a sidecar file, and is one of:
//! - a JSON object `{"key": label, ...}`;
//! - a JSON array of labels, aligned with the samples in LMDB key order;
//! - a CSV file whose header is `key,label` (RFC 4180 quoting for keys holding commas);
//! - JSON lines, `{"key": ..., "label": ...}` per line;
//! - a pickled or msgpack'd dict or list of the same shape (keys may then be bytes).
//!
//! Labels are ints, or strings naming classes. With class names, the classes are the sorted
//! (bytewise) unique names found in the table, and a sample's label is its class's index; CSV
//! labels are names unless every one of them is an integer. A table mixing ints and names is an
//! error. Resolving a table against the sample keys ([`resolve`]) gives one label per sample, or
//! names the first sample without one.

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, Visitor};

use super::keys::KeyTable;
use super::msgpack::{self, Cursor, Item};
use super::pickle::{self, Node, Pickle};

/// One label as written in a table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Label {
    Int(i64),
    /// A class name.
    Name(Vec<u8>),
}

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct LabelVisitor;
        impl Visitor<'_> for LabelVisitor {
            type Value = Label;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer or a string label")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Label, E> {
                Ok(Label::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Label, E> {
                i64::try_from(v)
                    .map(Label::Int)
                    .map_err(|_| E::custom(format!("label {v} does not fit in 64 bits")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Label, E> {
                Ok(Label::Name(v.as_bytes().to_vec()))
            }
        }
        d.deserialize_any(LabelVisitor)
    }
}

/// A parsed label table.
#[derive(Debug, PartialEq)]
pub(super) enum Table {
    /// Labels by sample key.
    ByKey(HashMap<Vec<u8>, Label>),
    /// Labels in sample order.
    InOrder(Vec<Label>),
}

/// The encodings a table may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    Json,
    JsonLines,
    Csv,
    Pickle,
    Msgpack,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Json => "json",
            Format::JsonLines => "json lines",
            Format::Csv => "csv",
            Format::Pickle => "pickle",
            Format::Msgpack => "msgpack",
        })
    }
}

/// Guesses the format from the content; `extension` (of a sidecar file) settles JSON lines and
/// CSV, which content alone may not.
pub(super) fn detect(bytes: &[u8], extension: Option<&str>) -> Format {
    match extension.map(str::to_ascii_lowercase).as_deref() {
        Some("jsonl" | "ndjson") => return Format::JsonLines,
        Some("csv") => return Format::Csv,
        _ => {}
    }
    if pickle::sniff(bytes) {
        return Format::Pickle;
    }
    if matches!(bytes.first(), Some(0x80..=0x9f | 0xdc..=0xdf)) {
        return Format::Msgpack;
    }
    let text = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    match text.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => Format::Json,
        Some(b'{') => {
            // One JSON value is an object of labels; several are JSON lines.
            let values = serde_json::Deserializer::from_slice(text)
                .into_iter::<IgnoredAny>()
                .take(2)
                .count();
            if values > 1 { Format::JsonLines } else { Format::Json }
        }
        _ => Format::Csv,
    }
}

/// Why a label table cannot be parsed: a lowercase reason, without the table's origin (the
/// caller names it and the setting that chose it). Lines are 1-based.
#[derive(Debug, thiserror::Error)]
pub(super) enum TableError {
    /// A JSON array that is not an array of labels.
    #[error("{0}")]
    JsonArray(serde_json::Error),
    /// JSON that is not an object of labels.
    #[error("{0} (expected an object {{\"key\": label}} or an array)")]
    JsonObject(serde_json::Error),
    #[error("line {line}: {source}")]
    JsonLine { line: usize, source: serde_json::Error },
    /// Two JSON lines with one key.
    #[error("line {0}: duplicate key")]
    JsonLineDuplicate(usize),
    #[error("empty csv (expected a `key,label` header)")]
    EmptyCsv,
    #[error("line {0}: unterminated quote")]
    UnterminatedQuote(usize),
    /// Holds the header's names, lowercased and joined with commas.
    #[error("the csv header is {0:?}; expected `key,label`")]
    CsvHeader(String),
    #[error("line {line}: {fields} fields, expected 2 (key,label); quote keys that contain commas")]
    CsvFields { line: usize, fields: usize },
    /// Holds the key, escaped.
    #[error("line {line}: duplicate key \"{key}\"")]
    CsvDuplicate { line: usize, key: String },
    #[error(transparent)]
    Pickle(#[from] pickle::PickleError),
    /// A pickled bytes key (as latin-1 text) holding a character above U+00FF.
    #[error("a bytes key holds {0:?}, which is not latin-1")]
    NotLatin1(char),
    /// A key that is not a str or bytes; holds the pickled type.
    #[error("a key is a pickled {0}, not str or bytes")]
    PickleKey(&'static str),
    #[error("a label does not fit in 64 bits")]
    PickleBigLabel,
    /// A label that is not an int or a str; holds the pickled type.
    #[error("a label is a pickled {0}, not int or str")]
    PickleLabel(&'static str),
    /// Holds the pickled type of the table.
    #[error("the pickle holds a {0}, expected a dict {{key: label}} or a list of labels")]
    PickleTable(&'static str),
    #[error(transparent)]
    Msgpack(#[from] msgpack::MsgpackError),
    #[error("label {0} does not fit in 64 bits")]
    MsgpackBigLabel(i128),
    /// A label that is not an int or a str; holds the msgpack type.
    #[error("a label is a msgpack {0}, not int or str")]
    MsgpackLabel(&'static str),
    /// A key that is not a str or bin; holds the msgpack type.
    #[error("a key is a msgpack {0}, not str or bin")]
    MsgpackKey(&'static str),
    /// Holds the msgpack type of the table.
    #[error("the msgpack holds a {0}, expected a map {{key: label}} or an array of labels")]
    MsgpackTable(&'static str),
    /// Holds how many bytes are left.
    #[error("{0} trailing bytes after the msgpack table")]
    Trailing(usize),
}

/// Parses a table in `format`.
pub(super) fn parse(bytes: &[u8], format: Format) -> Result<Table, TableError> {
    let text = || bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    match format {
        Format::Json => parse_json(text()),
        Format::JsonLines => parse_json_lines(text()),
        Format::Csv => parse_csv(text()),
        Format::Pickle => parse_pickle(bytes),
        Format::Msgpack => parse_msgpack(bytes),
    }
}

fn parse_json(text: &[u8]) -> Result<Table, TableError> {
    let first = text.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        let list: Vec<Label> = serde_json::from_slice(text).map_err(TableError::JsonArray)?;
        return Ok(Table::InOrder(list));
    }
    let map: HashMap<String, Label> = serde_json::from_slice(text).map_err(TableError::JsonObject)?;
    // A single JSON line {"key": "k", "label": 3} is a one-sample JSON lines table.
    if map.len() == 2
        && let (Some(Label::Name(key)), Some(label)) = (map.get("key"), map.get("label"))
    {
        return Ok(Table::ByKey(HashMap::from([(key.clone(), label.clone())])));
    }
    Ok(Table::ByKey(
        map.into_iter().map(|(k, v)| (k.into_bytes(), v)).collect(),
    ))
}

fn parse_json_lines(text: &[u8]) -> Result<Table, TableError> {
    #[derive(Deserialize)]
    struct Line {
        key: String,
        label: Label,
    }
    let mut map = HashMap::new();
    for (n, line) in text.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let line: Line = serde_json::from_slice(line).map_err(|source| TableError::JsonLine { line: n + 1, source })?;
        if map.insert(line.key.into_bytes(), line.label).is_some() {
            return Err(TableError::JsonLineDuplicate(n + 1));
        }
    }
    Ok(Table::ByKey(map))
}

/// Splits one CSV record into fields, with RFC 4180 quotes (`"a,b"`, `""` for a quote); `None`
/// when a quote is not closed.
fn csv_fields(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut fields = Vec::new();
    let mut field = Vec::new();
    let mut quoted = false;
    let mut i = 0;
    let mut at_start = true;
    while i < line.len() {
        let b = line[i];
        if quoted {
            if b == b'"' {
                if line.get(i + 1) == Some(&b'"') {
                    field.push(b'"');
                    i += 1;
                } else {
                    quoted = false;
                }
            } else {
                field.push(b);
            }
        } else if b == b'"' && at_start {
            quoted = true;
            at_start = false;
        } else if b == b',' {
            fields.push(std::mem::take(&mut field));
            at_start = true;
        } else {
            field.push(b);
            at_start = false;
        }
        i += 1;
    }
    if quoted {
        return None;
    }
    fields.push(field);
    Some(fields)
}

fn parse_csv(text: &[u8]) -> Result<Table, TableError> {
    let mut lines = text
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .enumerate()
        .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace));
    let Some((_, header)) = lines.next() else {
        return Err(TableError::EmptyCsv);
    };
    let header = csv_fields(header).ok_or(TableError::UnterminatedQuote(1))?;
    let names: Vec<String> = header
        .iter()
        .map(|f| String::from_utf8_lossy(f).trim().to_ascii_lowercase())
        .collect();
    if names != ["key", "label"] {
        return Err(TableError::CsvHeader(names.join(",")));
    }
    let mut rows: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (n, line) in lines {
        let mut fields = csv_fields(line).ok_or(TableError::UnterminatedQuote(n + 1))?;
        if fields.len() != 2 {
            return Err(TableError::CsvFields {
                line: n + 1,
                fields: fields.len(),
            });
        }
        let label = fields.pop().unwrap_or_default();
        let key = fields.pop().unwrap_or_default();
        let label = label.trim_ascii().to_vec();
        if !seen.insert(key.clone()) {
            return Err(TableError::CsvDuplicate {
                line: n + 1,
                key: key.escape_ascii().to_string(),
            });
        }
        rows.push((key, label));
    }
    // Every label is text: they are ints only if all of them parse as ints.
    let ints: Option<Vec<i64>> = rows
        .iter()
        .map(|(_, l)| std::str::from_utf8(l).ok()?.parse::<i64>().ok())
        .collect();
    let map = match ints {
        Some(ints) => rows
            .into_iter()
            .zip(ints)
            .map(|((k, _), v)| (k, Label::Int(v)))
            .collect(),
        None => rows.into_iter().map(|(k, l)| (k, Label::Name(l))).collect(),
    };
    Ok(Table::ByKey(map))
}

fn pickle_key(p: &Pickle<'_>, id: pickle::NodeId) -> Result<Vec<u8>, TableError> {
    match p.node(id) {
        Node::Str(s) => Ok(s.as_bytes().to_vec()),
        Node::Bytes(b) => Ok(b.to_vec()),
        Node::Latin1(t) => {
            let mut out = Vec::new();
            pickle::latin1_to_bytes(t, &mut out).map_err(TableError::NotLatin1)?;
            Ok(out)
        }
        other => Err(TableError::PickleKey(other.type_name())),
    }
}

fn pickle_label(p: &Pickle<'_>, id: pickle::NodeId) -> Result<Label, TableError> {
    match p.node(id) {
        Node::Int(v) => Ok(Label::Int(*v)),
        Node::Bool(b) => Ok(Label::Int((*b).into())),
        Node::Str(s) => Ok(Label::Name(s.as_bytes().to_vec())),
        Node::Bytes(b) => Ok(Label::Name(b.to_vec())),
        Node::BigInt => Err(TableError::PickleBigLabel),
        other => Err(TableError::PickleLabel(other.type_name())),
    }
}

fn parse_pickle(bytes: &[u8]) -> Result<Table, TableError> {
    let p = Pickle::parse(bytes, pickle::TABLE_LIMITS)?;
    match p.root() {
        Node::Dict(entries) => {
            let mut map = HashMap::with_capacity(entries.len());
            for &(k, v) in entries {
                map.insert(pickle_key(&p, k)?, pickle_label(&p, v)?);
            }
            Ok(Table::ByKey(map))
        }
        Node::List(items) | Node::Tuple(items) => Ok(Table::InOrder(
            items.iter().map(|&i| pickle_label(&p, i)).collect::<Result<_, _>>()?,
        )),
        other => Err(TableError::PickleTable(other.type_name())),
    }
}

fn msgpack_label(item: Item<'_>) -> Result<Label, TableError> {
    match item {
        Item::Int(v) => i64::try_from(v)
            .map(Label::Int)
            .map_err(|_| TableError::MsgpackBigLabel(v)),
        Item::Bool(b) => Ok(Label::Int(b.into())),
        Item::Str(s) | Item::Bin(s) => Ok(Label::Name(s.to_vec())),
        other => Err(TableError::MsgpackLabel(other.type_name())),
    }
}

fn parse_msgpack(bytes: &[u8]) -> Result<Table, TableError> {
    let mut c = Cursor::new(bytes);
    let table = match c.next()? {
        Item::Map(n) => {
            let mut map = HashMap::with_capacity(n);
            for _ in 0..n {
                let key = match c.next()? {
                    Item::Str(s) | Item::Bin(s) => s.to_vec(),
                    other => return Err(TableError::MsgpackKey(other.type_name())),
                };
                map.insert(key, msgpack_label(c.next()?)?);
            }
            Table::ByKey(map)
        }
        Item::Array(n) => {
            let mut list = Vec::with_capacity(n);
            for _ in 0..n {
                list.push(msgpack_label(c.next()?)?);
            }
            Table::InOrder(list)
        }
        other => return Err(TableError::MsgpackTable(other.type_name())),
    };
    if c.left() > 0 {
        return Err(TableError::Trailing(c.left()));
    }
    Ok(table)
}

/// One label per sample, and the class names when the labels were names.
#[derive(Debug, PartialEq)]
pub(super) struct Resolved {
    /// `labels[i]` is the label of sample `i`.
    pub(super) labels: Vec<i64>,
    /// Sorted unique class names; empty for integer labels.
    pub(super) classes: Vec<Vec<u8>>,
}

/// Why a table does not fit the samples.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ResolveError {
    /// Sample `index` has no entry in a by-key table.
    Missing { index: u64 },
    /// An in-order table's length differs from the number of samples.
    Count { labels: usize, samples: u64 },
    /// The table holds both ints and names.
    Mixed,
}

/// Gives every sample of `keys` its label from `table`.
pub(super) fn resolve(table: &Table, keys: &KeyTable) -> Result<Resolved, ResolveError> {
    let all: Box<dyn Iterator<Item = &Label>> = match table {
        Table::ByKey(map) => Box::new(map.values()),
        Table::InOrder(list) => Box::new(list.iter()),
    };
    let mut names = BTreeSet::new();
    let mut ints = false;
    for label in all {
        match label {
            Label::Int(_) => ints = true,
            Label::Name(n) => {
                names.insert(n.as_slice());
            }
        }
    }
    if ints && !names.is_empty() {
        return Err(ResolveError::Mixed);
    }
    let classes: Vec<Vec<u8>> = names.into_iter().map(<[u8]>::to_vec).collect();
    let value = |label: &Label| -> i64 {
        match label {
            Label::Int(v) => *v,
            // Every name is in `classes`, which is sorted.
            Label::Name(n) => classes.binary_search(n).map_or(crate::NO_LABEL, |i| i as i64),
        }
    };
    let labels = match table {
        Table::ByKey(map) => {
            let mut labels = Vec::with_capacity(keys.len() as usize);
            for (index, key) in keys.iter().enumerate() {
                let label = map.get(key).ok_or(ResolveError::Missing { index: index as u64 })?;
                labels.push(value(label));
            }
            labels
        }
        Table::InOrder(list) => {
            if list.len() as u64 != keys.len() {
                return Err(ResolveError::Count {
                    labels: list.len(),
                    samples: keys.len(),
                });
            }
            list.iter().map(value).collect()
        }
    };
    Ok(Resolved { labels, classes })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn keys(ks: &[&[u8]]) -> KeyTable {
        let mut t = KeyTable::with_capacity(ks.len());
        for k in ks {
            t.push(k);
        }
        t
    }

    fn by_key(pairs: &[(&[u8], Label)]) -> Table {
        Table::ByKey(pairs.iter().map(|(k, v)| (k.to_vec(), v.clone())).collect())
    }

    fn name(s: &str) -> Label {
        Label::Name(s.as_bytes().to_vec())
    }

    fn parse_any(bytes: &[u8], ext: Option<&str>) -> Table {
        let format = detect(bytes, ext);
        parse(bytes, format).unwrap_or_else(|e| panic!("{format}: {e}"))
    }

    #[test]
    fn json_object_and_array() {
        assert_eq!(detect(b" {\"a\": 1}", None), Format::Json);
        assert_eq!(
            parse_any(b"{\"a\": 1, \"b\": -2}", None),
            by_key(&[(b"a", Label::Int(1)), (b"b", Label::Int(-2))])
        );
        assert_eq!(
            parse_any(b"\xef\xbb\xbf[\"cat\", \"dog\"]", None),
            Table::InOrder(vec![name("cat"), name("dog")])
        );
        let e = parse(b"{\"a\": 1.5}", Format::Json).unwrap_err().to_string();
        assert!(e.contains("an integer or a string label"), "{e}");
        let e = parse(b"{\"a\": 18446744073709551615}", Format::Json)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not fit"), "{e}");
    }

    #[test]
    fn json_lines() {
        let text = b"{\"key\": \"a\", \"label\": 1}\n\n{\"key\": \"b\", \"label\": 2, \"extra\": 0}\n";
        assert_eq!(detect(text, None), Format::JsonLines);
        assert_eq!(
            parse_any(text, None),
            by_key(&[(b"a", Label::Int(1)), (b"b", Label::Int(2))])
        );
        // A single line is still one sample, not a table of samples "key" and "label".
        let one = b"{\"key\": \"a\", \"label\": \"cat\"}";
        assert_eq!(parse_any(one, None), by_key(&[(b"a", name("cat"))]));
        assert_eq!(parse_any(one, Some("JSONL")), by_key(&[(b"a", name("cat"))]));
        let e = parse(
            b"{\"key\": \"a\", \"label\": 1}\n{\"key\": \"a\", \"label\": 1}",
            Format::JsonLines,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 2: duplicate"), "{e}");
        let e = parse(b"{\"key\": \"a\"}", Format::JsonLines).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("label"), "{e}");
    }

    #[test]
    fn csv() {
        let text = b"key,label\r\na,1\n\"b,c\",2\n\"d\"\"e\", 3 \n";
        assert_eq!(detect(text, None), Format::Csv);
        assert_eq!(
            parse_any(text, None),
            by_key(&[(b"a", Label::Int(1)), (b"b,c", Label::Int(2)), (b"d\"e", Label::Int(3))])
        );
        // One name makes them all names.
        assert_eq!(
            parse_any(b"Key, Label\na,7\nb,cat\n", Some("csv")),
            by_key(&[(b"a", name("7")), (b"b", name("cat"))])
        );
        for (text, want) in [
            (&b"path,class\na,1\n"[..], "header"),
            (b"key,label\na,1,2\n", "line 2: 3 fields"),
            (b"key,label\n\"a,1\n", "unterminated"),
            (b"key,label\na,1\na,2\n", "line 3: duplicate key \"a\""),
            (b"", "empty csv"),
        ] {
            let e = parse(text, Format::Csv).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn pickle_tables() {
        // pickle.dumps({b'\xff': 1, 'a': 'cat'}, protocol=4)
        let v = b"\x80\x04\x95\x15\x00\x00\x00\x00\x00\x00\x00}\x94(C\x01\xff\x94K\x01\x8c\x01a\x94\x8c\x03cat\x94u.";
        assert_eq!(detect(v, None), Format::Pickle);
        assert_eq!(
            parse_any(v, None),
            by_key(&[(b"\xff", Label::Int(1)), (b"a", name("cat"))])
        );
        // pickle.dumps({b'\xff': 2}, protocol=2): bytes keys as latin-1 text.
        let v = b"\x80\x02}q\x00c_codecs\nencode\nq\x01X\x02\x00\x00\x00\xc3\xbfq\x02X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05K\x02s.";
        assert_eq!(parse_any(v, None), by_key(&[(b"\xff", Label::Int(2))]));
        // pickle.dumps([3, 4], protocol=3)
        assert_eq!(
            parse_any(b"\x80\x03]q\x00(K\x03K\x04e.", None),
            Table::InOrder(vec![Label::Int(3), Label::Int(4)])
        );
        let e = parse(b"\x80\x03K\x03.", Format::Pickle).unwrap_err().to_string();
        assert!(e.contains("holds a int"), "{e}");
        let e = parse(b"\x80\x03]G?\xf8\x00\x00\x00\x00\x00\x00a.", Format::Pickle)
            .unwrap_err()
            .to_string();
        assert!(e.contains("label is a pickled float"), "{e}");
    }

    #[test]
    fn msgpack_tables() {
        let v = b"\x82\xc4\x01\xff\x01\xa1a\xa3cat";
        assert_eq!(detect(v, None), Format::Msgpack);
        assert_eq!(
            parse_any(v, None),
            by_key(&[(b"\xff", Label::Int(1)), (b"a", name("cat"))])
        );
        assert_eq!(
            parse_any(b"\x92\x03\xd0\xfe", None),
            Table::InOrder(vec![Label::Int(3), Label::Int(-2)])
        );
        let e = parse(b"\x92\x03\x03\x03", Format::Msgpack).unwrap_err().to_string();
        assert!(e.contains("trailing"), "{e}");
        let e = parse(b"\x81\x01\x01", Format::Msgpack).unwrap_err().to_string();
        assert!(e.contains("key is a msgpack int"), "{e}");
    }

    #[test]
    fn resolve_by_key_and_in_order() {
        let ks = keys(&[b"a", b"b", b"c"]);
        let t = by_key(&[
            (b"a", name("dog")),
            (b"b", name("cat")),
            (b"c", name("dog")),
            (b"z", name("ant")),
        ]);
        let r = resolve(&t, &ks).unwrap();
        // Classes come from the whole table, sorted: ant, cat, dog.
        assert_eq!(r.classes, vec![b"ant".to_vec(), b"cat".to_vec(), b"dog".to_vec()]);
        assert_eq!(r.labels, vec![2, 1, 2]);
        let t = Table::InOrder(vec![Label::Int(5), Label::Int(6), Label::Int(7)]);
        assert_eq!(
            resolve(&t, &ks).unwrap(),
            Resolved {
                labels: vec![5, 6, 7],
                classes: vec![]
            }
        );
    }

    #[test]
    fn resolve_errors() {
        let ks = keys(&[b"a", b"b"]);
        assert_eq!(
            resolve(&by_key(&[(b"a", Label::Int(1))]), &ks),
            Err(ResolveError::Missing { index: 1 })
        );
        assert_eq!(
            resolve(&Table::InOrder(vec![Label::Int(1)]), &ks),
            Err(ResolveError::Count { labels: 1, samples: 2 })
        );
        assert_eq!(
            resolve(&by_key(&[(b"a", Label::Int(1)), (b"b", name("x"))]), &ks),
            Err(ResolveError::Mixed)
        );
    }

    proptest! {
        #[test]
        fn never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            for format in [Format::Json, Format::JsonLines, Format::Csv, Format::Pickle, Format::Msgpack] {
                let _ = parse(&data, format);
            }
            let _ = detect(&data, None);
        }

        #[test]
        fn csv_round_trips_keys(
            rows in proptest::collection::btree_map("[a-z,\" ]{0,8}", 0i64..1000, 0..20),
        ) {
            let mut text = String::from("key,label\n");
            for (k, v) in &rows {
                text.push_str(&format!("\"{}\",{v}\n", k.replace('"', "\"\"")));
            }
            let table = parse(text.as_bytes(), Format::Csv).unwrap();
            let want: HashMap<Vec<u8>, Label> =
                rows.iter().map(|(k, v)| (k.as_bytes().to_vec(), Label::Int(*v))).collect();
            prop_assert_eq!(table, Table::ByKey(want));
        }
    }
}
