//! `ring.dataset_id` (control.md 1.6, "Dataset identity"): a fingerprint of what a stream serves,
//! so that a client refuses to resume a state saved on another dataset.
//!
//! It is the 64-bit FNV-1a hash of a description of the data as the stream indexes it: its
//! length, class names and shard sizes, and for a token stream each dataset's tokens, documents,
//! windows and weight, with the window shape. Equal for the same data indexed the same way (packed
//! or listed again, at another path or on another machine); another dataset, split or mix gives
//! another one. It is not a checksum of the bytes: only what the description holds is compared.

/// The description being hashed, field by field (every integer little-endian).
#[derive(Debug, Clone, Copy)]
pub struct DatasetId {
    hash: u64,
}

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

impl Default for DatasetId {
    fn default() -> Self {
        Self::new()
    }
}

impl DatasetId {
    /// A description that starts with the prefix `ringfeed-dataset` and a NUL.
    pub fn new() -> Self {
        let mut id = DatasetId { hash: OFFSET };
        id.bytes(b"ringfeed-dataset\0");
        id
    }

    /// Appends raw bytes.
    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        for &b in bytes {
            self.hash = (self.hash ^ u64::from(b)).wrapping_mul(PRIME);
        }
        self
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes(&[v])
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// The part every source has: its length, its class names (a `u32` count, then each as a
    /// `u32` length and its bytes) and its shard sizes (a `u32` count, 0 without shard files,
    /// then each as a `u64`).
    pub fn samples(&mut self, len: u64, classes: &[Vec<u8>], shards: Option<&[u64]>) -> &mut Self {
        self.u64(len).u32(classes.len() as u32);
        for c in classes {
            self.u32(c.len() as u32).bytes(c);
        }
        let shards = shards.unwrap_or(&[]);
        self.u32(shards.len() as u32);
        for &s in shards {
            self.u64(s);
        }
        self
    }

    /// The id as `ring` carries it: 16 lowercase hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_64_of_the_spec() {
        // FNV-1a 64 of "" and of "a" (the published test values), through the same arithmetic.
        let mut h = DatasetId { hash: OFFSET };
        assert_eq!(h.hex(), "cbf29ce484222325");
        h.bytes(b"a");
        assert_eq!(h.hex(), "af63dc4c8601ec8c");
    }
}
