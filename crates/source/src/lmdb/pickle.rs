//! A small, bounded parser for the subset of Python pickles that image LMDBs hold.
//!
//! Records such as `pickle.dumps((jpeg_bytes, 3))` and label tables such as
//! `pickle.dumps({"a.jpg": 3, ...})` use a handful of opcodes: containers, strings, bytes and
//! ints. This module runs exactly those opcodes, on a stack machine whose values live in an arena
//! ([`Pickle::node`]), and refuses everything else with an error that names the opcode. It never
//! imports or calls anything, so a hostile pickle can do no more than fail to parse.
//!
//! Invariants:
//! - Bytes and strings are slices of the input: nothing is copied, however large the image. The
//!   one exception is protocol 2 as written by Python 3, which stores `bytes` as the call
//!   `_codecs.encode(latin1_text, "latin1")`; that value is kept as [`Node::Latin1`] and turned back
//!   into bytes by [`latin1_to_bytes`] (one copy) by whoever needs it.
//! - Every length read from the input is checked against the bytes left before it is used, and the
//!   arena, the stack, the mark stack and the memo are capped by [`Limits`]. Nothing recurses, so
//!   deep or self-referencing containers cannot overflow the Rust stack.
//! - Parsing never panics: every failure is a [`PickleError`].

use std::collections::HashMap;
use std::fmt;

/// Index of a value in the arena of a [`Pickle`].
pub(super) type NodeId = u32;

/// The only callables a pickle may name (with `GLOBAL` or `STACK_GLOBAL`) and call (`REDUCE`).
/// They are the ones Python's own pickler uses for `bytes` and `bytearray` below protocols 3 / 5.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Callable {
    /// `_codecs.encode(text, "latin1")`: protocol 2 `bytes` written by Python 3.
    CodecsEncode,
    /// `bytes()`: an empty `bytes` below protocol 3.
    Bytes,
    /// `bytearray(b)`: a `bytearray` below protocol 5.
    ByteArray,
}

/// One unpickled value.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Node<'a> {
    None,
    Bool(bool),
    Int(i64),
    /// An int that does not fit in an `i64`.
    BigInt,
    Float(f64),
    /// `bytes`, `bytearray`, or a Python 2 `str`, borrowed from the input.
    Bytes(&'a [u8]),
    /// `bytes` stored as latin-1 text (protocol 2 from Python 3); see [`latin1_to_bytes`].
    Latin1(&'a str),
    Str(&'a str),
    Tuple(Vec<NodeId>),
    List(Vec<NodeId>),
    Dict(Vec<(NodeId, NodeId)>),
    Global(Callable),
}

impl Node<'_> {
    /// A short name of the value's Python type, for messages.
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Node::None => "none",
            Node::Bool(_) => "bool",
            Node::Int(_) | Node::BigInt => "int",
            Node::Float(_) => "float",
            Node::Bytes(_) | Node::Latin1(_) => "bytes",
            Node::Str(_) => "str",
            Node::Tuple(_) => "tuple",
            Node::List(_) => "list",
            Node::Dict(_) => "dict",
            Node::Global(_) => "callable",
        }
    }
}

/// Caps on the parser's memory, so that the work done is bounded whatever the input.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Values created (one per opcode at most).
    pub(super) max_nodes: usize,
    /// Values on the stack at once.
    pub(super) max_stack: usize,
    /// Open `MARK`s at once (the nesting depth of containers being built).
    pub(super) max_marks: usize,
    /// Memo entries.
    pub(super) max_memo: usize,
}

/// Limits for one sample record: a tuple or a small dict.
pub(super) const RECORD_LIMITS: Limits = Limits {
    max_nodes: 1 << 16,
    max_stack: 1 << 16,
    max_marks: 64,
    max_memo: 1 << 16,
};

/// Limits for a label table: one dict or list entry per sample, millions of them.
pub(super) const TABLE_LIMITS: Limits = Limits {
    max_nodes: 1 << 28,
    max_stack: 1 << 27,
    max_marks: 64,
    max_memo: 1 << 27,
};

/// Why a pickle could not be parsed. `pos` is the byte offset of the opcode at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PickleError {
    /// The input ended inside an opcode, or before `STOP`.
    Truncated { pos: usize, op: Option<u8> },
    /// An opcode outside the supported subset.
    Unsupported { pos: usize, op: u8 },
    /// `GLOBAL` / `STACK_GLOBAL` naming anything but the few callables in [`Callable`].
    UnsupportedGlobal {
        pos: usize,
        op: u8,
        module: String,
        name: String,
    },
    /// The opcodes are known but do not make sense (stack underflow, bad UTF-8, ...).
    Invalid { pos: usize, op: u8, reason: &'static str },
    /// A [`Limits`] cap was reached.
    Limit {
        pos: usize,
        op: u8,
        what: &'static str,
        max: usize,
    },
}

const HINT: &str = "ringfeed reads only pickles of tuples, lists, dicts, bytes, str and python \
                    ints: store python ints (e.g. `int(label)`), or use `--lmdb-layout raw` with a \
                    labels file (`--labels`)";

