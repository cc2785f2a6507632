//! Sample records: an LMDB value holding both the image bytes and the label.
//!
//! A record is a pickled or msgpack'd `(image_bytes, label)` tuple / list, or a dict / map with an
//! image field ([`IMAGE_FIELDS`]) and a label field ([`LABEL_FIELDS`]); other fields are ignored.
//! The label is a Python int (`None` means "no label"). Errors are plain lowercase reasons; the
//! caller adds the path, index and key.

use std::fmt;

use super::msgpack::{Cursor, Item, MsgpackError};
use super::pickle::{self, Node, Pickle, PickleError};
use crate::NO_LABEL;

/// Field names that hold the image, most preferred first.
pub(super) const IMAGE_FIELDS: [&str; 6] = ["image", "img", "data", "jpeg", "png", "bytes"];
/// Field names that hold the label, most preferred first.
pub(super) const LABEL_FIELDS: [&str; 5] = ["label", "target", "class", "cls", "y"];

/// Where a record's image bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Image<'a> {
    /// A slice of the LMDB value itself.
    Borrowed(&'a [u8]),
    /// Latin-1 text to turn back into bytes (protocol-2 pickles from Python 3); see
    /// [`pickle::latin1_to_bytes`].
    Latin1(&'a str),
}

/// A decoded record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Record<'a> {
    pub(super) image: Image<'a>,
    pub(super) label: i64,
}

fn field_rank(names: &[&str], key: &[u8]) -> Option<usize> {
    names.iter().position(|n| n.as_bytes() == key)
}

fn fields_hint() -> String {
    format!(
        "expected a (image_bytes, label) tuple or list, or a dict with an image field ({}) and a \
         label field ({})",
        IMAGE_FIELDS.join("/"),
        LABEL_FIELDS.join("/")
    )
}

/// Up to a few field names, for messages.
fn list_fields(fields: &[Vec<u8>]) -> String {
    let mut shown: Vec<String> = fields
        .iter()
        .take(8)
        .map(|f| format!("\"{}\"", f.escape_ascii()))
        .collect();
    if fields.len() > 8 {
        shown.push("...".into());
    }
    if shown.is_empty() {
        "none".into()
    } else {
        shown.join(", ")
    }
}

const STR_LABEL: &str = "records need integer labels: map class names to ints when writing the \
                         lmdb, or store raw images and use --lmdb-layout raw with a labels file \
                         (--labels), which accepts class names";

/// The encoding of a record, in the words of its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Codec {
    Pickle,
    Msgpack,
}

impl Codec {
    /// Its name for a dict.
    fn dict(self) -> &'static str {
        match self {
            Codec::Pickle => "dict",
            Codec::Msgpack => "map",
        }
    }

    /// Its name for a byte string.
    fn bytes(self) -> &'static str {
        match self {
            Codec::Pickle => "bytes",
            Codec::Msgpack => "bin",
        }
    }

    /// Its name for "no value".
    fn none(self) -> &'static str {
        match self {
            Codec::Pickle => "None",
            Codec::Msgpack => "nil",
        }
    }
}

/// "pickled" or "msgpack", as in "a pickled int".
impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Codec::Pickle => "pickled",
            Codec::Msgpack => "msgpack",
        })
    }
}

