//! TEMPORARY stub of the LMDB API (replaced by the lmdb branch).
#![allow(missing_docs, unreachable_pub, dead_code)]
use super::{SampleReader, Source, SourceError};
use std::path::{Path, PathBuf};
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Auto,
    Raw,
    Pickle,
    Msgpack,
}
impl std::str::FromStr for Layout {
    type Err = String;
    fn from_str(_s: &str) -> Result<Self, String> {
        Ok(Layout::Auto)
    }
}
#[derive(Debug, Clone)]
pub enum LabelSource {
    None,
    Key(Vec<u8>),
    File(PathBuf),
}
#[derive(Debug, Clone)]
pub struct LmdbOptions {
    pub layout: Layout,
    pub labels: LabelSource,
}
impl Default for LmdbOptions {
    fn default() -> Self {
        LmdbOptions {
            layout: Layout::Auto,
            labels: LabelSource::None,
        }
    }
}
#[derive(Debug)]
pub struct LmdbSource;
impl LmdbSource {
    pub fn open(_p: &Path, _o: &LmdbOptions) -> Result<Self, LmdbError> {
        Err(LmdbError::Placeholder)
    }
    pub fn layout(&self) -> Layout {
        Layout::Raw
    }
}
impl Source for LmdbSource {
    fn len(&self) -> u64 {
        0
    }
    fn class_names(&self) -> Vec<Vec<u8>> {
        vec![]
    }
    fn describe(&self) -> String {
        String::new()
    }
    fn reader(&self) -> Result<Box<dyn SampleReader + '_>, SourceError> {
        Err(LmdbError::Placeholder.into())
    }
}
#[derive(Debug, thiserror::Error)]
pub enum LmdbError {
    #[error("placeholder")]
    Placeholder,
}
