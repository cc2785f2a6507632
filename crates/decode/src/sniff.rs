//! Image formats and their detection by magic bytes.
//!
//! Only the content decides: a PNG named `.jpg` is a PNG. Every signature is checked against
//! the bytes present, so short inputs simply match nothing.

use std::fmt;

/// An image format that [`super::Decoder`] can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// JPEG (JFIF/EXIF/Adobe), decoded with libjpeg-turbo.
    Jpeg,
    /// PNG (first frame of an APNG).
    Png,
    /// GIF (first frame).
    Gif,
    /// Windows BMP.
    Bmp,
    /// TIFF and BigTIFF (first page).
    Tiff,
    /// WebP, lossy or lossless (first frame).
    Webp,
    /// Netpbm: PBM, PGM, PPM (ASCII or binary) and PAM.
    Pnm,
}

impl Format {
    /// The lowercase name used in messages and statistics.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Jpeg => "jpeg",
            Format::Png => "png",
            Format::Gif => "gif",
            Format::Bmp => "bmp",
            Format::Tiff => "tiff",
            Format::Webp => "webp",
            Format::Pnm => "pnm",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The format of `data`, judged by its magic bytes only; `None` if none matches.
pub fn sniff(data: &[u8]) -> Option<Format> {
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
    if data.starts_with(b"\xff\xd8\xff") {
        return Some(Format::Jpeg);
    }
    if data.starts_with(PNG) {
        return Some(Format::Png);
    }
    if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        return Some(Format::Gif);
    }
    if data.starts_with(b"RIFF") && data.get(8..12) == Some(b"WEBP") {
        return Some(Format::Webp);
    }
    // Classic TIFF (magic 42) and BigTIFF (magic 43), both byte orders.
    if data.starts_with(b"II*\0")
        || data.starts_with(b"MM\0*")
        || data.starts_with(b"II+\0")
        || data.starts_with(b"MM\0+")
    {
        return Some(Format::Tiff);
    }
    if data.starts_with(b"BM") {
        return Some(Format::Bmp);
    }
    // Netpbm: "P1".."P7" followed by whitespace (the header is text).
    if let [b'P', b'1'..=b'7', ws, ..] = data
        && ws.is_ascii_whitespace()
    {
        return Some(Format::Pnm);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures() {
        let cases: &[(&[u8], Option<Format>)] = &[
            (b"\xff\xd8\xff\xe0\0\x10JFIF", Some(Format::Jpeg)),
            (b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR", Some(Format::Png)),
            (b"GIF89a\x01\0\x01\0", Some(Format::Gif)),
            (b"GIF87a", Some(Format::Gif)),
            (b"RIFF\x10\0\0\0WEBPVP8 ", Some(Format::Webp)),
            (b"RIFF\x10\0\0\0WAVEfmt ", None),
            (b"II*\0\x08\0\0\0", Some(Format::Tiff)),
            (b"MM\0*\0\0\0\x08", Some(Format::Tiff)),
            (b"II+\0\x08\0\0\0", Some(Format::Tiff)),
            (b"BM\x36\0\0\0", Some(Format::Bmp)),
            (b"P6\n3 2\n255\n", Some(Format::Pnm)),
            (b"P7\nWIDTH 1\n", Some(Format::Pnm)),
            (b"P6", None),
            (b"P8\n", None),
            (b"\xff\xd8", None),
            (b"\x89PNG", None),
            (b"", None),
        ];
        for (data, want) in cases {
            assert_eq!(sniff(data), *want, "{data:?}");
        }
    }

    #[test]
    fn display_is_lowercase() {
        let names: Vec<String> = [
            Format::Jpeg,
            Format::Png,
            Format::Gif,
            Format::Bmp,
            Format::Tiff,
            Format::Webp,
            Format::Pnm,
        ]
        .iter()
        .map(|f| f.to_string())
        .collect();
        assert_eq!(names, ["jpeg", "png", "gif", "bmp", "tiff", "webp", "pnm"]);
    }
}
