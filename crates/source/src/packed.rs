//! A packed dataset (`proto/shard.md`) as a [`Source`].
//!
//! Everything is mapped at open; `get` is two bounds-checked table reads and, unless disabled, a
//! CRC-32C of the record (about 10 µs for a 100 KiB JPEG, under 1 % of its decode).
//!
//! A file truncated or rewritten after it was opened is reported, never served: the SIGBUS such a
//! file raises is caught ([`ringfeed_format::fault`]) and every read checks the mappings' fault marks after
//! the bytes were used ([`Dataset::check_faults`]); the record CRC catches same-length rewrites.

use std::path::Path;

use super::{Sample, SampleReader, Source, SourceError};
use ringfeed_format::shard::{Dataset, PackedSample, ShardError};
use ringfeed_format::targets::TargetsFile;

/// A packed dataset opened for reading.
#[derive(Debug)]
pub struct PackedSource {
    dataset: Dataset,
    check_crc: bool,
    /// 1.10: the dataset's `targets.rft`, when it was packed with targets.
    targets: Option<TargetsFile>,
}

impl PackedSource {
    /// Opens the dataset in `dir`. With `check_crc`, every read checks the record's CRC-32C.
    pub fn open(dir: &Path, check_crc: bool) -> Result<Self, ShardError> {
        ringfeed_format::fault::install().map_err(|e| ShardError::io(dir, e))?;
        let dataset = Dataset::open(dir)?;
        let targets = TargetsFile::open_in(dir)?;
        if let Some(t) = &targets
            && t.len() != dataset.len()
        {
            return Err(ShardError::corrupt(
                t.path(),
                16,
                format!(
                    "the file has targets for {} samples, the index has {}; re-pack the dataset",
                    t.len(),
                    dataset.len()
                ),
            ));
        }
        Ok(PackedSource {
            dataset,
            check_crc,
            targets,
        })
    }

    /// The underlying dataset.
    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }
}

impl Source for PackedSource {
    fn len(&self) -> u64 {
        self.dataset.len()
    }

    fn class_names(&self) -> Vec<Vec<u8>> {
        (0..self.dataset.class_count())
            .map(|c| {
                self.dataset
                    .class_name(c)
                    .expect("class names are bounds-checked by Dataset::open")
                    .to_vec()
            })
            .collect()
    }

    fn stored_targets(&self) -> Option<&TargetsFile> {
        self.targets.as_ref()
    }

    fn describe(&self) -> String {
        format!(
            "packed dataset {} ({} samples)",
            self.dataset.dir().display(),
            self.dataset.len()
        )
    }

    fn reader(&self) -> Result<Box<dyn SampleReader + '_>, SourceError> {
        Ok(Box::new(PackedReader { source: self }))
    }

    fn shard_sizes(&self) -> Option<Vec<u64>> {
        // Runs of consecutive samples stored in one shard file. `pack` writes samples in shard
        // order, so these are the shard files; a dataset that interleaves them still gets a
        // correct (if less local) order.
        let ds = &self.dataset;
        let mut sizes: Vec<u64> = Vec::new();
        let mut current = None;
        for i in 0..ds.len() {
            let shard = ds.sample(i).ok().map(|s| s.shard);
            match sizes.last_mut() {
                Some(n) if shard == current => *n += 1,
                _ => sizes.push(1),
            }
            current = shard;
        }
        Some(sizes)
    }

    fn with_sample(&self, index: u64, f: &mut dyn FnMut(Sample<'_>)) -> Result<(), SourceError> {
        let s = self.lookup(index)?;
        f(Sample {
            index,
            key: s.key,
            label: s.label,
            data: s.data,
        });
        // The decoder may have read zeros where the file was cut: say so instead of its result.
        self.dataset.check_faults(index, Some(&s))?;
        Ok(())
    }
}

impl PackedSource {
    /// Sample `index`, with its CRC checked if asked, from files that have not faulted so far.
    fn lookup(&self, index: u64) -> Result<PackedSample<'_>, SourceError> {
        let ds = &self.dataset;
        let got = if self.check_crc {
            ds.sample_checked(index)
        } else {
            ds.sample(index)
        };
        // A fault during the lookup or the CRC reads zeros: report the fault, not what the zeros
        // look like (a bad record entry, a checksum mismatch).
        ds.check_faults(index, got.as_ref().ok())?;
        Ok(got?)
    }

    fn sample(&self, index: u64) -> Result<Sample<'_>, SourceError> {
        let s = self.lookup(index)?;
        Ok(Sample {
            index,
            key: s.key,
            label: s.label,
            data: s.data,
        })
    }
}

/// Readers of a packed dataset hold no state: the maps are shared and immutable.
struct PackedReader<'a> {
    source: &'a PackedSource,
}

impl SampleReader for PackedReader<'_> {
    fn get(&mut self, index: u64) -> Result<Sample<'_>, SourceError> {
        self.source.sample(index)
    }
}
