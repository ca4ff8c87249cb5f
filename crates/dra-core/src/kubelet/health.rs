//! The DRA device health service, `v1.DRAResourceHealth` and
//! `v1alpha1.DRAResourceHealth` (both served and advertised: kubelet 1.37
//! prefers `v1`, older kubelets know only `v1alpha1`).
//!
//! The message of an unhealthy device names what failed (its conditions,
//! e.g. `sram-ecc-uncorrected=1 (Fatal)`). Served when the plugin is given a watch channel of device health (the
//! runner always gives it the one [`crate::daemon::rescan`] fills); each change
//! sends kubelet the full list, as the protocol asks.

use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

use crate::kubelet::proto::{health_v1 as v1, health_v1alpha1 as v1alpha1};

pub(crate) use crate::scan::inventory::HealthState;

/// One device's health report.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct DeviceHealthStatus {
    pub pool: String,
    pub device: String,
    pub state: HealthState,
    pub last_updated: SystemTime,
    /// Shown to users by kubelet 1.36+; cut to 1024 characters.
    pub message: String,
    /// How long kubelet waits for the next report before it turns the
    /// device Unknown (kubelet 1.35+); `None` leaves kubelet's default (30 s).
    pub health_check_timeout: Option<Duration>,
}

/// The same conversion and service for each proto package: `v1alpha1`
/// (kubelet 1.34+) and `v1` (kubelet 1.37+) share one schema but are
/// distinct generated types.
macro_rules! health_service {
    ($pb:ident, $to_proto:ident) => {
        fn $to_proto(list: &[DeviceHealthStatus]) -> $pb::NodeWatchResourcesResponse {
            $pb::NodeWatchResourcesResponse {
                devices: list
                    .iter()
                    .map(|d| $pb::DeviceHealth {
                        device: Some($pb::DeviceIdentifier {
                            pool_name: d.pool.clone(),
                            device_name: d.device.clone(),
                        }),
                        health: match d.state {
                            HealthState::Unknown => $pb::HealthStatus::Unknown,
                            HealthState::Healthy => $pb::HealthStatus::Healthy,
                            HealthState::Unhealthy => $pb::HealthStatus::Unhealthy,
                        } as i32,
                        last_updated_time: unix_seconds(d.last_updated),
                        health_check_timeout_seconds: d
                            .health_check_timeout
                            .map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX))
                            .unwrap_or_default(),
                        message: d.message.chars().take(MAX_MESSAGE_CHARS).collect(),
                    })
                    .collect(),
            }
        }

        #[tonic::async_trait]
        impl $pb::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream =
                Pin<Box<dyn Stream<Item = Result<$pb::NodeWatchResourcesResponse, Status>> + Send>>;

            async fn node_watch_resources(
                &self,
                _: Request<$pb::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                let stream = WatchStream::new(self.health.clone()).map(|list| Ok($to_proto(&list)));
                Ok(Response::new(Box::pin(stream)))
            }
        }
    };
}

/// Longest message kubelet accepts.
const MAX_MESSAGE_CHARS: usize = 1024;

fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

health_service!(v1alpha1, to_v1alpha1);
health_service!(v1, to_v1);

/// The service names to advertise in the registration's
/// `supported_versions`, newest first.
pub(crate) const SERVICE_NAMES: &[&str] = &["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];

#[derive(Clone)]
pub(crate) struct HealthService {
    pub(crate) health: watch::Receiver<Vec<DeviceHealthStatus>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn both_packages_carry_the_same_report() {
        let list = vec![DeviceHealthStatus {
            pool: "node-1".into(),
            device: "neuron-device-3".into(),
            state: HealthState::Unhealthy,
            last_updated: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            message: format!("sram-ecc-uncorrected=1 (Fatal){}", "x".repeat(2000)),
            health_check_timeout: Some(Duration::from_secs(30)),
        }];
        let a = to_v1alpha1(&list);
        let b = to_v1(&list);
        let (a, b) = (&a.devices[0], &b.devices[0]);
        assert_eq!(a.health, v1alpha1::HealthStatus::Unhealthy as i32);
        assert_eq!(b.health, v1::HealthStatus::Unhealthy as i32);
        assert_eq!(a.last_updated_time, 1_700_000_000);
        assert_eq!(b.last_updated_time, 1_700_000_000);
        assert_eq!(b.health_check_timeout_seconds, 30);
        assert_eq!(b.message.chars().count(), MAX_MESSAGE_CHARS);
        assert!(b.message.starts_with("sram-ecc-uncorrected=1 (Fatal)"));
        assert_eq!(a.message, b.message);
        let id = b.device.as_ref().unwrap();
        assert_eq!(
            (id.pool_name.as_str(), id.device_name.as_str()),
            ("node-1", "neuron-device-3")
        );
    }
}
