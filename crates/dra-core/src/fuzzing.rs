//! Fuzz entry points, behind the `fuzzing` feature (the fuzz crate at
//! `fuzz/`, `cargo xtask fuzz`): the byte parsers that face other processes.
//! Each item is declared `pub` where it lives, marked
//! `cfg_attr(not(any(feature = "testing", feature = "fuzzing")),
//! allow(unreachable_pub))`: without these features it is reachable from
//! nowhere outside the crate.

pub use crate::kubelet::authority::{
    AdapterError, Frame, InboundStream, MAX_IN_FRAME, PREFACE, Rewrite, parse_frame,
};
pub use crate::prepare::checkpoint::{Checkpoint, CheckpointError, CheckpointStore, PreparedClaim};
pub use crate::prepare::metrics::PluginMetrics;
pub use crate::scan::uevent::{Uevent, UeventError};
