//! 1.10: directories written by `datasets.Dataset.save_to_disk`, read in place: their
//! `data-NNNNN-of-MMMMM.arrow` files are Arrow IPC *streams* (a schema message, then record
//! batches, no footer). Each record batch is served as a Parquet row group is ([`crate::pq`]):
//! the unit of reading, decoding and of the `shard_blocks` order, its rows turned into the
//! `parquet` crate's records so that the image, label and field rules are the same code.
//!
//! Invariants:
//! - At open only the messages' headers are read (a pread of each flatbuffer, the bodies
//!   skipped), so opening costs a few reads per batch, not a pass over the images.
//! - A batch is read by one pread of its header and body, and decoded with the projected columns
//!   only; a file changed since open yields an error for that batch's rows, never other bytes
//!   (the header is parsed again and its row count compared).
//! - Dictionary batches (dictionary-encoded columns) and compressed bodies are not read: the file
//!   is a listing problem naming why (`datasets` writes neither).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, cast::AsArray, types};
use arrow_buffer::Buffer;
use arrow_ipc::MessageHeader;
use arrow_schema::{DataType, Schema, SchemaRef};
use parquet::data_type::ByteArray;
use parquet::record::{Field, Row};

/// Whether a path is named `*.arrow` (any case).
pub fn is_arrow_name(p: &Path) -> bool {
    p.extension().is_some_and(|e| e.eq_ignore_ascii_case("arrow"))
}

/// One record batch: where its message is, and its rows.
#[derive(Debug, Clone)]
struct Batch {
    /// The flatbuffer header's offset and length.
    meta: (u64, usize),
    /// The body's offset and length.
    body: (u64, usize),
    rows: u64,
}

/// One Arrow IPC stream file, its messages' headers read.
#[derive(Debug)]
pub struct ArrowFile {
    file: File,
    schema: SchemaRef,
    batches: Vec<Batch>,
    /// The top-level columns read, by index.
    projection: Vec<usize>,
}

impl ArrowFile {
    /// Reads the headers of `path`'s messages and checks its columns (`open.parquet`'s `image` and
    /// `label`, the fields' `columns`: `crate::pq::ParquetOptions`); the error names the file's
    /// problem (a listing problem).
    pub fn open(path: &Path, image: &str, label: Option<&str>, columns: &[String]) -> Result<Self, String> {
        let file = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
        let len = file.metadata().map_err(|e| format!("cannot open: {e}"))?.len();
        let bad = |why: String| format!("not a readable Arrow IPC stream (save_to_disk's format): {why}");
        let mut schema: Option<Schema> = None;
        let mut batches = Vec::new();
        let mut pos = 0u64;
        while pos + 4 <= len {
            let (meta_at, meta_len) = message_at(&file, pos).map_err(bad)?;
            if meta_len == 0 {
                break;
            }
            let mut meta = vec![0u8; meta_len];
            file.read_exact_at(&mut meta, meta_at)
                .map_err(|e| bad(format!("byte {meta_at}: {e}")))?;
            let m = arrow_ipc::root_as_message(&meta).map_err(|e| bad(format!("the message at byte {pos}: {e}")))?;
            let body_len = usize::try_from(m.bodyLength()).map_err(|_| bad(format!("the message at byte {pos}")))?;
            let body_at = meta_at + meta_len as u64;
            match m.header_type() {
                MessageHeader::Schema => {
                    let fb = m.header_as_schema().ok_or_else(|| bad("an empty schema".into()))?;
                    schema = Some(arrow_ipc::convert::try_fb_to_schema(fb).map_err(|e| bad(e.to_string()))?);
                }
                MessageHeader::RecordBatch => {
                    let b = m.header_as_record_batch().ok_or_else(|| bad("an empty batch".into()))?;
                    if b.compression().is_some() {
                        return Err(
                            "its record batches are compressed, which is not read; save it again without compression"
                                .into(),
                        );
                    }
                    batches.push(Batch {
                        meta: (meta_at, meta_len),
                        body: (body_at, body_len),
                        rows: b.length().max(0) as u64,
                    });
                }
                MessageHeader::DictionaryBatch => {
                    return Err("it has dictionary-encoded columns, which are not read; cast them to plain types (datasets' cast_column) and save it again".into());
                }
                other => return Err(bad(format!("an unexpected {other:?} message at byte {pos}"))),
            }
            pos = body_at + body_len as u64;
        }
        let schema = Arc::new(schema.ok_or_else(|| bad("it has no schema message".into()))?);
        let projection = check(&schema, image, label, columns)?;
        Ok(ArrowFile {
            file,
            schema,
            batches,
            projection,
        })
    }