impl fmt::Display for PickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PickleError::Truncated { pos, op: None } => {
                write!(f, "pickle ends at byte {pos} without a STOP opcode (truncated value?)")
            }
            PickleError::Truncated { pos, op: Some(op) } => write!(
                f,
                "pickle truncated inside opcode {} (0x{op:02x}) at byte {pos}",
                op_name(*op)
            ),
            PickleError::Unsupported { pos, op } => write!(
                f,
                "unsupported pickle opcode {} (0x{op:02x}) at byte {pos}; {HINT}",
                op_name(*op)
            ),
            PickleError::UnsupportedGlobal { pos, op, module, name } => {
                write!(
                    f,
                    "unsupported pickle opcode {} (0x{op:02x}) at byte {pos}, importing `{}.{}`",
                    op_name(*op),
                    module.escape_debug(),
                    name.escape_debug(),
                )?;
                if module.starts_with("numpy") {
                    write!(
                        f,
                        "; the values hold numpy objects (numpy ints as labels?): store python \
                         ints (e.g. `int(label)`) when writing the lmdb, or use `--lmdb-layout raw` \
                         with a labels file (`--labels`)"
                    )
                } else {
                    write!(f, "; {HINT}")
                }
            }
            PickleError::Invalid { pos, op, reason } => write!(
                f,
                "malformed pickle at byte {pos} (opcode {} 0x{op:02x}): {reason}",
                op_name(*op)
            ),
            PickleError::Limit { pos, op, what, max } => write!(
                f,
                "pickle too large at byte {pos} (opcode {} 0x{op:02x}): more than {max} {what}",
                op_name(*op)
            ),
        }
    }
}

impl std::error::Error for PickleError {}

/// The name Python's `pickletools` gives an opcode.
pub(super) fn op_name(op: u8) -> &'static str {
    match op {
        b'(' => "MARK",
        b'.' => "STOP",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'F' => "FLOAT",
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'L' => "LONG",
        b'M' => "BININT2",
        b'N' => "NONE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'R' => "REDUCE",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'X' => "BINUNICODE",
        b'a' => "APPEND",
        b'b' => "BUILD",
        b'c' => "GLOBAL",
        b'd' => "DICT",
        b'}' => "EMPTY_DICT",
        b'e' => "APPENDS",
        b'g' => "GET",
        b'h' => "BINGET",
        b'i' => "INST",
        b'j' => "LONG_BINGET",
        b'l' => "LIST",
        b']' => "EMPTY_LIST",
        b'o' => "OBJ",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b's' => "SETITEM",
        b't' => "TUPLE",
        b')' => "EMPTY_TUPLE",
        b'u' => "SETITEMS",
        b'G' => "BINFLOAT",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x80 => "PROTO",
        0x81 => "NEWOBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8a => "LONG1",
        0x8b => "LONG4",
        0x8c => "SHORT_BINUNICODE",
        0x8d => "BINUNICODE8",
        0x8e => "BINBYTES8",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x92 => "NEWOBJ_EX",
        0x93 => "STACK_GLOBAL",
        0x94 => "MEMOIZE",
        0x95 => "FRAME",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "unknown",
    }
}

/// Whether `data` starts like a pickle of protocol 2 to 5 (`PROTO n`).
pub(super) fn sniff(data: &[u8]) -> bool {
    matches!(data, [0x80, 2..=5, ..])
}

/// Turns the latin-1 text of a [`Node::Latin1`] back into the bytes it encodes, into `out`.
/// Fails if a character is above U+00FF (the text was not latin-1).
pub(super) fn latin1_to_bytes(text: &str, out: &mut Vec<u8>) -> Result<(), char> {
    out.clear();
    out.reserve(text.len());
    for c in text.chars() {
        let b = u8::try_from(u32::from(c)).map_err(|_| c)?;
        out.push(b);
    }
    Ok(())
}

/// A parsed pickle: the arena of values and the one `STOP` returned.
#[derive(Debug)]
pub(super) struct Pickle<'a> {
    nodes: Vec<Node<'a>>,
    root: NodeId,
}

impl<'a> Pickle<'a> {
    /// Runs the pickle in `data` up to its `STOP` opcode. Bytes after `STOP` are ignored, as
    /// Python's `pickle.loads` does.
    pub(super) fn parse(data: &'a [u8], limits: Limits) -> Result<Self, PickleError> {
        Machine::new(data, limits).run()
    }

    /// The value the pickle returns.
    pub(super) fn root(&self) -> &Node<'a> {
        self.node(self.root)
    }

    /// The value `id` (from a container of this pickle).
    pub(super) fn node(&self, id: NodeId) -> &Node<'a> {
        // Ids come only from this arena, so they are always in range; `None` is unreachable but
        // kept panic-free.
        self.nodes.get(id as usize).unwrap_or(&Node::None)
    }
}

/// The unpickling stack machine.
struct Machine<'a> {
    data: &'a [u8],
    limits: Limits,
    /// Read position in `data`.
    pos: usize,
    /// Offset of the opcode being run, for messages.
    op_pos: usize,
    /// The opcode being run, for messages.
    op: u8,
    nodes: Vec<Node<'a>>,
    stack: Vec<NodeId>,
    /// Stack lengths at each open `MARK`. Values below the top mark cannot be popped except by
    /// the opcode that consumes the mark (as in CPython's `_Unpickler`).
    marks: Vec<usize>,
    memo: HashMap<u32, NodeId>,
}

