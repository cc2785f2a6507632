//! TEMPORARY stub of the codec API (replaced by the codec branch).
#![allow(missing_docs, unreachable_pub, dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Jpeg,
}
impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "jpeg")
    }
}
pub fn sniff(data: &[u8]) -> Option<Format> {
    data.starts_with(&[0xff, 0xd8]).then_some(Format::Jpeg)
}
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_pixels: u64,
}
impl Default for Limits {
    fn default() -> Self {
        Limits { max_pixels: 89_478_485 }
    }
}
#[derive(Debug, Clone, Copy)]
pub enum ColorKind {
    Rgb,
}
#[derive(Debug, Clone, Copy)]
pub struct ImageInfo {
    pub format: Format,
    pub width: u32,
    pub height: u32,
    pub color: ColorKind,
    pub bits_per_channel: u8,
    pub orientation: u8,
    pub progressive: bool,
}
#[derive(Debug, Clone, Copy)]
pub struct Reencode {
    pub max_side: u32,
    pub quality: u8,
}
#[derive(Debug)]
pub struct Decoded;
#[derive(Debug)]
pub struct Decoder;
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("stub")]
    Stub,
}
impl Decoder {
    pub fn new(_l: Limits) -> Result<Self, CodecError> {
        Ok(Decoder)
    }
    pub fn probe(&mut self, _d: &[u8]) -> Result<ImageInfo, CodecError> {
        Err(CodecError::Stub)
    }
    pub fn decode_rgb8(&mut self, _d: &[u8], _o: &mut Vec<u8>) -> Result<Decoded, CodecError> {
        Err(CodecError::Stub)
    }
    pub fn reencode_jpeg(&mut self, _d: &[u8], _r: &Reencode, _o: &mut Vec<u8>) -> Result<Decoded, CodecError> {
        Err(CodecError::Stub)
    }
}
