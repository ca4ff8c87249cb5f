//! The DRA device health service (`v1alpha1.DRAResourceHealth`).
//!
//! Served when the plugin is given a watch channel of device health (the
//! runner always gives it the one [`crate::rescan`] fills); each change
//! sends kubelet the full list, as the protocol asks.

use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

use crate::proto::health_v1alpha1 as pb;

/// Health of one device as the driver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    Unknown,
    Healthy,
    Unhealthy,
}

/// One device's health report.
#[derive(Debug, Clone, PartialEq, Eq)]
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

fn to_proto(list: &[DeviceHealthStatus]) -> pb::NodeWatchResourcesResponse {
    pb::NodeWatchResourcesResponse {
        devices: list
            .iter()
            .map(|d| pb::DeviceHealth {
                device: Some(pb::DeviceIdentifier {
                    pool_name: d.pool.clone(),
                    device_name: d.device.clone(),
                }),
                health: match d.state {
                    HealthState::Unknown => pb::HealthStatus::Unknown,
                    HealthState::Healthy => pb::HealthStatus::Healthy,
                    HealthState::Unhealthy => pb::HealthStatus::Unhealthy,
                } as i32,
                last_updated_time: d
                    .last_updated
                    .duration_since(UNIX_EPOCH)
                    .map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX))
                    .unwrap_or_default(),
                health_check_timeout_seconds: d
                    .health_check_timeout
                    .map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX))
                    .unwrap_or_default(),
                message: d.message.chars().take(1024).collect(),
            })
            .collect(),
    }
}

pub(crate) struct HealthService {
    pub(crate) health: watch::Receiver<Vec<DeviceHealthStatus>>,
}

type HealthStream =
    Pin<Box<dyn Stream<Item = Result<pb::NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _: Request<pb::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let stream = WatchStream::new(self.health.clone()).map(|list| Ok(to_proto(&list)));
        Ok(Response::new(Box::pin(stream)))
    }
}
