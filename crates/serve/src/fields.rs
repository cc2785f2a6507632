//! 1.9 sample fields of an image stream (control.md, "Sample fields (1.9)"; ring.md): the text
//! and metadata an `open` asks for, checked once, and each sample's ring bytes for them.
//!
//! [`SampleFields::parse`] checks `open.text` and `open.meta` against the source's kind (a source
//! without such fields refuses), the names against the stream's other fields, and loads each
//! tokenizer once per stream. The pool calls [`SampleFields::encode`] with the sample's
//! [`Extra`], from the same read as its image, so every field follows its sample through the
//! order, ranks, skips and resume. A missing or malformed value is an error for that sample (the
//! pool puts it under `on_error`), naming the field and the setting (`max_bytes`) or the value.
//!
//! Tokenisation is the `text` feature's (Hugging Face `tokenizers`); without it a tokenised field
//! is refused at open, naming the feature, while raw text and metadata work.

use std::path::{Path, PathBuf};

use ringfeed_format::control::OpenRequest;
use ringfeed_format::ring::{DType, FieldDesc, FieldSpec};
use ringfeed_source::fields::{FieldFrom, Value, values};
use ringfeed_source::{Extra, FieldKind};

/// `open.text[].max_bytes`: its default and bound.
pub const DEFAULT_MAX_BYTES: u64 = 1024;
pub const MAX_MAX_BYTES: u64 = 1 << 20;
/// `open.text[].max_length`: its default and bound.
pub const DEFAULT_MAX_LENGTH: u64 = 77;
pub const MAX_MAX_LENGTH: u64 = 8192;
/// Longest name of a metadata field, in bytes: a ring field's name (ring.md).
pub const MAX_NAME: usize = 16;
/// Longest name of a text field, so that `NAME_mask` is a ring field's name.
pub const MAX_TEXT_NAME: usize = MAX_NAME - "_mask".len();

/// A metadata field's type (`open.meta[].dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaType {
    F32,
    I32,
    I64,
    Bool,
}

impl MetaType {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "float32" => MetaType::F32,
            "int32" => MetaType::I32,
            "int64" => MetaType::I64,
            "bool" => MetaType::Bool,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            MetaType::F32 => "float32",
            MetaType::I32 => "int32",
            MetaType::I64 => "int64",
            MetaType::Bool => "bool",
        }
    }

    fn with_article(self) -> &'static str {
        match self {
            MetaType::F32 => "a float32",
            MetaType::I32 => "an int32",
            MetaType::I64 => "an int64",
            MetaType::Bool => "a bool",
        }
    }

    fn dtype(self) -> DType {
        match self {
            MetaType::F32 => DType::F32,
            MetaType::I32 => DType::I32,
            MetaType::I64 => DType::I64,
            MetaType::Bool => DType::U8,
        }
    }
}

/// What one field delivers.
#[derive(Debug)]
enum What {
    /// `NAME` (uint8 `[max_bytes]`) and `NAME_len` (int32).
    Raw { max_bytes: u64 },
    /// `NAME_ids` (int32 `[max_length]`) and `NAME_mask` (uint8 `[max_length]`).
    Tokens(Box<tok::Tokens>),
    /// `NAME`, a scalar.
    Meta(MetaType),
}

#[derive(Debug)]
struct Field {
    /// `open.text "caption"` or `open.meta "width"`, for messages.
    label: String,
    name: String,
    from: FieldFrom,
    what: What,
}

/// The stream's sample fields, checked, with their places in the ring once it exists.
#[derive(Debug)]
pub struct SampleFields {
    fields: Vec<Field>,
    /// Each field's ring fields, in [`SampleFields::specs`] order (set by [`SampleFields::bind`]).
    descs: Vec<FieldDesc>,
    /// Each field's sources, in `fields` order, for [`values`].
    from: Vec<FieldFrom>,
}