/// Why a value is not a record: a lowercase reason, without the path, index and key (the
/// caller adds them, and the `--lmdb-layout` that chose the decoding). Types are the
/// encoding's names (`tuple`, `str`, `float`).
#[derive(Debug, thiserror::Error)]
pub(super) enum RecordError {
    #[error(transparent)]
    Pickle(#[from] PickleError),
    #[error(transparent)]
    Msgpack(#[from] MsgpackError),
    /// A tuple or list (array) of other than two items.
    #[error("record is a {codec} {kind} of {items} items; {}", fields_hint())]
    Items {
        codec: Codec,
        kind: &'static str,
        items: usize,
    },
    /// Neither a sequence nor a dict.
    #[error("record is a {codec} {kind}; {}", fields_hint())]
    NotRecord { codec: Codec, kind: &'static str },
    /// A dict without an image field; `fields` lists the fields it has.
    #[error("{codec} {} has no image field (fields: {fields}); {}", codec.dict(), fields_hint())]
    NoImageField { codec: Codec, fields: String },
    /// A dict without a label field; `fields` lists the fields it has.
    #[error(
        "{codec} {} has no label field (fields: {fields}); {} (use {} for an unlabeled sample)",
        codec.dict(),
        fields_hint(),
        codec.none()
    )]
    NoLabelField { codec: Codec, fields: String },
    /// The image is not a byte string.
    #[error("the image is a {codec} {kind}, not {}", codec.bytes())]
    ImageType { codec: Codec, kind: &'static str },
    /// A pickled int beyond 64 bits (its value is not kept).
    #[error("the label does not fit in 64 bits")]
    BigLabel,
    #[error("the label {0} does not fit in 64 bits")]
    LabelRange(i128),
    /// A class name for a label; holds it, escaped.
    #[error("the label is a str (\"{0}\"); {STR_LABEL}")]
    StrLabel(String),
    #[error("the label is a {codec} {kind}; {STR_LABEL}")]
    LabelType { codec: Codec, kind: &'static str },
    /// Bytes after a whole msgpack record: `left` of them from byte `at`.
    #[error("{left} trailing bytes after the msgpack record (at byte {at})")]
    Trailing { left: usize, at: usize },
}

/// Decodes a pickled record; zero-copy except for protocol-2 bytes ([`Image::Latin1`]).
pub(super) fn from_pickle(value: &[u8]) -> Result<Record<'_>, RecordError> {
    let codec = Codec::Pickle;
    let p = Pickle::parse(value, pickle::RECORD_LIMITS)?;
    let (image, label) = match p.root() {
        Node::Tuple(items) | Node::List(items) => match items.as_slice() {
            &[image, label] => (p.node(image), p.node(label)),
            _ => {
                return Err(RecordError::Items {
                    codec,
                    kind: p.root().type_name(),
                    items: items.len(),
                });
            }
        },
        Node::Dict(entries) => {
            let mut image: Option<(usize, &Node<'_>)> = None;
            let mut label: Option<(usize, &Node<'_>)> = None;
            let mut seen = Vec::new();
            for &(k, v) in entries {
                let name: &[u8] = match p.node(k) {
                    Node::Str(s) | Node::Latin1(s) => s.as_bytes(),
                    Node::Bytes(b) => b,
                    _ => continue,
                };
                seen.push(name.to_vec());
                if let Some(rank) = field_rank(&IMAGE_FIELDS, name) {
                    if image.is_none_or(|(r, _)| rank < r) {
                        image = Some((rank, p.node(v)));
                    }
                } else if let Some(rank) = field_rank(&LABEL_FIELDS, name)
                    && label.is_none_or(|(r, _)| rank < r)
                {
                    label = Some((rank, p.node(v)));
                }
            }
            match (image, label) {
                (Some((_, i)), Some((_, l))) => (i, l),
                (None, _) => {
                    return Err(RecordError::NoImageField {
                        codec,
                        fields: list_fields(&seen),
                    });
                }
                (_, None) => {
                    return Err(RecordError::NoLabelField {
                        codec,
                        fields: list_fields(&seen),
                    });
                }
            }
        }
        other => {
            return Err(RecordError::NotRecord {
                codec,
                kind: other.type_name(),
            });
        }
    };
    let image = match *image {
        Node::Bytes(b) => Image::Borrowed(b),
        Node::Latin1(t) => Image::Latin1(t),
        ref other => {
            return Err(RecordError::ImageType {
                codec,
                kind: other.type_name(),
            });
        }
    };
    let label = match *label {
        Node::Int(v) => v,
        Node::Bool(b) => i64::from(b),
        Node::None => NO_LABEL,
        Node::BigInt => return Err(RecordError::BigLabel),
        Node::Str(s) => return Err(RecordError::StrLabel(s.escape_debug().to_string())),
        ref other => {
            return Err(RecordError::LabelType {
                codec,
                kind: other.type_name(),
            });
        }
    };
    Ok(Record { image, label })
}

fn msgpack_label(item: Item<'_>) -> Result<i64, RecordError> {
    match item {
        Item::Int(v) => i64::try_from(v).map_err(|_| RecordError::LabelRange(v)),
        Item::Bool(b) => Ok(i64::from(b)),
        Item::Nil => Ok(NO_LABEL),
        Item::Str(s) => Err(RecordError::StrLabel(s.escape_ascii().to_string())),
        other => Err(RecordError::LabelType {
            codec: Codec::Msgpack,
            kind: other.type_name(),
        }),
    }
}

fn msgpack_image(item: Item<'_>) -> Result<&[u8], RecordError> {
    match item {
        Item::Bin(b) | Item::Str(b) => Ok(b),
        other => Err(RecordError::ImageType {
            codec: Codec::Msgpack,
            kind: other.type_name(),
        }),
    }
}

/// Reads one item; for a container, also skips its contents and returns just its header.
fn whole_item<'a>(c: &mut Cursor<'a>) -> Result<Item<'a>, MsgpackError> {
    let item = c.next()?;
    match item {
        Item::Array(k) => c.skip(k)?,
        Item::Map(k) => c.skip(2 * k)?,
        _ => {}
    }
    Ok(item)
}

/// Decodes a msgpack record, zero-copy.
pub(super) fn from_msgpack(value: &[u8]) -> Result<Record<'_>, RecordError> {
    let codec = Codec::Msgpack;
    let mut c = Cursor::new(value);
    let record = match c.next()? {
        Item::Array(2) => {
            let image = msgpack_image(c.next()?)?;
            let label = msgpack_label(c.next()?)?;
            Record {
                image: Image::Borrowed(image),
                label,
            }
        }
        Item::Array(n) => {
            return Err(RecordError::Items {
                codec,
                kind: "array",
                items: n,
            });
        }
        Item::Map(n) => {
            // Pick fields by name first and check their types after, so that a preferred field
            // (`label: 3`) wins over a less preferred one of another type (`class: "cat"`).
            let mut image: Option<(usize, Item<'_>)> = None;
            let mut label: Option<(usize, Item<'_>)> = None;
            let mut seen = Vec::new();
            for _ in 0..n {
                let key = whole_item(&mut c)?;
                let value = whole_item(&mut c)?;
                let (Item::Str(name) | Item::Bin(name)) = key else {
                    continue;
                };
                seen.push(name.to_vec());
                if let Some(rank) = field_rank(&IMAGE_FIELDS, name) {
                    if image.is_none_or(|(r, _)| rank < r) {
                        image = Some((rank, value));
                    }
                } else if let Some(rank) = field_rank(&LABEL_FIELDS, name)
                    && label.is_none_or(|(r, _)| rank < r)
                {
                    label = Some((rank, value));
                }
            }
            match (image, label) {
                (Some((_, image)), Some((_, label))) => Record {
                    image: Image::Borrowed(msgpack_image(image)?),
                    label: msgpack_label(label)?,
                },
                (None, _) => {
                    return Err(RecordError::NoImageField {
                        codec,
                        fields: list_fields(&seen),
                    });
                }
                (_, None) => {
                    return Err(RecordError::NoLabelField {
                        codec,
                        fields: list_fields(&seen),
                    });
                }
            }
        }
        other => {
            return Err(RecordError::NotRecord {
                codec,
                kind: other.type_name(),
            });
        }
    };
    if c.left() > 0 {
        return Err(RecordError::Trailing {
            left: c.left(),
            at: c.pos(),
        });
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn pickle_tuple_and_list() {
        // pickle.dumps((b'\xff\xd8\xffab', 3), protocol=3) and the list form.
        let r = from_pickle(b"\x80\x03C\x05\xff\xd8\xffabq\x00K\x03\x86q\x01.").unwrap();
        assert_eq!(
            r,
            Record {
                image: Image::Borrowed(b"\xff\xd8\xffab"),
                label: 3
            }
        );
        let r = from_pickle(b"\x80\x03]q\x00(C\x01xq\x01J\xff\xff\xff\xffe.").unwrap();
        assert_eq!(
            r,
            Record {
                image: Image::Borrowed(b"x"),
                label: -1
            }
        );
    }

    #[test]
    fn pickle_dict_fields_by_priority() {
        // {'data': b'd', 'img': b'i', 'cls': 1, 'target': 2, 'other': 1.5}, protocol 4
        let v = b"\x80\x04}\x94(\x8c\x04data\x94C\x01d\x8c\x03img\x94C\x01i\x8c\x03cls\x94K\x01\x8c\x06target\x94K\x02\x8c\x05other\x94G?\xf8\x00\x00\x00\x00\x00\x00u.";
        let r = from_pickle(v).unwrap();
        assert_eq!(
            r,
            Record {
                image: Image::Borrowed(b"i"),
                label: 2
            }
        );
    }

    #[test]
    fn pickle_preferred_label_wins_over_other_types() {
        // pickle.dumps({'class': 'cat', 'label': 3, 'image': b'i'}, protocol=4)
        let v = b"\x80\x04\x95)\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x05class\x94\x8c\x03cat\x94\x8c\x05label\x94K\x03\x8c\x05image\x94C\x01i\x94u.";
        let r = from_pickle(v).unwrap();
        assert_eq!(
            r,
            Record {
                image: Image::Borrowed(b"i"),
                label: 3
            }
        );
    }

    #[test]
    fn pickle_errors_are_clear() {
        // {'image': b'x'} has no label.
        let e = from_pickle(b"\x80\x04}\x94\x8c\x05image\x94C\x01xs.")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no label field") && e.contains("\"image\""), "{e}");
        // ('x', 1): image is a str.
        let e = from_pickle(b"\x80\x04\x8c\x01xK\x01\x86.").unwrap_err().to_string();
        assert!(e.contains("image is a pickled str"), "{e}");
        // (b'x', 'cat'): string label.
        let e = from_pickle(b"\x80\x04C\x01x\x8c\x03cat\x86.").unwrap_err().to_string();
        assert!(e.contains("label is a str (\"cat\")") && e.contains("--labels"), "{e}");
        // (b'x', 1.5)
        let e = from_pickle(b"\x80\x04C\x01xG?\xf8\x00\x00\x00\x00\x00\x00\x86.")
            .unwrap_err()
            .to_string();
        assert!(e.contains("label is a pickled float"), "{e}");
        // 3 items
        let e = from_pickle(b"\x80\x04K\x01K\x01K\x01\x87.").unwrap_err().to_string();
        assert!(e.contains("tuple of 3 items"), "{e}");
        // (b'x', None) is unlabeled; (b'x', True) is 1.
        assert_eq!(from_pickle(b"\x80\x04C\x01xN\x86.").unwrap().label, NO_LABEL);
        assert_eq!(from_pickle(b"\x80\x04C\x01x\x88\x86.").unwrap().label, 1);
    }

    #[test]
    fn msgpack_array_and_map() {
        let r = from_msgpack(b"\x92\xc4\x03abc\xcd\x01\x00").unwrap();
        assert_eq!(
            r,
            Record {
                image: Image::Borrowed(b"abc"),
                label: 256
            }
        );
        // Old packers store bytes as str.
        let r = from_msgpack(b"\x92\xa3abc\xff").unwrap();
        assert_eq!(
            r,
            Record {
                image: Image::Borrowed(b"abc"),
                label: -1
            }
        );
        // {"meta": {"w": [1, 2]}, "y": 4, "jpeg": bin, "png": bin}: jpeg beats png, y is used.
        let r = from_msgpack(b"\x84\xa4meta\x81\xa1w\x92\x01\x02\xa1y\x04\xa3png\xc4\x01p\xa4jpeg\xc4\x01j").unwrap();
        assert_eq!(
            r,
            Record {
                image: Image::Borrowed(b"j"),
                label: 4
            }
        );
        // The preferred field wins, whatever the type of the others: {"class": "cat", "label": 1,
        // "data": {"nested": 1}, "image": bin}.
        let r = from_msgpack(b"\x84\xa5class\xa3cat\xa5label\x01\xa4data\x81\xa6nested\x01\xa5image\xc4\x01i").unwrap();
        assert_eq!(
            r,
            Record {
                image: Image::Borrowed(b"i"),
                label: 1
            }
        );
        // Non-string keys are skipped, whatever their values.
        let r = from_msgpack(b"\x83\x01\x92\x01\x02\xa5image\xc4\x01i\xa5label\xc0").unwrap();
        assert_eq!(
            r,
            Record {
                image: Image::Borrowed(b"i"),
                label: NO_LABEL
            }
        );
    }

    #[test]
    fn msgpack_errors_are_clear() {
        let e = from_msgpack(b"\x92\xc4\x01x\xa3cat").unwrap_err().to_string();
        assert!(e.contains("label is a str (\"cat\")"), "{e}");
        let e = from_msgpack(b"\x92\xc4\x01x\xcf\xff\xff\xff\xff\xff\xff\xff\xff")
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not fit"), "{e}");
        let e = from_msgpack(b"\x92\xc4\x01x\x01\x01").unwrap_err().to_string();
        assert!(e.contains("trailing"), "{e}");
        let e = from_msgpack(b"\x81\xa5label\x01").unwrap_err().to_string();
        assert!(e.contains("no image field") && e.contains("\"label\""), "{e}");
        let e = from_msgpack(b"\x93\x01\x01\x01").unwrap_err().to_string();
        assert!(e.contains("array of 3 items"), "{e}");
        let e = from_msgpack(b"\x92\x01\x01").unwrap_err().to_string();
        assert!(e.contains("image is a msgpack int"), "{e}");
    }

    #[test]
    fn truncated_records() {
        let v = b"\x82\xa5image\xc4\x03abc\xa5label\xcd\x01\x00";
        assert!(from_msgpack(v).is_ok());
        for n in 0..v.len() {
            assert!(from_msgpack(&v[..n]).is_err(), "prefix {n}");
        }
    }

    proptest! {
        #[test]
        fn never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = from_pickle(&data);
            let _ = from_msgpack(&data);
        }
    }
}