    /// Rows per record batch, in order.
    pub fn batch_rows(&self) -> impl Iterator<Item = u64> + '_ {
        self.batches.iter().map(|b| b.rows)
    }

    /// The rows of batch `g`, the projected columns as the `parquet` crate's records.
    pub fn rows(&self, g: usize) -> Result<Vec<Row>, String> {
        let b = &self.batches[g];
        let cannot = |why: String| format!("cannot read record batch {g}: {why}");
        let mut meta = vec![0u8; b.meta.1];
        self.file
            .read_exact_at(&mut meta, b.meta.0)
            .map_err(|e| cannot(e.to_string()))?;
        let mut body = vec![0u8; b.body.1];
        self.file
            .read_exact_at(&mut body, b.body.0)
            .map_err(|e| cannot(e.to_string()))?;
        let m = arrow_ipc::root_as_message(&meta).map_err(|e| cannot(e.to_string()))?;
        let fb = m
            .header_as_record_batch()
            .filter(|fb| fb.length().max(0) as u64 == b.rows)
            .ok_or_else(|| cannot("its header changed since the file was opened".into()))?;
        let batch = arrow_ipc::reader::read_record_batch(
            &Buffer::from_vec(body),
            fb,
            Arc::clone(&self.schema),
            &Default::default(),
            Some(&self.projection),
            &m.version(),
        )
        .map_err(|e| cannot(e.to_string()))?;
        Ok(records(&batch))
    }
}

/// The header of the message at `pos`: its offset and length (0: the end of the stream). Reads
/// the continuation marker (`0xFFFFFFFF`) and length, or the older form's bare length.
fn message_at(file: &File, pos: u64) -> Result<(u64, usize), String> {
    let mut word = [0u8; 4];
    file.read_exact_at(&mut word, pos)
        .map_err(|e| format!("byte {pos}: {e}"))?;
    let (at, len) = if word == [0xFF; 4] {
        file.read_exact_at(&mut word, pos + 4)
            .map_err(|e| format!("byte {}: {e}", pos + 4))?;
        (pos + 8, i32::from_le_bytes(word))
    } else {
        (pos + 4, i32::from_le_bytes(word))
    };
    let len = usize::try_from(len).map_err(|_| format!("a negative message length at byte {pos}"))?;
    Ok((at, len))
}