impl SampleFields {
    /// Checks `open.text` and `open.meta` for a source of `kind` (`None`: it has no sample
    /// fields) described as `source`; `taken`: the stream's other ring fields and names no field
    /// may have (views, `label`, `index`, `crop`); `admit`: the check a tokenizer's path passes
    /// (the server's `--data-root`). `Ok(None)` when the `open` asks for no field; the error is a
    /// `bad_request` message naming the member.
    pub fn parse(
        open: &OpenRequest,
        kind: Option<FieldKind>,
        source: &str,
        taken: &[String],
        admit: &dyn Fn(&Path) -> Result<PathBuf, String>,
    ) -> Result<Option<Self>, String> {
        let text = open.text.as_deref().unwrap_or_default();
        let meta = open.meta.as_deref().unwrap_or_default();
        if text.is_empty() && meta.is_empty() {
            return Ok(None);
        }
        let mut fields = Vec::with_capacity(text.len() + meta.len());
        let from_of = |member: &str, name: &str, src: &str| -> Result<FieldFrom, String> {
            let Some(kind) = kind else {
                return Err(format!(
                    "open.{member} {name:?}: {source} holds no sample fields; this server reads them from WebDataset tars' members (local or in an object store), CSV/JSONL manifests' columns and local Parquet columns"
                ));
            };
            FieldFrom::parse(src, kind).map_err(|e| format!("open.{member} {name:?}: {e}"))
        };
        for t in text {
            let label = format!("open.text {:?}", t.name);
            check_name(&t.name, &label, MAX_TEXT_NAME)?;
            let from = from_of("text", &t.name, &t.source)?;
            let what = match &t.tokenizer {
                None => {
                    if t.max_length.is_some() {
                        return Err(format!(
                            "{label}: max_length is for a tokenised field; give a tokenizer, or max_bytes"
                        ));
                    }
                    let max_bytes = t.max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
                    if !(1..=MAX_MAX_BYTES).contains(&max_bytes) {
                        return Err(format!("{label}: max_bytes {max_bytes} is outside 1..={MAX_MAX_BYTES}"));
                    }
                    What::Raw { max_bytes }
                }
                Some(path) => {
                    if t.max_bytes.is_some() {
                        return Err(format!(
                            "{label}: max_bytes is for raw text; a tokenised field has max_length"
                        ));
                    }
                    let max_length = t.max_length.unwrap_or(DEFAULT_MAX_LENGTH);
                    if !(1..=MAX_MAX_LENGTH).contains(&max_length) {
                        return Err(format!(
                            "{label}: max_length {max_length} is outside 1..={MAX_MAX_LENGTH}"
                        ));
                    }
                    let path = Path::new(path);
                    if !path.is_absolute() {
                        return Err(format!("{label}: the tokenizer {path:?} must be an absolute path"));
                    }
                    let path = admit(path).map_err(|e| format!("{label}: tokenizer: {e}"))?;
                    What::Tokens(Box::new(
                        tok::Tokens::load(&path, max_length as usize).map_err(|e| format!("{label}: {e}"))?,
                    ))
                }
            };
            fields.push(Field {
                label,
                name: t.name.clone(),
                from,
                what,
            });
        }
        for m in meta {
            let label = format!("open.meta {:?}", m.name);
            check_name(&m.name, &label, MAX_NAME)?;
            let from = from_of("meta", &m.name, &m.source)?;
            let dtype = MetaType::parse(&m.dtype).ok_or_else(|| {
                format!(
                    "{label}: dtype {:?} must be \"float32\", \"int32\", \"int64\" or \"bool\"",
                    m.dtype
                )
            })?;
            fields.push(Field {
                label,
                name: m.name.clone(),
                from,
                what: What::Meta(dtype),
            });
        }
        let out = SampleFields {
            from: fields.iter().map(|f| f.from.clone()).collect(),
            fields,
            descs: Vec::new(),
        };
        // Unique names, and ring fields that no other field of the stream has.
        let mut seen: Vec<String> = taken.to_vec();
        for f in &out.fields {
            if seen.contains(&f.name) {
                return Err(format!(
                    "{}: the name is taken (by a view, label, index, crop or another field)",
                    f.label
                ));
            }
            for spec in f.specs() {
                if seen.iter().any(|s| *s == spec.name) {
                    return Err(format!(
                        "{}: its ring field {:?} is taken by another field",
                        f.label, spec.name
                    ));
                }
                seen.push(spec.name.to_string());
            }
            seen.push(f.name.clone());
        }
        Ok(Some(out))
    }

    /// The ring fields (ring.md, "Sample fields"), in order.
    pub fn specs(&self) -> Vec<FieldSpec> {
        self.fields.iter().flat_map(Field::specs).collect()
    }

