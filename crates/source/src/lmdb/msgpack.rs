//! A small, bounded, streaming msgpack reader: just enough for records such as
//! `msgpack.packb([jpeg_bytes, 3])` or `msgpack.packb({"image": jpeg_bytes, "label": 3})` and for
//! label tables.
//!
//! Invariants:
//! - [`Cursor::next`] yields one item at a time; containers yield only their header
//!   ([`Item::Array`], [`Item::Map`]) and the caller walks or [skips](Cursor::skip) their items. No
//!   tree is built and nothing recurses, so nesting depth costs nothing.
//! - `str`, `bin` and `ext` payloads are slices of the input (zero-copy). Every length, and every
//!   container's item count, is checked against the bytes left before it is used.
//! - Reading never panics: every failure is a [`MsgpackError`].

use std::fmt;

/// One msgpack item. Containers carry their item count; their items follow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Item<'a> {
    Nil,
    Bool(bool),
    /// Any integer encoding (`u64` and `i64` both fit).
    Int(i128),
    Float(f64),
    /// A `str` payload; not checked for UTF-8 (old packers put binary data in `str`).
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(usize),
    /// A map of this many key/value pairs.
    Map(usize),
    Ext(i8, &'a [u8]),
}

impl Item<'_> {
    /// The msgpack type name, for messages.
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Item::Nil => "nil",
            Item::Bool(_) => "bool",
            Item::Int(_) => "int",
            Item::Float(_) => "float",
            Item::Str(_) => "str",
            Item::Bin(_) => "bin",
            Item::Array(_) => "array",
            Item::Map(_) => "map",
            Item::Ext(..) => "ext",
        }
    }
}

/// Why msgpack could not be read. `pos` is the offset of the item at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum MsgpackError {
    /// The input ends inside an item.
    Truncated { pos: usize },
    /// Byte 0xc1, which msgpack never uses.
    Reserved { pos: usize },
    /// A container claims more items than the bytes left could hold.
    TooManyItems { pos: usize, items: u64, left: usize },
}

impl fmt::Display for MsgpackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MsgpackError::Truncated { pos } => write!(f, "msgpack truncated at byte {pos}"),
            MsgpackError::Reserved { pos } => {
                write!(f, "invalid msgpack: reserved type byte 0xc1 at byte {pos}")
            }
            MsgpackError::TooManyItems { pos, items, left } => write!(
                f,
                "invalid msgpack at byte {pos}: a container of {items} items with only {left} bytes \
                 left"
            ),
        }
    }
}

impl std::error::Error for MsgpackError {}

/// Whether `data` starts with an array or map header (fixarray, array16, fixmap, map16), the way
/// a msgpack record does.
pub(super) fn sniff(data: &[u8]) -> bool {
    matches!(data.first(), Some(0x80..=0x9f | 0xdc | 0xde))
}

