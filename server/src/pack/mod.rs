//! The offline packer (placeholder).