    /// Finds each ring field in the made ring.
    pub fn bind(&mut self, field: &dyn Fn(&str) -> Option<FieldDesc>) {
        self.descs = self
            .specs()
            .iter()
            .map(|s| field(&s.name).expect("the ring holds every field asked for"))
            .collect();
    }

    /// Every ring field of the sample fields (for slot compaction).
    pub fn descs(&self) -> &[FieldDesc] {
        &self.descs
    }

    /// One sample's bytes for each of [`SampleFields::descs`], from its `extra`; the error names
    /// the field, and the setting or the value.
    pub fn encode(&self, extra: &Extra<'_>) -> Result<Vec<Vec<u8>>, String> {
        let got = values(extra, &self.from);
        let mut out = Vec::with_capacity(self.descs.len());
        for (f, v) in self.fields.iter().zip(got) {
            let fail = |why: String| format!("{} ({}): {why}", f.label, f.from.describe());
            let v = v.map_err(fail)?;
            match &f.what {
                What::Raw { max_bytes } => {
                    let text = as_text(&v).map_err(fail)?;
                    if text.len() as u64 > *max_bytes {
                        return Err(fail(format!(
                            "the text is {} bytes, more than max_bytes = {max_bytes} (text is never cut); raise max_bytes",
                            text.len()
                        )));
                    }
                    let mut bytes = vec![0u8; *max_bytes as usize];
                    bytes[..text.len()].copy_from_slice(text.as_bytes());
                    out.push(bytes);
                    out.push((text.len() as i32).to_le_bytes().to_vec());
                }
                What::Tokens(t) => {
                    let text = as_text(&v).map_err(fail)?;
                    let (ids, mask) = t.encode(text).map_err(fail)?;
                    out.push(ids.iter().flat_map(|i| i.to_le_bytes()).collect());
                    out.push(mask.iter().map(|&m| u8::from(m != 0)).collect());
                }
                What::Meta(t) => out.push(meta_bytes(*t, &v).map_err(fail)?),
            }
        }
        Ok(out)
    }
}

impl Field {
    fn specs(&self) -> Vec<FieldSpec> {
        let spec = |name: String, dtype, shape| FieldSpec {
            name: name.into(),
            dtype,
            shape,
        };
        match &self.what {
            What::Raw { max_bytes } => vec![
                spec(self.name.clone(), DType::U8, vec![*max_bytes as u32]),
                spec(format!("{}_len", self.name), DType::I32, vec![]),
            ],
            What::Tokens(t) => vec![
                spec(format!("{}_ids", self.name), DType::I32, vec![t.max_length() as u32]),
                spec(format!("{}_mask", self.name), DType::U8, vec![t.max_length() as u32]),
            ],
            What::Meta(t) => vec![spec(self.name.clone(), t.dtype(), vec![])],
        }
    }
}

/// A field's name: `[a-z][a-z0-9_]*`, at most `max` bytes.
fn check_name(name: &str, label: &str, max: usize) -> Result<(), String> {
    let ok = name.len() <= max
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{label}: a field's name must match [a-z][a-z0-9_]* and have at most {max} bytes (its ring fields' names are at most {MAX_NAME})"
        ))
    }
}

