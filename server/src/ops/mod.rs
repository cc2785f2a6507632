//! TEMPORARY stand-in for the transforms module (replaced by the `ops` branch): same API, a
//! nearest-neighbour resize of the whole image, so the serving path can be exercised.
#![allow(missing_docs, dead_code)]

use crate::codec::{CodecError, Decoder, Limits};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Nhwc,
    Nchw,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Transform {
    RandomResizedCrop {
        size: (u32, u32),
        scale: (f64, f64),
        ratio: (f64, f64),
        flip: f64,
    },
    CenterCrop {
        size: (u32, u32),
        resize: u32,
    },
    Resize {
        size: (u32, u32),
    },
}

impl Transform {
    pub fn validate(&self) -> Result<(), String> {
        Ok(())
    }
    pub fn output_size(&self) -> (u32, u32) {
        match self {
            Transform::RandomResizedCrop { size, .. }
            | Transform::CenterCrop { size, .. }
            | Transform::Resize { size } => *size,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SampleRng(u64);

impl SampleRng {
    pub fn new(seed: u64, epoch: u64, index: u64) -> Self {
        SampleRng(seed ^ epoch.rotate_left(17) ^ index.rotate_left(34))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Crop {
    pub top: u32,
    pub left: u32,
    pub height: u32,
    pub width: u32,
    pub flipped: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("output buffer has {got} bytes, expected {expected}")]
    Output { got: usize, expected: usize },
}

#[derive(Debug)]
pub struct Processor {
    decoder: Decoder,
    scratch: Vec<u8>,
}

impl Processor {
    pub fn new(limits: Limits) -> Result<Self, CodecError> {
        Ok(Processor {
            decoder: Decoder::new(limits)?,
            scratch: Vec::new(),
        })
    }

    pub fn process(
        &mut self,
        data: &[u8],
        t: &Transform,
        _rng: &mut SampleRng,
        layout: Layout,
        out: &mut [u8],
    ) -> Result<Crop, OpError> {
        let (h, w) = t.output_size();
        let (h, w) = (h as usize, w as usize);
        if out.len() != h * w * 3 {
            return Err(OpError::Output {
                got: out.len(),
                expected: h * w * 3,
            });
        }
        let d = self.decoder.decode_rgb8(data, &mut self.scratch)?;
        let (sw, sh) = (d.width as usize, d.height as usize);
        for y in 0..h {
            for x in 0..w {
                let (sy, sx) = (y * sh / h, x * sw / w);
                for c in 0..3 {
                    let v = self.scratch[(sy * sw + sx) * 3 + c];
                    match layout {
                        Layout::Nhwc => out[(y * w + x) * 3 + c] = v,
                        Layout::Nchw => out[c * h * w + y * w + x] = v,
                    }
                }
            }
        }
        Ok(Crop {
            top: 0,
            left: 0,
            height: sh as u32,
            width: sw as u32,
            flipped: false,
        })
    }
}
