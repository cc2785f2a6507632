//! The `gpu_ops` ring field (ring.md, "`gpu_ops`"; control 1.8): the per-image steps a client
//! runs on a GPU sample after its geometry. Plain data: what a record holds, not how a step is
//! drawn (`ringfeed_ops::steps` lowers ops to these) nor how it is applied (the client's kernels).

/// int32 values per record: `[kind, arg, p0, ..., p13]`.
pub const RECORD_INTS: usize = 16;
/// Bytes per record.
pub const RECORD_BYTES: usize = RECORD_INTS * 4;
/// `float32` parameters per record.
pub const PARAMS: usize = RECORD_INTS - 2;
/// The most steps a sample of a view may draw (the field's `S`).
pub const MAX_STEPS: u32 = 64;

/// A step's kind (ring.md, the `gpu_ops` table). Code 0 ends a sample's steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Kind {
    Remap = 1,
    Blend = 2,
    Hue = 3,
    Grayscale = 4,
    Solarize = 5,
    Posterize = 6,
    Invert = 7,
    Autocontrast = 8,
    Equalize = 9,
    Sharpness = 10,
    Blur = 11,
    Affine = 12,
}

impl Kind {
    /// Every kind, in code order.
    pub const ALL: [Kind; 12] = [
        Kind::Remap,
        Kind::Blend,
        Kind::Hue,
        Kind::Grayscale,
        Kind::Solarize,
        Kind::Posterize,
        Kind::Invert,
        Kind::Autocontrast,
        Kind::Equalize,
        Kind::Sharpness,
        Kind::Blur,
        Kind::Affine,
    ];

    /// The record's `kind` value.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The kind of code `code`; `None` for 0 (the end) and unknown codes.
    pub fn from_code(code: i32) -> Option<Kind> {
        Kind::ALL.get(usize::try_from(code).ok()?.checked_sub(1)?).copied()
    }

    /// The name ring.md gives it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Remap => "remap",
            Kind::Blend => "blend",
            Kind::Hue => "hue",
            Kind::Grayscale => "grayscale",
            Kind::Solarize => "solarize",
            Kind::Posterize => "posterize",
            Kind::Invert => "invert",
            Kind::Autocontrast => "autocontrast",
            Kind::Equalize => "equalize",
            Kind::Sharpness => "sharpness",
            Kind::Blur => "blur",
            Kind::Affine => "affine",
        }
    }
}

/// `blend`'s `arg`: what the image is blended with.
pub mod blend {
    /// Black (`s` is 0).
    pub const BRIGHTNESS: i32 = 0;
    /// The image's mean grey.
    pub const CONTRAST: i32 = 1;
    /// The pixel's grey.
    pub const SATURATION: i32 = 2;
}

/// `affine`'s `arg`: the sampling.
pub mod affine {
    pub const NEAREST: i32 = 0;
    pub const BILINEAR: i32 = 1;
}

/// One step: its kind, integer argument and parameters (unused ones 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    pub kind: Kind,
    pub arg: i32,
    pub params: [f32; PARAMS],
}

impl Record {
    /// A record of `kind` with `arg` and the leading `params` (the rest 0).
    pub fn new(kind: Kind, arg: i32, params: &[f32]) -> Record {
        assert!(
            params.len() <= PARAMS,
            "{} takes at most {PARAMS} parameters",
            kind.name()
        );
        let mut p = [0.0; PARAMS];
        p[..params.len()].copy_from_slice(params);
        Record { kind, arg, params: p }
    }

    /// The record's int32 values (parameters as their bit patterns).
    pub fn to_ints(&self) -> [i32; RECORD_INTS] {
        let mut out = [0i32; RECORD_INTS];
        out[0] = self.kind.code();
        out[1] = self.arg;
        for (o, p) in out[2..].iter_mut().zip(self.params) {
            *o = p.to_bits() as i32;
        }
        out
    }

    /// The record's bytes, little-endian, as the slot holds them.
    pub fn to_le_bytes(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        for (k, v) in self.to_ints().iter().enumerate() {
            b[4 * k..4 * k + 4].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// The record of `ints`: `Ok(None)` for an end record (kind 0), `Err(code)` for an unknown kind.
    pub fn from_ints(ints: &[i32; RECORD_INTS]) -> Result<Option<Record>, i32> {
        if ints[0] == 0 {
            return Ok(None);
        }
        let kind = Kind::from_code(ints[0]).ok_or(ints[0])?;
        let mut params = [0.0; PARAMS];
        for (p, v) in params.iter_mut().zip(&ints[2..]) {
            *p = f32::from_bits(*v as u32);
        }
        Ok(Some(Record {
            kind,
            arg: ints[1],
            params,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_zero_ends() {
        for k in Kind::ALL {
            assert_eq!(Kind::from_code(k.code()), Some(k));
        }
        assert_eq!(Kind::from_code(0), None);
        assert_eq!(Kind::from_code(13), None);
        assert_eq!(Kind::from_code(-1), None);
        let r = Record::new(Kind::Blur, 5 | 7 << 16, &[0.5, 1.25]);
        assert_eq!(Record::from_ints(&r.to_ints()), Ok(Some(r)));
        assert_eq!(Record::from_ints(&[0; RECORD_INTS]), Ok(None));
        let mut bad = [0; RECORD_INTS];
        bad[0] = 99;
        assert_eq!(Record::from_ints(&bad), Err(99));
        assert_eq!(&r.to_le_bytes()[..4], &11i32.to_le_bytes());
        assert_eq!(&r.to_le_bytes()[8..12], &0.5f32.to_le_bytes());
    }
}