/// The first 40 characters of a value, for messages.
fn show(v: &Value<'_>) -> String {
    let s = match v {
        Value::Text(b) => format!("{:?}", String::from_utf8_lossy(b)),
        Value::Json(j) => j.to_string(),
    };
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

/// A text field's value: a member's or cell's UTF-8, or a JSON string.
fn as_text<'v>(v: &'v Value<'_>) -> Result<&'v str, String> {
    match v {
        Value::Text(b) => std::str::from_utf8(b).map_err(|e| format!("the text is not UTF-8 ({e})")),
        Value::Json(serde_json::Value::String(s)) => Ok(s),
        Value::Json(other) => Err(format!(
            "the value {} is not a string",
            show(&Value::Json(other.clone()))
        )),
    }
}

/// A metadata value as its ring bytes (little-endian; `bool` as 0/1), by control.md's rules:
/// from JSON a number (an integer dtype only an integral one in range) or `true`/`false`; from
/// text the number's decimal form or `true`/`false`/`0`/`1`, surrounding whitespace ignored.
fn meta_bytes(t: MetaType, v: &Value<'_>) -> Result<Vec<u8>, String> {
    let bad = || format!("the value {} is not {}", show(v), t.with_article());
    let int_range = |x: i64| -> Result<i64, String> {
        match t {
            MetaType::I32 if i32::try_from(x).is_err() => Err(format!("the value {} is out of int32's range", show(v))),
            _ => Ok(x),
        }
    };
    let float = |x: f64| -> Result<f32, String> {
        if x.is_finite() && x.abs() <= f64::from(f32::MAX) {
            Ok(x as f32)
        } else {
            Err(format!("the value {} is out of float32's range", show(v)))
        }
    };
    match v {
        Value::Json(j) => match t {
            MetaType::Bool => j.as_bool().map(|b| vec![u8::from(b)]).ok_or_else(bad),
            MetaType::F32 => Ok(float(j.as_f64().filter(|_| j.is_number()).ok_or_else(bad)?)?
                .to_le_bytes()
                .to_vec()),
            MetaType::I32 | MetaType::I64 => {
                let x = match (j.as_i64(), j.as_f64()) {
                    (Some(x), _) => x,
                    // An integral float (3.0) is an integer; a larger magnitude than i64 is out of range.
                    (None, Some(f)) if f.fract() == 0.0 && f.is_finite() => {
                        if f >= -(2f64.powi(63)) && f < 2f64.powi(63) {
                            f as i64
                        } else {
                            return Err(format!("the value {} is out of {}'s range", show(v), t.name()));
                        }
                    }
                    _ => return Err(bad()),
                };
                let x = int_range(x)?;
                Ok(if t == MetaType::I32 {
                    (x as i32).to_le_bytes().to_vec()
                } else {
                    x.to_le_bytes().to_vec()
                })
            }
        },
        Value::Text(b) => {
            let s = std::str::from_utf8(b).map_err(|_| bad())?.trim();
            match t {
                MetaType::Bool => match s {
                    "true" | "1" => Ok(vec![1]),
                    "false" | "0" => Ok(vec![0]),
                    _ => Err(bad()),
                },
                MetaType::F32 => {
                    let x: f64 = s.parse().map_err(|_| bad())?;
                    // "inf" and "NaN" parse, but are no decimal form of a number.
                    if !x.is_finite() {
                        return Err(bad());
                    }
                    Ok(float(x)?.to_le_bytes().to_vec())
                }
                MetaType::I32 | MetaType::I64 => {
                    let x: i64 = match s.parse() {
                        Ok(x) => x,
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow
                            ) =>
                        {
                            return Err(format!("the value {} is out of {}'s range", show(v), t.name()));
                        }
                        Err(_) => return Err(bad()),
                    };
                    let x = int_range(x)?;
                    Ok(if t == MetaType::I32 {
                        (x as i32).to_le_bytes().to_vec()
                    } else {
                        x.to_le_bytes().to_vec()
                    })
                }
            }
        }
    }
}

/// Tokenisation with Hugging Face `tokenizers` (the `text` feature).
#[cfg(feature = "text")]
mod tok {
    use std::path::Path;

