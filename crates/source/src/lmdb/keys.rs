//! The table of sample keys, collected once at open.
//!
//! An LMDB has no index from a position to a key, so [`LmdbSource`](super::LmdbSource) walks the
//! database once at open and records every sample key, in LMDB's (bytewise) key order. That walk
//! makes opening O(keys); packed shards, which carry their own index, open in O(1).
//!
//! The keys live in one byte heap plus an end offset per key (no `Vec<Vec<u8>>`), so a table of a
//! million 20-byte keys costs about 28 MB rather than 52 MB, in two allocations.

/// Whether `key` is a metadata key such as `__keys__`, `__len__` or `__labels__` (of the form
/// `__*__`), which is never a sample.
pub(super) fn is_metadata(key: &[u8]) -> bool {
    key.len() >= 4 && key.starts_with(b"__") && key.ends_with(b"__")
}

/// Sample keys, indexed by sample position.
#[derive(Debug, Default)]
pub(super) struct KeyTable {
    /// Every key, back to back.
    heap: Vec<u8>,
    /// `ends[i]` is the end of key `i` in `heap`; key `i` starts at `ends[i - 1]` (or 0).
    ends: Vec<u64>,
}

impl KeyTable {
    pub(super) fn with_capacity(keys: usize) -> Self {
        KeyTable {
            heap: Vec::new(),
            ends: Vec::with_capacity(keys),
        }
    }

    pub(super) fn push(&mut self, key: &[u8]) {
        self.heap.extend_from_slice(key);
        self.ends.push(self.heap.len() as u64);
    }

    /// Releases the slack left by growing.
    pub(super) fn shrink_to_fit(&mut self) {
        self.heap.shrink_to_fit();
        self.ends.shrink_to_fit();
    }

    pub(super) fn len(&self) -> u64 {
        self.ends.len() as u64
    }

    /// Key of sample `index`, or `None` past the end.
    pub(super) fn get(&self, index: u64) -> Option<&[u8]> {
        let i = usize::try_from(index).ok()?;
        let end = *self.ends.get(i)?;
        let start = match i.checked_sub(1) {
            Some(prev) => self.ends[prev],
            None => 0,
        };
        self.heap.get(start as usize..end as usize)
    }

    /// Every key, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_keys() {
        for key in [&b"__keys__"[..], b"__len__", b"__labels__", b"____"] {
            assert!(is_metadata(key), "{key:?}");
        }
        for key in [&b"__"[..], b"___", b"_a_", b"__a", b"a__", b"00001", b"", b"__x_"] {
            assert!(!is_metadata(key), "{key:?}");
        }
    }

    #[test]
    fn table_round_trip() {
        let keys: [&[u8]; 4] = [b"a", b"", b"bcd", b"\xff\x00"];
        let mut table = KeyTable::with_capacity(2);
        for k in keys {
            table.push(k);
        }
        table.shrink_to_fit();
        assert_eq!(table.len(), 4);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(table.get(i as u64), Some(*k));
        }
        assert_eq!(table.get(4), None);
        assert_eq!(table.get(u64::MAX), None);
        assert_eq!(table.iter().collect::<Vec<_>>(), keys);
    }
}
