//! The crate's one integration-test binary; each module tests one part against real inputs.

mod lmdb;