    use tokenizers::{PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

    /// Tokens in the padding section's absence: the first of these the vocabulary has.
    const PAD_TOKENS: [&str; 3] = ["[PAD]", "<pad>", "<|endoftext|>"];

    /// A tokenizer set up as the Python library's `enable_truncation(max_length)` and
    /// `enable_padding(length=max_length, pad_id=pad_id(...))` set it up.
    #[derive(Debug)]
    pub(super) struct Tokens {
        tokenizer: Tokenizer,
        max_length: usize,
    }

    /// The padding id (control.md): the tokenizer's `padding.pad_id`, else the id of `[PAD]`,
    /// `<pad>` or `<|endoftext|>` when the vocabulary has one, else 0.
    pub(super) fn pad_id(t: &Tokenizer) -> u32 {
        if let Some(p) = t.get_padding() {
            return p.pad_id;
        }
        PAD_TOKENS.iter().find_map(|p| t.token_to_id(p)).unwrap_or(0)
    }

    impl Tokens {
        /// Reads the `tokenizer.json` at `path` (once per stream).
        pub(super) fn load(path: &Path, max_length: usize) -> Result<Self, String> {
            let tokenizer =
                Tokenizer::from_file(path).map_err(|e| format!("cannot load the tokenizer {}: {e}", path.display()))?;
            Self::new(tokenizer, max_length).map_err(|e| format!("the tokenizer {}: {e}", path.display()))
        }

        pub(super) fn new(mut tokenizer: Tokenizer, max_length: usize) -> Result<Self, String> {
            let pad_id = pad_id(&tokenizer);
            let pad_token = tokenizer.id_to_token(pad_id).unwrap_or_else(|| "[PAD]".to_owned());
            tokenizer
                .with_truncation(Some(TruncationParams {
                    max_length,
                    ..Default::default()
                }))
                .map_err(|e| e.to_string())?;
            tokenizer.with_padding(Some(PaddingParams {
                strategy: PaddingStrategy::Fixed(max_length),
                direction: PaddingDirection::Right,
                pad_to_multiple_of: None,
                pad_id,
                pad_type_id: 0,
                pad_token,
            }));
            Ok(Tokens { tokenizer, max_length })
        }

        pub(super) fn max_length(&self) -> usize {
            self.max_length
        }

        /// `text`'s ids and attention mask, `max_length` each.
        pub(super) fn encode(&self, text: &str) -> Result<(Vec<u32>, Vec<u32>), String> {
            let e = self
                .tokenizer
                .encode(text, true)
                .map_err(|e| format!("the tokenizer failed: {e}"))?;
            let (ids, mask) = (e.get_ids(), e.get_attention_mask());
            if ids.len() != self.max_length || mask.len() != self.max_length {
                return Err(format!(
                    "the tokenizer gave {} tokens, not max_length = {}",
                    ids.len(),
                    self.max_length
                ));
            }
            Ok((ids.to_vec(), mask.to_vec()))
        }
    }
}

/// Without the `text` feature no tokenised field can be opened.
#[cfg(not(feature = "text"))]
mod tok {
    use std::path::Path;

    #[derive(Debug)]
    pub(super) enum Tokens {}

    impl Tokens {
        pub(super) fn load(_path: &Path, _max_length: usize) -> Result<Self, String> {
            Err(
                "this ringfeed was built without tokenizers (the `text` feature); use a build with default features \
                 (`cargo build --release -p ringfeed`, or the wheel), or leave tokenizer out for raw text"
                    .to_owned(),
            )
        }

        pub(super) fn max_length(&self) -> usize {
            match *self {}
        }

