//! Everything a DRA node driver needs that is not device-specific.

pub mod cli;
pub mod node;
pub mod ops;
pub mod publish;
