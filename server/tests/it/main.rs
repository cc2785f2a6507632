//! The crate's single integration-test binary: one module per area.

mod codec;