impl<'a> Machine<'a> {
    fn new(data: &'a [u8], limits: Limits) -> Self {
        Machine {
            data,
            limits,
            pos: 0,
            op_pos: 0,
            op: 0,
            nodes: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
        }
    }

    fn invalid(&self, reason: &'static str) -> PickleError {
        PickleError::Invalid {
            pos: self.op_pos,
            op: self.op,
            reason,
        }
    }

    fn limit(&self, what: &'static str, max: usize) -> PickleError {
        PickleError::Limit {
            pos: self.op_pos,
            op: self.op,
            what,
            max,
        }
    }

    /// The next `n` bytes of the opcode's argument.
    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let data: &'a [u8] = self.data;
        let rest = &data[self.pos.min(data.len())..];
        if n > rest.len() {
            return Err(PickleError::Truncated {
                pos: self.op_pos,
                op: Some(self.op),
            });
        }
        self.pos += n;
        Ok(&rest[..n])
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let bytes = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn take_u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take_array::<1>()?[0])
    }

    fn take_u32(&mut self) -> Result<u32, PickleError> {
        Ok(u32::from_le_bytes(self.take_array()?))
    }

    /// A length read from the input as a `u64`; checked against what is left before any use.
    fn take_len(&mut self, len: u64) -> Result<&'a [u8], PickleError> {
        let n = usize::try_from(len).unwrap_or(usize::MAX);
        self.take(n)
    }

    /// A `\n`-terminated line (the arguments of `GLOBAL`), without the newline.
    fn take_line(&mut self) -> Result<&'a [u8], PickleError> {
        let data: &'a [u8] = self.data;
        let rest = &data[self.pos.min(data.len())..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => Err(PickleError::Truncated {
                pos: self.op_pos,
                op: Some(self.op),
            }),
        }
    }

    fn alloc(&mut self, node: Node<'a>) -> Result<NodeId, PickleError> {
        if self.nodes.len() >= self.limits.max_nodes {
            return Err(self.limit("values", self.limits.max_nodes));
        }
        let id = NodeId::try_from(self.nodes.len()).map_err(|_| self.limit("values", u32::MAX as usize))?;
        self.nodes.push(node);
        Ok(id)
    }

    fn push_id(&mut self, id: NodeId) -> Result<(), PickleError> {
        if self.stack.len() >= self.limits.max_stack {
            return Err(self.limit("values on the stack", self.limits.max_stack));
        }
        self.stack.push(id);
        Ok(())
    }

    fn push(&mut self, node: Node<'a>) -> Result<(), PickleError> {
        let id = self.alloc(node)?;
        self.push_id(id)
    }

    /// Stack length below which values belong to an enclosing mark.
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Result<NodeId, PickleError> {
        if self.stack.len() <= self.floor() {
            return Err(self.invalid("stack underflow"));
        }
        self.stack.pop().ok_or_else(|| self.invalid("stack underflow"))
    }

    fn top(&self) -> Result<NodeId, PickleError> {
        if self.stack.len() <= self.floor() {
            return Err(self.invalid("stack underflow"));
        }
        self.stack
            .last()
            .copied()
            .ok_or_else(|| self.invalid("stack underflow"))
    }

    /// Pops the values pushed since the last `MARK`, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<NodeId>, PickleError> {
        let mark = self.marks.pop().ok_or_else(|| self.invalid("no MARK to close"))?;
        Ok(self.stack.split_off(mark.min(self.stack.len())))
    }

    fn memo_put(&mut self, key: u32) -> Result<(), PickleError> {
        let top = self.top()?;
        if self.memo.len() >= self.limits.max_memo && !self.memo.contains_key(&key) {
            return Err(self.limit("memo entries", self.limits.max_memo));
        }
        self.memo.insert(key, top);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Result<(), PickleError> {
        let id = *self.memo.get(&key).ok_or_else(|| self.invalid("memo key not found"))?;
        self.push_id(id)
    }

    fn str_node(&self, bytes: &'a [u8]) -> Result<Node<'a>, PickleError> {
        std::str::from_utf8(bytes)
            .map(Node::Str)
            .map_err(|_| self.invalid("str is not valid utf-8"))
    }

    fn node(&self, id: NodeId) -> &Node<'a> {
        self.nodes.get(id as usize).unwrap_or(&Node::None)
    }

    fn node_mut(&mut self, id: NodeId) -> Option<&mut Node<'a>> {
        self.nodes.get_mut(id as usize)
    }

    fn global(&mut self, module: &[u8], name: &[u8]) -> Result<(), PickleError> {
        let callable = match (module, name) {
            (b"_codecs", b"encode") => Some(Callable::CodecsEncode),
            (b"__builtin__" | b"builtins", b"bytes") => Some(Callable::Bytes),
            (b"__builtin__" | b"builtins", b"bytearray") => Some(Callable::ByteArray),
            _ => None,
        };
        match callable {
            Some(c) => self.push(Node::Global(c)),
            None => Err(PickleError::UnsupportedGlobal {
                pos: self.op_pos,
                op: self.op,
                module: String::from_utf8_lossy(module).into_owned(),
                name: String::from_utf8_lossy(name).into_owned(),
            }),
        }
    }

    fn reduce(&mut self) -> Result<(), PickleError> {
        let args_id = self.pop()?;
        let callable_id = self.pop()?;
        let Node::Global(callable) = *self.node(callable_id) else {
            return Err(self.invalid("REDUCE of a value that is not a callable"));
        };
        let Node::Tuple(args) = self.node(args_id) else {
            return Err(self.invalid("REDUCE arguments are not a tuple"));
        };
        let args: Vec<&Node<'a>> = args.iter().map(|&a| self.node(a)).collect();
        let result = match (callable, args.as_slice()) {
            (Callable::CodecsEncode, [Node::Str(text), Node::Str(encoding)]) => {
                match encoding.to_ascii_lowercase().as_str() {
                    "latin1" | "latin-1" | "iso-8859-1" | "iso8859-1" => Node::Latin1(text),
                    "utf-8" | "utf8" => Node::Bytes(text.as_bytes()),
                    _ => {
                        return Err(self.invalid("_codecs.encode with an encoding other than latin1"));
                    }
                }
            }
            (Callable::CodecsEncode, [Node::Str(text)]) => Node::Bytes(text.as_bytes()),
            (Callable::Bytes | Callable::ByteArray, []) => Node::Bytes(&[]),
            (Callable::Bytes | Callable::ByteArray, [Node::Bytes(b)]) => Node::Bytes(b),
            (Callable::Bytes | Callable::ByteArray, [Node::Latin1(t)]) => Node::Latin1(t),
            _ => return Err(self.invalid("unexpected arguments to a bytes constructor")),
        };
        self.push(result)
    }

    fn long(&self, bytes: &[u8]) -> Node<'a> {
        // Two's complement, little-endian, of any width: it fits in an i64 when every byte past
        // the eighth repeats the sign.
        let negative = bytes.last().is_some_and(|&b| b & 0x80 != 0);
        let fill = if negative { 0xff } else { 0x00 };
        let (low, high) = bytes.split_at(bytes.len().min(8));
        if high.iter().any(|&b| b != fill) {
            return Node::BigInt;
        }
        let mut buf = [fill; 8];
        buf[..low.len()].copy_from_slice(low);
        let value = i64::from_le_bytes(buf);
        if (value < 0) != negative {
            Node::BigInt
        } else {
            Node::Int(value)
        }
    }

    /// Pushes the value of a bytes, text, number or constant opcode; false for any other opcode.
    fn scalar(&mut self, op: u8) -> Result<bool, PickleError> {
        match op {
            // Bytes.
            b'C' => {
                let n = self.take_u8()?;
                let b = self.take(n.into())?;
                self.push(Node::Bytes(b))?;
            }
            b'B' => {
                let n = self.take_u32()?;
                let b = self.take_len(n.into())?;
                self.push(Node::Bytes(b))?;
            }
            0x8e | 0x96 => {
                // BINBYTES8, BYTEARRAY8
                let n = u64::from_le_bytes(self.take_array()?);
                let b = self.take_len(n)?;
                self.push(Node::Bytes(b))?;
            }
            b'U' => {
                // SHORT_BINSTRING: a Python 2 str, i.e. bytes.
                let n = self.take_u8()?;
                let b = self.take(n.into())?;
                self.push(Node::Bytes(b))?;
            }
            b'T' => {
                // BINSTRING
                let n = i32::from_le_bytes(self.take_array()?);
                let n = u64::try_from(n).map_err(|_| self.invalid("negative length"))?;
                let b = self.take_len(n)?;
                self.push(Node::Bytes(b))?;
            }
            // Text.
            0x8c => {
                let n = self.take_u8()?;
                let b = self.take(n.into())?;
                let s = self.str_node(b)?;
                self.push(s)?;
            }
            b'X' => {
                let n = self.take_u32()?;
                let b = self.take_len(n.into())?;
                let s = self.str_node(b)?;
                self.push(s)?;
            }
            0x8d => {
                let n = u64::from_le_bytes(self.take_array()?);
                let b = self.take_len(n)?;
                let s = self.str_node(b)?;
                self.push(s)?;
            }
            // Numbers and constants.
            b'J' => {
                let v = i32::from_le_bytes(self.take_array()?);
                self.push(Node::Int(v.into()))?;
            }
            b'K' => {
                let v = self.take_u8()?;
                self.push(Node::Int(v.into()))?;
            }
            b'M' => {
                let v = u16::from_le_bytes(self.take_array()?);
                self.push(Node::Int(v.into()))?;
            }
            0x8a => {
                // LONG1
                let n = self.take_u8()?;
                let b = self.take(n.into())?;
                let node = self.long(b);
                self.push(node)?;
            }
            b'N' => self.push(Node::None)?,
            0x88 => self.push(Node::Bool(true))?,
            0x89 => self.push(Node::Bool(false))?,
            b'G' => {
                let v = f64::from_be_bytes(self.take_array()?);
                self.push(Node::Float(v))?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Runs a tuple, list, dict, memo or callable opcode; false for any other opcode.
    fn structure(&mut self, op: u8) -> Result<bool, PickleError> {
        match op {
            // Tuples.
            b')' => self.push(Node::Tuple(Vec::new()))?,
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = vec![0; n];
                for slot in items.iter_mut().rev() {
                    *slot = self.pop()?;
                }
                self.push(Node::Tuple(items))?;
            }
            b't' => {
                let items = self.pop_mark()?;
                self.push(Node::Tuple(items))?;
            }
            // Lists.
            b']' => self.push(Node::List(Vec::new()))?,
            b'a' => {
                let value = self.pop()?;
                let list = self.top()?;
                match self.node_mut(list) {
                    Some(Node::List(items)) => items.push(value),
                    _ => return Err(self.invalid("APPEND to a value that is not a list")),
                }
            }
            b'e' => {
                let values = self.pop_mark()?;
                let list = self.top()?;
                match self.node_mut(list) {
                    Some(Node::List(items)) => items.extend(values),
                    _ => return Err(self.invalid("APPENDS to a value that is not a list")),
                }
            }
            // Dicts.
            b'}' => self.push(Node::Dict(Vec::new()))?,
            b's' => {
                let value = self.pop()?;
                let key = self.pop()?;
                let dict = self.top()?;
                match self.node_mut(dict) {
                    Some(Node::Dict(items)) => items.push((key, value)),
                    _ => return Err(self.invalid("SETITEM on a value that is not a dict")),
                }
            }
            b'u' => {
                let values = self.pop_mark()?;
                if values.len() % 2 != 0 {
                    return Err(self.invalid("SETITEMS with an odd number of values"));
                }
                let dict = self.top()?;
                match self.node_mut(dict) {
                    Some(Node::Dict(items)) => {
                        items.extend(values.chunks_exact(2).map(|kv| (kv[0], kv[1])));
                    }
                    _ => return Err(self.invalid("SETITEMS on a value that is not a dict")),
                }
            }
            // Memo.
            0x94 => {
                let key =
                    u32::try_from(self.memo.len()).map_err(|_| self.limit("memo entries", self.limits.max_memo))?;
                self.memo_put(key)?;
            }
            b'q' => {
                let key = self.take_u8()?;
                self.memo_put(key.into())?;
            }
            b'r' => {
                let key = self.take_u32()?;
                self.memo_put(key)?;
            }
            b'h' => {
                let key = self.take_u8()?;
                self.memo_get(key.into())?;
            }
            b'j' => {
                let key = self.take_u32()?;
                self.memo_get(key)?;
            }
            // The few callables Python's pickler uses for bytes.
            b'c' => {
                let module = self.take_line()?;
                let name = self.take_line()?;
                self.global(module, name)?;
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Node::Str(module), Node::Str(name)) = (self.node(module), self.node(name)) else {
                    return Err(self.invalid("STACK_GLOBAL arguments are not str"));
                };
                let (module, name) = (module.as_bytes(), name.as_bytes());
                self.global(module, name)?;
            }
            b'R' => self.reduce()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn run(mut self) -> Result<Pickle<'a>, PickleError> {
        loop {
            self.op_pos = self.pos;
            let Some(&op) = self.data.get(self.pos) else {
                return Err(PickleError::Truncated {
                    pos: self.pos,
                    op: None,
                });
            };
            self.op = op;
            self.pos += 1;
            match op {
                0x80 => {
                    // PROTO
                    let version = self.take_u8()?;
                    if version > 5 {
                        return Err(self.invalid("protocol above 5"));
                    }
                }
                0x95 => {
                    // FRAME: only a read-ahead hint; check that the frame fits.
                    let len = u64::from_le_bytes(self.take_array()?);
                    let left = (self.data.len() - self.pos.min(self.data.len())) as u64;
                    if len > left {
                        return Err(PickleError::Truncated {
                            pos: self.op_pos,
                            op: Some(op),
                        });
                    }
                }
                b'.' => {
                    // STOP
                    let root = self.pop()?;
                    return Ok(Pickle {
                        nodes: self.nodes,
                        root,
                    });
                }
                b'(' => {
                    // MARK
                    if self.marks.len() >= self.limits.max_marks {
                        return Err(self.limit("nested marks", self.limits.max_marks));
                    }
                    self.marks.push(self.stack.len());
                }
                _ if self.scalar(op)? || self.structure(op)? => {}
                _ => {
                    return Err(PickleError::Unsupported { pos: self.op_pos, op });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse(data: &[u8]) -> Result<Pickle<'_>, PickleError> {
        Pickle::parse(data, RECORD_LIMITS)
    }

    /// Parses `data` and returns its root, rendered simply for comparisons.
    fn root(data: &[u8]) -> Node<'_> {
        let p = parse(data).unwrap_or_else(|e| panic!("{e}"));
        p.root().clone()
    }

    // `pickle.dumps((b'\xff\xd8\xffab', 3), protocol=p)`, from CPython 3.11.
    const TUPLE_P2: &[u8] = b"\x80\x02c_codecs\nencode\nq\x00X\x08\x00\x00\x00\xc3\xbf\xc3\x98\xc3\xbfabq\x01X\x06\x00\x00\x00latin1q\x02\x86q\x03Rq\x04K\x03\x86q\x05.";
    const TUPLE_P3: &[u8] = b"\x80\x03C\x05\xff\xd8\xffabq\x00K\x03\x86q\x01.";
    const TUPLE_P4: &[u8] = b"\x80\x04\x95\x0d\x00\x00\x00\x00\x00\x00\x00C\x05\xff\xd8\xffab\x94K\x03\x86\x94.";
    // `pickle.dumps({'image': bytearray(b'ab'), 'label': 7, 'x': [1.5, None, True]}, protocol=5)`
    const DICT_P5: &[u8] = b"\x80\x05\x95\x36\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x05image\x94\x96\x02\x00\x00\x00\x00\x00\x00\x00ab\x94\x8c\x05label\x94K\x07\x8c\x01x\x94]\x94(G?\xf8\x00\x00\x00\x00\x00\x00N\x88eu.";

    fn tuple_of<'p>(p: &'p Pickle<'_>) -> Vec<&'p Node<'p>> {
        match p.root() {
            Node::Tuple(items) | Node::List(items) => items.iter().map(|&i| p.node(i)).collect(),
            other => panic!("not a tuple: {other:?}"),
        }
    }

    #[test]
    fn protocol_2_bytes_are_latin1_text() {
        let p = parse(TUPLE_P2).unwrap();
        let items = tuple_of(&p);
        let Node::Latin1(text) = items[0] else {
            panic!("{:?}", items[0])
        };
        let mut out = Vec::new();
        latin1_to_bytes(text, &mut out).unwrap();
        assert_eq!(out, b"\xff\xd8\xffab");
        assert_eq!(items[1], &Node::Int(3));
    }

    #[test]
    fn protocols_3_to_5_borrow_bytes() {
        for data in [TUPLE_P3, TUPLE_P4] {
            let p = parse(data).unwrap();
            let items = tuple_of(&p);
            let Node::Bytes(b) = items[0] else {
                panic!("{:?}", items[0])
            };
            assert_eq!(*b, b"\xff\xd8\xffab");
            // Zero-copy: the slice points into the input.
            let range = data.as_ptr_range();
            assert!(range.contains(&b.as_ptr()));
            assert_eq!(items[1], &Node::Int(3));
        }
    }

    #[test]
    fn dict_with_nested_list_and_bytearray8() {
        let p = parse(DICT_P5).unwrap();
        let Node::Dict(items) = p.root() else { panic!() };
        let pairs: Vec<_> = items.iter().map(|&(k, v)| (p.node(k), p.node(v))).collect();
        assert_eq!(pairs[0], (&Node::Str("image"), &Node::Bytes(b"ab")));
        assert_eq!(pairs[1], (&Node::Str("label"), &Node::Int(7)));
        let Node::List(xs) = pairs[2].1 else { panic!() };
        let xs: Vec<_> = xs.iter().map(|&i| p.node(i).clone()).collect();
        assert_eq!(xs, vec![Node::Float(1.5), Node::None, Node::Bool(true)]);
    }

    #[test]
    fn ints() {
        assert_eq!(root(b"\x80\x02K\xff."), Node::Int(255));
        assert_eq!(root(b"\x80\x02M\x00\x01."), Node::Int(256));
        assert_eq!(root(b"\x80\x02J\xff\xff\xff\xff."), Node::Int(-1));
        assert_eq!(root(b"\x80\x02\x8a\x00."), Node::Int(0));
        assert_eq!(root(b"\x80\x02\x8a\x01\xff."), Node::Int(-1));
        assert_eq!(root(b"\x80\x02\x8a\x05\x00\x00\x00\x00\x01."), Node::Int(1 << 32));
        // 2**63 needs 9 bytes.
        assert_eq!(
            root(b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00."),
            Node::BigInt
        );
        // -2**63 fits in 8.
        assert_eq!(
            root(b"\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80."),
            Node::Int(i64::MIN)
        );
        // Non-minimal but in range.
        assert_eq!(
            root(b"\x80\x02\x8a\x0a\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00."),
            Node::Int(5)
        );
        assert_eq!(
            root(b"\x80\x02\x8a\x09\xfe\xff\xff\xff\xff\xff\xff\xff\xff."),
            Node::Int(-2)
        );
        assert_eq!(
            root(b"\x80\x02\x8a\x09\xfe\xff\xff\xff\xff\xff\xff\x7f\xff."),
            Node::BigInt
        );
    }

    #[test]
    fn constants_and_floats() {
        assert_eq!(root(b"\x80\x02N."), Node::None);
        assert_eq!(root(b"\x80\x02\x88."), Node::Bool(true));
        assert_eq!(root(b"\x80\x02\x89."), Node::Bool(false));
        assert_eq!(root(b"\x80\x02G\xc0\x00\x00\x00\x00\x00\x00\x00."), Node::Float(-2.0));
    }

    #[test]
    fn strings_and_bytes() {
        assert_eq!(root(b"\x80\x04\x8c\x02hi."), Node::Str("hi"));
        assert_eq!(root(b"\x80\x03X\x02\x00\x00\x00hi."), Node::Str("hi"));
        assert_eq!(
            root(b"\x80\x04\x8d\x02\x00\x00\x00\x00\x00\x00\x00hi."),
            Node::Str("hi")
        );
        assert_eq!(root(b"\x80\x03C\x02hi."), Node::Bytes(b"hi"));
        assert_eq!(root(b"\x80\x03B\x02\x00\x00\x00hi."), Node::Bytes(b"hi"));
        assert_eq!(
            root(b"\x80\x04\x8e\x02\x00\x00\x00\x00\x00\x00\x00hi."),
            Node::Bytes(b"hi")
        );
        assert_eq!(
            root(b"\x80\x05\x96\x02\x00\x00\x00\x00\x00\x00\x00hi."),
            Node::Bytes(b"hi")
        );
        // Python 2 str.
        assert_eq!(root(b"\x80\x02U\x02hi."), Node::Bytes(b"hi"));
        assert_eq!(root(b"\x80\x02T\x02\x00\x00\x00hi."), Node::Bytes(b"hi"));
        assert!(matches!(
            parse(b"\x80\x02T\xff\xff\xff\xffhi."),
            Err(PickleError::Invalid { .. })
        ));
        // Invalid UTF-8 in a str.
        assert!(matches!(
            parse(b"\x80\x04\x8c\x01\xff."),
            Err(PickleError::Invalid { .. })
        ));
    }

    #[test]
    fn empty_bytes_and_bytearray_below_protocol_5() {
        // pickle.dumps(b'', protocol=2)
        assert_eq!(root(b"\x80\x02c__builtin__\nbytes\nq\x00)Rq\x01."), Node::Bytes(b""));
        // pickle.dumps(bytearray(b'ab'), protocol=4)
        let p4 = b"\x80\x04\x95\x23\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x94\x8c\tbytearray\x94\x93\x94C\x02ab\x94\x85\x94R\x94.";
        assert_eq!(root(p4), Node::Bytes(b"ab"));
        // bytearray(b'\xff') at protocol 2: the bytes argument is itself latin-1 text.
        let p2 = b"\x80\x02c__builtin__\nbytearray\nq\x00c_codecs\nencode\nq\x01X\x02\x00\x00\x00\xc3\xbfq\x02X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05\x85q\x06Rq\x07.";
        assert_eq!(root(p2), Node::Latin1("\u{ff}"));
    }

    #[test]
    fn tuples() {
        assert_eq!(root(b"\x80\x02)."), Node::Tuple(vec![]));
        assert_eq!(root(b"\x80\x02K\x01\x85."), Node::Tuple(vec![0]));
        assert_eq!(root(b"\x80\x02K\x01K\x02\x86."), Node::Tuple(vec![0, 1]));
        assert_eq!(root(b"\x80\x02K\x01K\x02K\x03\x87."), Node::Tuple(vec![0, 1, 2]));
        assert_eq!(root(b"\x80\x02(K\x01K\x02K\x03K\x04t."), Node::Tuple(vec![0, 1, 2, 3]));
    }

    #[test]
    fn lists_dicts_and_memo() {
        // [1, [1]] with the inner list memoized and fetched again: l = [1]; [l, l]
        let p = parse(b"\x80\x02](]q\x00K\x01ah\x00e.").unwrap();
        let Node::List(items) = p.root() else { panic!() };
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], items[1]);
        assert_eq!(p.node(items[0]), &Node::List(vec![2]));
        // {'a': 1, 'b': 'a'} using SETITEM, SETITEMS, BINPUT, LONG_BINPUT, BINGET, LONG_BINGET.
        let p = parse(b"\x80\x02}X\x01\x00\x00\x00aq\x05K\x01s(X\x01\x00\x00\x00br\x06\x00\x00\x00j\x05\x00\x00\x00u.")
            .unwrap();
        let Node::Dict(items) = p.root() else { panic!() };
        let pairs: Vec<_> = items.iter().map(|&(k, v)| (p.node(k), p.node(v))).collect();
        assert_eq!(pairs[0], (&Node::Str("a"), &Node::Int(1)));
        assert_eq!(pairs[1], (&Node::Str("b"), &Node::Str("a")));
        // A list containing itself: l = []; l.append(l). Nothing recurses, so this is fine.
        let p = parse(b"\x80\x02]q\x00h\x00a.").unwrap();
        assert_eq!(p.root(), &Node::List(vec![0]));
    }

    #[test]
    fn trailing_bytes_after_stop_are_ignored() {
        assert_eq!(root(b"\x80\x02K\x01.garbage"), Node::Int(1));
    }

    #[test]
    fn numpy_labels_name_the_opcode_and_the_fix() {
        // pickle.dumps((b'x', np.int64(3)), protocol=4), cut after the STACK_GLOBAL.
        let data = b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00C\x01x\x94\x8c\x16numpy._core.multiarray\x94\x8c\x06scalar\x94\x93\x94";
        let err = parse(data).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("STACK_GLOBAL"), "{msg}");
        assert!(msg.contains("numpy._core.multiarray.scalar"), "{msg}");
        assert!(msg.contains("int(label)"), "{msg}");
        assert!(msg.contains("--lmdb-layout raw"), "{msg}");
        let err = parse(b"\x80\x02cnumpy\ndtype\n.").unwrap_err();
        assert!(err.to_string().contains("GLOBAL (0x63)"), "{err}");
        let err = parse(b"\x80\x02cos\nsystem\n.").unwrap_err();
        assert!(err.to_string().contains("`os.system`"), "{err}");
    }

    #[test]
    fn unsupported_opcodes_are_named() {
        for (data, name) in [
            (&b"\x80\x02K\x01K\x02b."[..], "BUILD"),
            (b"\x80\x02K\x010.", "POP"),
            (b"\x80\x04\x8f.", "EMPTY_SET"),
            (b"I1\n.", "INT"),
            (b"\x80\x05\x97.", "NEXT_BUFFER"),
            (b"\xff", "unknown"),
        ] {
            let err = parse(data).unwrap_err();
            assert!(matches!(err, PickleError::Unsupported { .. }), "{err:?}");
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn malformed() {
        for data in [
            &b"\x80\x06K\x01."[..],                   // protocol 6
            b"\x80\x02.",                             // STOP on an empty stack
            b"\x80\x02a.",                            // APPEND on an empty stack
            b"\x80\x02K\x01K\x02a.",                  // APPEND to an int
            b"\x80\x02}K\x01s.",                      // SETITEM missing a value
            b"\x80\x02}(K\x01u.",                     // SETITEMS odd
            b"\x80\x02t.",                            // TUPLE without MARK
            b"\x80\x02h\x00.",                        // BINGET of a missing key
            b"\x80\x02\x94.",                         // MEMOIZE on an empty stack
            b"\x80\x02K\x01(\x85.",                   // TUPLE1 reaching below a MARK
            b"\x80\x02K\x01K\x01R.",                  // REDUCE of an int
            b"\x80\x02c_codecs\nencode\nK\x01\x85R.", // encode(1)
            b"\x80\x04K\x01K\x02\x93.",               // STACK_GLOBAL of ints
        ] {
            match parse(data) {
                Err(PickleError::Invalid { .. }) => {}
                other => panic!("{data:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        for data in [TUPLE_P2, TUPLE_P3, TUPLE_P4, DICT_P5] {
            for n in 0..data.len() {
                match parse(&data[..n]) {
                    Err(PickleError::Truncated { .. }) => {}
                    other => panic!("prefix {n} of {data:?}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn hostile_lengths_are_checked_before_use() {
        for data in [
            &b"\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\xffab."[..],
            b"\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x80ab.",
            b"\x80\x05\x96\xff\xff\xff\xff\xff\xff\xff\x7fab.",
            b"\x80\x03B\xff\xff\xff\xffab.",
            b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xffK\x01.",
            b"\x80\x02\x8a\xffab.",
            b"\x80\x02cnumpy",
        ] {
            assert!(matches!(parse(data), Err(PickleError::Truncated { .. })), "{data:?}");
        }
    }

    #[test]
    fn depth_and_size_bombs_hit_limits() {
        let marks = [b'('; 100_000];
        assert!(matches!(parse(&marks), Err(PickleError::Limit { .. })));
        let lists = vec![b']'; 200_000];
        assert!(matches!(parse(&lists), Err(PickleError::Limit { .. })));
        // Many BINGETs of one value: the stack is capped even though the arena does not grow.
        let mut gets = b"\x80\x02K\x01q\x00".to_vec();
        gets.extend(std::iter::repeat_n(*b"h\x00", 100_000).flatten());
        assert!(matches!(parse(&gets), Err(PickleError::Limit { .. })));
        // Deeply nested lists built without marks: [[[...]]] is fine and does not recurse.
        let mut nested = b"\x80\x02".to_vec();
        nested.extend(std::iter::repeat_n(b']', 30_000));
        nested.extend(std::iter::repeat_n(b'a', 29_999));
        nested.push(b'.');
        assert!(parse(&nested).is_ok());
    }

    #[test]
    fn latin1_round_trip() {
        let mut out = Vec::new();
        let all: String = (0u8..=255).map(char::from).collect();
        latin1_to_bytes(&all, &mut out).unwrap();
        assert_eq!(out, (0u8..=255).collect::<Vec<_>>());
        assert_eq!(latin1_to_bytes("a\u{100}", &mut out), Err('\u{100}'));
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Pickle::parse(&data, RECORD_LIMITS);
        }

        #[test]
        fn never_panics_on_mutated_pickles(
            base in prop::sample::select(vec![TUPLE_P2, TUPLE_P3, TUPLE_P4, DICT_P5]),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        ) {
            let mut data = base.to_vec();
            for (at, byte) in edits {
                let n = data.len();
                data[at % n] = byte;
            }
            let _ = Pickle::parse(&data, RECORD_LIMITS);
        }

        #[test]
        fn opcode_soup_never_panics(
            ops in proptest::collection::vec(prop::sample::select(
                b"()t]ae}su\x85\x86\x87NK\x88\x89\x94hqRc\x93.C\x8c".to_vec()), 0..64),
        ) {
            let mut data = b"\x80\x04".to_vec();
            data.extend(ops);
            let _ = Pickle::parse(&data, RECORD_LIMITS);
        }
    }
}
