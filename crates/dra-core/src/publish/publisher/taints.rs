//! Dropped-taint detection.
//!
//! An API server whose `DRADeviceTaints` gate is off (1.34, 1.35 by
//! default) drops device `taints` on write without an error. Comparing what
//! the publisher wrote with what it reads back would then find drift after
//! every write, forever. So each write's answer is compared with what was
//! sent: when the taints are gone, the publisher says so once and publishes
//! without taints from then on (health still reaches kubelet's health
//! stream).

use k8s_openapi::api::resource::v1::ResourceSlice;
use prometheus::IntGauge;

use crate::scan::taints::any_tainted;

/// Did the API server drop the taints of `sent` in what it `stored`?
pub(super) fn taints_dropped(sent: &ResourceSlice, stored: &ResourceSlice) -> bool {
    let devices = |s: &ResourceSlice| s.spec.devices.clone().unwrap_or_default();
    any_tainted(&devices(sent)) && !any_tainted(&devices(stored))
}

/// Whether the API server keeps device taints, as far as the writes so far
/// tell: `true` until a write comes back without the taints it sent.
#[derive(Debug)]
pub(super) struct TaintSupport {
    supported: bool,
}

impl Default for TaintSupport {
    fn default() -> Self {
        Self { supported: true }
    }
}

impl TaintSupport {
    /// Publish taints?
    pub(super) fn supported(&self) -> bool {
        self.supported
    }

    /// Takes in a successful round of writes; `dropped`: one of them came
    /// back without its taints. Returns `true` the first time only: the
    /// desired pool must then be computed again, without taints.
    pub(super) fn after_writes(&mut self, dropped: bool, gauge: &IntGauge) -> bool {
        if !(dropped && self.supported) {
            return false;
        }
        self.supported = false;
        tracing::warn!(
            "the API server dropped the device taints we wrote (DRADeviceTaints is off); \
             publishing without taints from now on, health still reaches kubelet"
        );
        gauge.set(1);
        true
    }
}

#[cfg(test)]
mod tests;