/// A read position in a msgpack buffer.
#[derive(Debug, Clone)]
pub(super) struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(data: &'a [u8]) -> Self {
        Cursor { data, pos: 0 }
    }

    /// Offset of the next item.
    pub(super) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes not read yet.
    pub(super) fn left(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, start: usize) -> Result<&'a [u8], MsgpackError> {
        let data: &'a [u8] = self.data;
        let rest = data.get(self.pos..).unwrap_or(&[]);
        if n > rest.len() {
            return Err(MsgpackError::Truncated { pos: start });
        }
        self.pos += n;
        Ok(&rest[..n])
    }

    fn take_uint(&mut self, width: usize, start: usize) -> Result<u64, MsgpackError> {
        let b = self.take(width, start)?;
        Ok(b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    fn take_int(&mut self, width: usize, start: usize) -> Result<i64, MsgpackError> {
        let raw = self.take_uint(width, start)?;
        // Sign-extend from `width` bytes.
        let shift = 64 - 8 * width as u32;
        Ok(((raw << shift) as i64) >> shift)
    }

    fn payload(&mut self, len: u64, start: usize) -> Result<&'a [u8], MsgpackError> {
        let n = usize::try_from(len).unwrap_or(usize::MAX);
        self.take(n, start)
    }

    /// A container header: `items` more items must fit in what is left (each takes a byte).
    fn container(&self, items: u64, start: usize) -> Result<usize, MsgpackError> {
        let left = self.left();
        match usize::try_from(items) {
            Ok(n) if n <= left => Ok(n),
            _ => Err(MsgpackError::TooManyItems {
                pos: start,
                items,
                left,
            }),
        }
    }

    /// Reads the next item.
    pub(super) fn next(&mut self) -> Result<Item<'a>, MsgpackError> {
        let start = self.pos;
        let tag = self.take(1, start)?[0];
        let item = match tag {
            0x00..=0x7f => Item::Int(tag.into()),
            0x80..=0x8f => Item::Map(self.container(2 * u64::from(tag & 0x0f), start)? / 2),
            0x90..=0x9f => Item::Array(self.container(u64::from(tag & 0x0f), start)?),
            0xa0..=0xbf => Item::Str(self.payload(u64::from(tag & 0x1f), start)?),
            0xc0 => Item::Nil,
            0xc1 => return Err(MsgpackError::Reserved { pos: start }),
            0xc2 => Item::Bool(false),
            0xc3 => Item::Bool(true),
            0xc4..=0xc6 => {
                let len = self.take_uint(1 << (tag - 0xc4), start)?;
                Item::Bin(self.payload(len, start)?)
            }
            0xc7..=0xc9 => {
                let len = self.take_uint(1 << (tag - 0xc7), start)?;
                let ty = self.take_int(1, start)? as i8;
                Item::Ext(ty, self.payload(len, start)?)
            }
            0xca => {
                let bits = self.take_uint(4, start)? as u32;
                Item::Float(f32::from_bits(bits).into())
            }
            0xcb => Item::Float(f64::from_bits(self.take_uint(8, start)?)),
            0xcc..=0xcf => Item::Int(self.take_uint(1 << (tag - 0xcc), start)?.into()),
            0xd0..=0xd3 => Item::Int(self.take_int(1 << (tag - 0xd0), start)?.into()),
            0xd4..=0xd8 => {
                let ty = self.take_int(1, start)? as i8;
                Item::Ext(ty, self.payload(1 << (tag - 0xd4), start)?)
            }
            0xd9..=0xdb => {
                let len = self.take_uint(1 << (tag - 0xd9), start)?;
                Item::Str(self.payload(len, start)?)
            }
            0xdc | 0xdd => {
                let n = self.take_uint(if tag == 0xdc { 2 } else { 4 }, start)?;
                Item::Array(self.container(n, start)?)
            }
            0xde | 0xdf => {
                let n = self.take_uint(if tag == 0xde { 2 } else { 4 }, start)?;
                Item::Map(self.container(2 * n, start)? / 2)
            }
            0xe0..=0xff => Item::Int(i128::from(tag as i8)),
        };
        Ok(item)
    }

    /// Skips `n` whole items, containers included, without recursion.
    pub(super) fn skip(&mut self, n: usize) -> Result<(), MsgpackError> {
        // Items still to read. Every item takes at least one byte, and every container's count
        // was checked against the bytes left, so this stays below the input length plus `n`.
        let mut pending = n as u64;
        while pending > 0 {
            pending -= 1;
            let start = self.pos;
            match self.next()? {
                Item::Array(k) => pending += k as u64,
                Item::Map(k) => pending += 2 * k as u64,
                _ => {}
            }
            if pending > self.left() as u64 {
                return Err(MsgpackError::TooManyItems {
                    pos: start,
                    items: pending,
                    left: self.left(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn one(data: &[u8]) -> Item<'_> {
        let mut c = Cursor::new(data);
        let item = c.next().unwrap_or_else(|e| panic!("{data:?}: {e}"));
        assert_eq!(c.left(), 0, "{data:?}");
        item
    }

    #[test]
    fn ints_in_every_encoding() {
        assert_eq!(one(b"\x00"), Item::Int(0));
        assert_eq!(one(b"\x7f"), Item::Int(127));
        assert_eq!(one(b"\xff"), Item::Int(-1));
        assert_eq!(one(b"\xe0"), Item::Int(-32));
        assert_eq!(one(b"\xcc\xff"), Item::Int(255));
        assert_eq!(one(b"\xcd\x01\x00"), Item::Int(256));
        assert_eq!(one(b"\xce\x00\x01\x00\x00"), Item::Int(65536));
        assert_eq!(one(b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff"), Item::Int(u64::MAX.into()));
        assert_eq!(one(b"\xd0\x80"), Item::Int(-128));
        assert_eq!(one(b"\xd1\xff\x7f"), Item::Int(-129));
        assert_eq!(one(b"\xd2\x80\x00\x00\x00"), Item::Int(i32::MIN.into()));
        assert_eq!(one(b"\xd3\x80\x00\x00\x00\x00\x00\x00\x00"), Item::Int(i64::MIN.into()));
    }

    #[test]
    fn scalars() {
        assert_eq!(one(b"\xc0"), Item::Nil);
        assert_eq!(one(b"\xc2"), Item::Bool(false));
        assert_eq!(one(b"\xc3"), Item::Bool(true));
        assert_eq!(one(b"\xca\x3f\xc0\x00\x00"), Item::Float(1.5));
        assert_eq!(one(b"\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00"), Item::Float(1.5));
        assert_eq!(one(b"\xd4\x01\xaa"), Item::Ext(1, b"\xaa"));
        assert_eq!(one(b"\xd8\xff0123456789abcdef"), Item::Ext(-1, b"0123456789abcdef"));
        assert_eq!(one(b"\xc7\x02\x05ab"), Item::Ext(5, b"ab"));
        assert_eq!(one(b"\xc8\x00\x02\x05ab"), Item::Ext(5, b"ab"));
        assert_eq!(one(b"\xc9\x00\x00\x00\x02\x05ab"), Item::Ext(5, b"ab"));
    }

    #[test]
    fn strings_and_bins_borrow() {
        let data = b"\xc4\x03abc";
        let Item::Bin(b) = one(data) else { panic!() };
        assert_eq!(b, b"abc");
        assert!(data.as_ptr_range().contains(&b.as_ptr()));
        assert_eq!(one(b"\xc5\x00\x03abc"), Item::Bin(b"abc"));
        assert_eq!(one(b"\xc6\x00\x00\x00\x03abc"), Item::Bin(b"abc"));
        assert_eq!(one(b"\xa3abc"), Item::Str(b"abc"));
        assert_eq!(one(b"\xd9\x03abc"), Item::Str(b"abc"));
        assert_eq!(one(b"\xda\x00\x03abc"), Item::Str(b"abc"));
        assert_eq!(one(b"\xdb\x00\x00\x00\x03abc"), Item::Str(b"abc"));
    }

    #[test]
    fn containers() {
        assert_eq!(one(b"\x90"), Item::Array(0));
        assert_eq!(one(b"\x80"), Item::Map(0));
        let mut c = Cursor::new(b"\x92\xc4\x01x\x03");
        assert_eq!(c.next().unwrap(), Item::Array(2));
        assert_eq!(c.next().unwrap(), Item::Bin(b"x"));
        assert_eq!(c.next().unwrap(), Item::Int(3));
        let mut c = Cursor::new(b"\xdc\x00\x01\x01");
        assert_eq!(c.next().unwrap(), Item::Array(1));
        let mut c = Cursor::new(b"\xdd\x00\x00\x00\x01\x01");
        assert_eq!(c.next().unwrap(), Item::Array(1));
        let mut c = Cursor::new(b"\xde\x00\x01\x01\x02");
        assert_eq!(c.next().unwrap(), Item::Map(1));
        let mut c = Cursor::new(b"\xdf\x00\x00\x00\x01\x01\x02");
        assert_eq!(c.next().unwrap(), Item::Map(1));
    }

    #[test]
    fn skip_walks_nested_containers() {
        // [{"a": [1, 2, {"b": nil}]}, 7] then 9
        let data = b"\x92\x81\xa1a\x93\x01\x02\x81\xa1b\xc0\x07\x09";
        let mut c = Cursor::new(data);
        c.skip(1).unwrap();
        assert_eq!(c.next().unwrap(), Item::Int(9));
    }

    #[test]
    fn reserved_byte() {
        assert_eq!(Cursor::new(b"\xc1").next(), Err(MsgpackError::Reserved { pos: 0 }));
    }

    #[test]
    fn every_truncation_is_an_error() {
        let data = b"\x82\xa5image\xc5\x00\x03abc\xa5label\xcd\x01\x00";
        for n in 0..data.len() {
            let mut c = Cursor::new(&data[..n]);
            assert!(c.skip(1).is_err(), "prefix {n}");
        }
        let mut c = Cursor::new(data);
        c.skip(1).unwrap();
        assert_eq!(c.left(), 0);
    }

    #[test]
    fn hostile_lengths_are_checked_before_use() {
        for data in [
            &b"\xc6\xff\xff\xff\xffab"[..],
            b"\xdb\xff\xff\xff\xffab",
            b"\xc9\xff\xff\xff\xff\x01ab",
        ] {
            assert!(matches!(Cursor::new(data).next(), Err(MsgpackError::Truncated { .. })));
        }
        for data in [
            &b"\xdd\xff\xff\xff\xff\x01"[..],
            b"\xdf\xff\xff\xff\xff\x01",
            b"\x9f\x01",
        ] {
            assert!(matches!(
                Cursor::new(data).next(),
                Err(MsgpackError::TooManyItems { .. })
            ));
        }
    }

    #[test]
    fn depth_bombs_are_cheap() {
        // 100k nested one-element arrays around an int: no recursion, no allocation.
        let mut data = vec![0x91u8; 100_000];
        data.push(0x01);
        let mut c = Cursor::new(&data);
        c.skip(1).unwrap();
        assert_eq!(c.left(), 0);
        // The same, truncated.
        let mut c = Cursor::new(&data[..50_000]);
        assert!(c.skip(1).is_err());
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut c = Cursor::new(&data);
            let _ = c.skip(3);
            let mut c = Cursor::new(&data);
            while c.next().is_ok() && c.left() > 0 {}
        }
    }
}