        pub(super) fn encode(&self, _text: &str) -> Result<(Vec<u32>, Vec<u32>), String> {
            match *self {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringfeed_source::wds::tar::Member;

    fn open(text: serde_json::Value, meta: serde_json::Value) -> OpenRequest {
        serde_json::from_value(serde_json::json!({
            "dataset": "/d", "batch_size": 1, "text": text, "meta": meta,
        }))
        .unwrap()
    }

    fn parse(o: &OpenRequest, kind: Option<FieldKind>) -> Result<Option<SampleFields>, String> {
        SampleFields::parse(o, kind, "packed dataset /d", &["image".into(), "label".into()], &|p| {
            Ok(p.to_owned())
        })
    }

    #[test]
    fn fields_are_checked_naming_the_member() {
        let m = Some(FieldKind::Members);
        let none = open(serde_json::json!([]), serde_json::json!([]));
        assert!(
            parse(&none, None).unwrap().is_none(),
            "no field asked for: nothing to refuse"
        );
        let t = open(
            serde_json::json!([{"name": "text", "source": "txt"}]),
            serde_json::json!([]),
        );
        let e = parse(&t, None).unwrap_err();
        assert!(
            e.contains("open.text \"text\"") && e.contains("packed dataset /d"),
            "{e}"
        );
        let f = parse(&t, m).unwrap().unwrap();
        assert_eq!(
            f.specs().iter().map(|s| s.name.to_string()).collect::<Vec<_>>(),
            ["text", "text_len"]
        );
        for (text, meta, want) in [
            (
                serde_json::json!([{"name": "Text", "source": "txt"}]),
                serde_json::json!([]),
                "must match",
            ),
            (
                serde_json::json!([{"name": "caption_text", "source": "txt"}]),
                serde_json::json!([]),
                "at most 11 bytes",
            ),
            (
                serde_json::json!([]),
                serde_json::json!([{"name": "a_seventeen_bytes", "source": "json:x", "dtype": "bool"}]),
                "at most 16 bytes",
            ),
            (
                serde_json::json!([{"name": "label", "source": "txt"}]),
                serde_json::json!([]),
                "taken",
            ),
            (
                serde_json::json!([{"name": "t", "source": "txt"}]),
                serde_json::json!([{"name": "t_len", "source": "json:x", "dtype": "int32"}]),
                "taken",
            ),
            (
                serde_json::json!([{"name": "t", "source": "txt", "max_bytes": 0}]),
                serde_json::json!([]),
                "max_bytes 0",
            ),
            (
                serde_json::json!([{"name": "t", "source": "txt", "max_length": 9}]),
                serde_json::json!([]),
                "max_length is for",
            ),
            (
                serde_json::json!([{"name": "t", "source": "txt", "tokenizer": "tok.json"}]),
                serde_json::json!([]),
                "absolute",
            ),
            (
                serde_json::json!([]),
                serde_json::json!([{"name": "w", "source": "json:w", "dtype": "f16"}]),
                "dtype \"f16\"",
            ),
            (
                serde_json::json!([]),
                serde_json::json!([{"name": "w", "source": "txt:w", "dtype": "int32"}]),
                "JSON member",
            ),
        ] {
            let e = parse(&open(text, meta), m).unwrap_err();
            assert!(e.contains(want), "{e} should say {want}");
        }
    }

    fn encode_one(t: MetaType, v: Value<'_>) -> Result<Vec<u8>, String> {
        meta_bytes(t, &v)
    }

    #[test]
    fn metadata_follows_the_spec_rules() {
        use serde_json::json;
        let j = |v| Value::Json(v);
        let s = |v: &'static str| Value::Text(v.as_bytes().into());
        assert_eq!(encode_one(MetaType::F32, j(json!(0.5))).unwrap(), 0.5f32.to_le_bytes());
        assert_eq!(encode_one(MetaType::F32, s(" 2.25\n")).unwrap(), 2.25f32.to_le_bytes());
        assert_eq!(encode_one(MetaType::I32, j(json!(7))).unwrap(), 7i32.to_le_bytes());
        assert_eq!(encode_one(MetaType::I32, j(json!(7.0))).unwrap(), 7i32.to_le_bytes());
        assert_eq!(
            encode_one(MetaType::I64, s("-9000000000")).unwrap(),
            (-9_000_000_000i64).to_le_bytes()
        );
        assert_eq!(encode_one(MetaType::Bool, j(json!(true))).unwrap(), [1]);
        assert_eq!(encode_one(MetaType::Bool, s("0")).unwrap(), [0]);
        for (t, v, want) in [
            (MetaType::I32, j(json!(7.5)), "not an int32"),
            (MetaType::I32, j(json!(1u64 << 40)), "out of int32's range"),
            (MetaType::I64, s("99999999999999999999"), "out of int64's range"),
            (MetaType::F32, j(json!("0.5")), "not a float32"),
            (MetaType::F32, j(json!(1e300)), "out of float32's range"),
            (MetaType::F32, s("nan"), "not a float32"),
            (MetaType::Bool, j(json!(1)), "not a bool"),
            (MetaType::Bool, s("yes"), "not a bool"),
        ] {
            let e = encode_one(t, v).unwrap_err();
            assert!(e.contains(want), "{e} should say {want}");
        }
    }

    #[test]
    fn raw_text_is_never_cut_and_missing_values_are_named() {
        let o = open(
            serde_json::json!([{"name": "caption", "source": "txt", "max_bytes": 4}]),
            serde_json::json!([{"name": "w", "source": "json:w", "dtype": "int32"}]),
        );
        let mut f = parse(&o, Some(FieldKind::Members)).unwrap().unwrap();
        let specs = f.specs();
        f.bind(&|n| {
            let s = specs.iter().find(|s| s.name.as_ref() == n)?;
            Some(FieldDesc {
                name: n.to_owned(),
                dtype: s.dtype,
                shape: s.shape.clone(),
                offset: 0,
                sample_bytes: 0,
            })
        });
        let m = |name: &str, offset, size| Member {
            name: name.as_bytes().to_vec(),
            offset,
            size,
        };
        let data = b"h\xc3\xa9{\"w\": 3}";
        let members = [m("a.txt", 0, 3), m("a.json", 3, 8)];
        let extra = Extra::Members {
            members: &members,
            data,
            base: 0,
        };
        let got = f.encode(&extra).unwrap();
        assert_eq!(
            got,
            vec![
                b"h\xc3\xa9\0".to_vec(),
                3i32.to_le_bytes().to_vec(),
                3i32.to_le_bytes().to_vec()
            ]
        );
        let long = b"hello{\"w\": 3}";
        let members = [m("a.txt", 0, 5), m("a.json", 5, 8)];
        let extra = Extra::Members {
            members: &members,
            data: long,
            base: 0,
        };
        let e = f.encode(&extra).unwrap_err();
        assert!(
            e.contains("open.text \"caption\" (.txt)") && e.contains("max_bytes = 4"),
            "{e}"
        );
        let members = [m("a.txt", 0, 1), m("a.json", 1, 3)];
        let extra = Extra::Members {
            members: &members,
            data: b"h{ }",
            base: 0,
        };
        let e = f.encode(&extra).unwrap_err();
        assert!(
            e.contains("open.meta \"w\" (.json:w)") && e.contains("no key \"w\""),
            "{e}"
        );
    }

    #[cfg(not(feature = "text"))]
    #[test]
    fn without_the_text_feature_a_tokenised_field_is_refused_naming_it() {
        let o = open(
            serde_json::json!([{"name": "t", "source": "txt", "tokenizer": "/tok.json"}]),
            serde_json::json!([]),
        );
        let e = parse(&o, Some(FieldKind::Members)).unwrap_err();
        assert!(e.contains("open.text \"t\"") && e.contains("the `text` feature"), "{e}");
        let raw = open(
            serde_json::json!([{"name": "t", "source": "txt"}]),
            serde_json::json!([]),
        );
        assert!(
            parse(&raw, Some(FieldKind::Members)).is_ok(),
            "raw text needs no tokenizer"
        );
    }

    #[cfg(feature = "text")]
    #[test]
    fn the_padding_id_rule_and_fixed_length() {
        use std::str::FromStr;
        // A word-level tokenizer: a vocabulary, whitespace splitting, no post-processor.
        let json = |vocab: &str, padding: &str| {
            format!(
                r#"{{"version":"1.0","truncation":null,"padding":{padding},"added_tokens":[],"normalizer":null,
                "pre_tokenizer":{{"type":"Whitespace"}},"post_processor":null,"decoder":null,
                "model":{{"type":"WordLevel","vocab":{vocab},"unk_token":"[UNK]"}}}}"#
            )
        };
        let vocab = r#"{"[UNK]":0,"a":1,"b":2,"<pad>":3,"<|endoftext|>":4}"#;
        let t = tokenizers::Tokenizer::from_str(&json(vocab, "null")).unwrap();
        assert_eq!(tok::pad_id(&t), 3, "<pad> comes before <|endoftext|>");
        let t2 = tokenizers::Tokenizer::from_str(&json(r#"{"[UNK]":0,"a":1,"<|endoftext|>":7}"#, "null")).unwrap();
        assert_eq!(tok::pad_id(&t2), 7);
        let t3 = tokenizers::Tokenizer::from_str(&json(r#"{"[UNK]":0,"a":1}"#, "null")).unwrap();
        assert_eq!(tok::pad_id(&t3), 0, "nothing to pad with: 0");
        let padding = r#"{"strategy":"BatchLongest","direction":"Right","pad_to_multiple_of":null,"pad_id":2,"pad_type_id":0,"pad_token":"b"}"#;
        let t4 = tokenizers::Tokenizer::from_str(&json(vocab, padding)).unwrap();
        assert_eq!(tok::pad_id(&t4), 2, "the padding section wins");
        let k = tok::Tokens::new(t, 4).unwrap();
        assert_eq!(k.encode("a b").unwrap(), (vec![1, 2, 3, 3], vec![1, 1, 0, 0]));
        assert_eq!(k.encode("").unwrap(), (vec![3, 3, 3, 3], vec![0, 0, 0, 0]));
        assert_eq!(
            k.encode("a b a b a b").unwrap(),
            (vec![1, 2, 1, 2], vec![1, 1, 1, 1]),
            "cut on the right"
        );
    }
}
