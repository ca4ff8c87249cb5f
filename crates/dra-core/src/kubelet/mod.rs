//! The kubelet side: the sockets kubelet dials and the gRPC services on them.
//!
//! Owns plugin registration and the DRA plugin service in both API versions
//! ([`plugin`]), the `:authority` rewrite kubelet's gRPC client needs
//! ([`authority`]), per-connection limits ([`connection`]), the generated
//! protocol code ([`proto`]), the device health stream ([`health`]) and the
//! liveness self-check over those same sockets ([`self_check`]).
//!
//! It serves calls by handing them to `prepare`: it imports from `prepare`
//! and `scan` only, never from `publish` or `daemon`.

pub(crate) mod authority;
pub(crate) mod connection;
pub(crate) mod health;
pub(crate) mod plugin;
pub(crate) mod proto;
pub(crate) mod self_check;
