//! Frames: `u32` little-endian length (1..=65536), then that many bytes of a UTF-8 JSON object
//! with a string member `type` (control.md, "Framing").

use serde::Serialize;
use serde_json::Value;

/// Largest payload a frame may carry.
pub const MAX_FRAME: usize = 65536;

/// Why bytes are not a valid frame. Every variant is a protocol error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame length {0} is outside 1..=65536")]
    Length(u64),
    #[error("frame is not valid UTF-8 JSON: {0}")]
    Json(String),
    #[error("frame is a JSON {0}, not an object")]
    NotObject(&'static str),
    #[error("frame has no string member `type`")]
    NoType,
}

/// Encodes `msg` as a frame: compact JSON with members sorted by name, after the length.
pub fn encode_frame<T: Serialize>(msg: &T) -> Vec<u8> {
    // Through `Value`, whose maps are ordered by key, so both languages produce the same bytes.
    let value = serde_json::to_value(msg).expect("protocol messages always serialize");
    let body = serde_json::to_vec(&value).expect("a JSON value always serializes");
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Checks a frame's length prefix; returns the payload length.
pub fn check_length(prefix: [u8; 4]) -> Result<usize, FrameError> {
    let n = u32::from_le_bytes(prefix) as usize;
    if n == 0 || n > MAX_FRAME {
        return Err(FrameError::Length(n as u64));
    }
    Ok(n)
}

/// Decodes a payload (the bytes after the length) into a JSON object with a string `type`.
pub fn decode_frame(payload: &[u8]) -> Result<(String, Value), FrameError> {
    if payload.is_empty() || payload.len() > MAX_FRAME {
        return Err(FrameError::Length(payload.len() as u64));
    }
    let value: Value = serde_json::from_slice(payload).map_err(|e| FrameError::Json(e.to_string()))?;
    let kind = match &value {
        Value::Object(m) => match m.get("type") {
            Some(Value::String(t)) => t.clone(),
            _ => return Err(FrameError::NoType),
        },
        Value::Array(_) => return Err(FrameError::NotObject("array")),
        Value::String(_) => return Err(FrameError::NotObject("string")),
        Value::Number(_) => return Err(FrameError::NotObject("number")),
        Value::Bool(_) => return Err(FrameError::NotObject("boolean")),
        Value::Null => return Err(FrameError::NotObject("null")),
    };
    Ok((kind, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_sorted_and_compact() {
        let f = encode_frame(&serde_json::json!({"type": "ready", "slot": 2, "run": 1, "seq": 7}));
        assert_eq!(&f[4..], br#"{"run":1,"seq":7,"slot":2,"type":"ready"}"#);
        assert_eq!(u32::from_le_bytes(f[..4].try_into().unwrap()) as usize, f.len() - 4);
    }

    #[test]
    fn rejections() {
        assert_eq!(check_length([0; 4]), Err(FrameError::Length(0)));
        assert_eq!(check_length(65537u32.to_le_bytes()), Err(FrameError::Length(65537)));
        assert!(matches!(decode_frame(b"[1]"), Err(FrameError::NotObject("array"))));
        assert!(matches!(decode_frame(br#"{"type":3}"#), Err(FrameError::NoType)));
        assert!(matches!(decode_frame(b"\xff"), Err(FrameError::Json(_))));
    }
}