/// Checks `schema`'s columns against `opts` (the messages name the column and the option, as
/// for Parquet) and returns the indices of the columns read.
fn check(schema: &Schema, image: &str, label: Option<&str>, columns: &[String]) -> Result<Vec<usize>, String> {
    let have = || {
        schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let column = |name: &str, what: &str| {
        schema
            .index_of(name)
            .map_err(|_| format!("no column {name:?} ({what}); its columns: {}", have()))
    };
    let binary = |t: &DataType| matches!(t, DataType::Binary | DataType::LargeBinary | DataType::BinaryView);
    let i = column(image, "open.parquet.image")?;
    let t = schema.field(i).data_type();
    let ok = binary(t)
        || matches!(t, DataType::Struct(fs) if fs.iter().any(|f| f.name() == "bytes" && binary(f.data_type())));
    if !ok {
        return Err(format!(
            "column {image:?} (open.parquet.image) is {t}, not binary nor a struct with a binary member `bytes`"
        ));
    }
    let mut read = vec![i];
    if let Some(l) = label {
        let i = column(l, "open.parquet.label")?;
        let t = schema.field(i).data_type();
        if !t.is_integer() {
            return Err(format!(
                "column {l:?} (open.parquet.label) is {t}, not an integer; pass label=\"\" for no labels"
            ));
        }
        read.push(i);
    }
    for c in columns {
        let i = column(c, "a sample field's source")?;
        let t = schema.field(i).data_type();
        if !readable(t) {
            return Err(format!(
                "column {c:?} (a sample field's source) is {t}, which is not read"
            ));
        }
        read.push(i);
    }
    read.sort_unstable();
    read.dedup();
    Ok(read)
}

/// Whether a field column of type `t` is turned into records ([`field`]).
fn readable(t: &DataType) -> bool {
    match t {
        DataType::Struct(fs) => fs.iter().all(|f| readable(f.data_type())),
        t => {
            t.is_integer()
                || t.is_floating()
                || matches!(
                    t,
                    DataType::Boolean
                        | DataType::Utf8
                        | DataType::LargeUtf8
                        | DataType::Utf8View
                        | DataType::Binary
                        | DataType::LargeBinary
                        | DataType::BinaryView
                        | DataType::Null
                )
        }
    }
}

/// A batch's rows as records (the columns by name).
fn records(batch: &RecordBatch) -> Vec<Row> {
    let schema = batch.schema();
    (0..batch.num_rows())
        .map(|r| {
            Row::new(
                schema
                    .fields()
                    .iter()
                    .zip(batch.columns())
                    .map(|(f, a)| (f.name().clone(), field(a, r)))
                    .collect(),
            )
        })
        .collect()
}

/// Cell `r` of `a` as a record field (a type [`readable`] refuses becomes null, never reached).
fn field(a: &ArrayRef, r: usize) -> Field {
    if a.is_null(r) {
        return Field::Null;
    }
    let bytes = |b: &[u8]| Field::Bytes(ByteArray::from(b.to_vec()));
    match a.data_type() {
        DataType::Binary => bytes(a.as_binary::<i32>().value(r)),
        DataType::LargeBinary => bytes(a.as_binary::<i64>().value(r)),
        DataType::BinaryView => bytes(a.as_binary_view().value(r)),
        DataType::Utf8 => Field::Str(a.as_string::<i32>().value(r).to_owned()),
        DataType::LargeUtf8 => Field::Str(a.as_string::<i64>().value(r).to_owned()),
        DataType::Utf8View => Field::Str(a.as_string_view().value(r).to_owned()),
        DataType::Boolean => Field::Bool(a.as_boolean().value(r)),
        DataType::Int8 => Field::Byte(a.as_primitive::<types::Int8Type>().value(r)),
        DataType::Int16 => Field::Short(a.as_primitive::<types::Int16Type>().value(r)),
        DataType::Int32 => Field::Int(a.as_primitive::<types::Int32Type>().value(r)),
        DataType::Int64 => Field::Long(a.as_primitive::<types::Int64Type>().value(r)),
        DataType::UInt8 => Field::UByte(a.as_primitive::<types::UInt8Type>().value(r)),
        DataType::UInt16 => Field::UShort(a.as_primitive::<types::UInt16Type>().value(r)),
        DataType::UInt32 => Field::UInt(a.as_primitive::<types::UInt32Type>().value(r)),
        DataType::UInt64 => Field::ULong(a.as_primitive::<types::UInt64Type>().value(r)),
        DataType::Float32 => Field::Float(a.as_primitive::<types::Float32Type>().value(r)),
        DataType::Float64 => Field::Double(a.as_primitive::<types::Float64Type>().value(r)),
        DataType::Struct(fs) => {
            let s = a.as_struct();
            Field::Group(Row::new(
                fs.iter()
                    .zip(s.columns())
                    .map(|(f, c)| (f.name().clone(), field(c, r)))
                    .collect(),
            ))
        }
        _ => Field::Null,
    }
}
