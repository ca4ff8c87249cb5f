//! Claim device status, wired to this process: server-side apply through
//! the API client, and each device's readiness from the health the rescan
//! loop reports to kubelet (a device is ready unless its health is
//! `Unhealthy`: a degraded device still works, an unknown one has not been
//! judged).

use std::sync::Arc;

use futures::StreamExt;
use prometheus::Registry;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

use crate::kubelet::health::{DeviceHealthStatus, HealthState};
use crate::prepare::status::{DeviceReadiness, KubeStatusApi, StatusMetrics, StatusSetup};

/// What the plugin needs to write claim status as `driver_name`.
pub(crate) fn setup(
    client: kube::Client,
    driver_name: &str,
    health: watch::Receiver<Vec<DeviceHealthStatus>>,
    registry: &Registry,
) -> Result<StatusSetup, prometheus::Error> {
    Ok(StatusSetup {
        api: Arc::new(KubeStatusApi::new(client, driver_name)),
        readiness: WatchStream::new(health)
            .map(|list| readiness(&list))
            .boxed(),
        metrics: StatusMetrics::register(registry)?,
    })
}

fn readiness(list: &[DeviceHealthStatus]) -> Vec<DeviceReadiness> {
    list.iter()
        .map(|d| DeviceReadiness {
            pool: d.pool.clone(),
            device: d.device.clone(),
            healthy: d.state != HealthState::Unhealthy,
            message: d.message.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn only_an_unhealthy_device_is_not_ready() {
        let report = |state| DeviceHealthStatus {
            pool: "node".into(),
            device: "d".into(),
            state,
            last_updated: SystemTime::UNIX_EPOCH,
            message: "why".into(),
            health_check_timeout: None,
        };
        let list = [
            report(HealthState::Healthy),
            report(HealthState::Unknown),
            report(HealthState::Unhealthy),
        ];
        let got: Vec<bool> = readiness(&list).iter().map(|r| r.healthy).collect();
        assert_eq!(got, [true, true, false]);
        assert_eq!(readiness(&list)[2].message, "why");
    }
}
