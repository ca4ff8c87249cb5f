//! Whether a driver's pool is complete in the API: what every testbed waits
//! for after starting a driver, and what the scenarios check after a change.

use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::ListParams;

use crate::testbed::DriverKind;
use local_cluster::error::Result;

/// Polls the ResourceSlices of `kind`'s driver on Node `node_name` every
/// 100 ms until their pool is complete with `expected` devices (`true`) or
/// `timeout` has passed (`false`). `check` runs every round; its error ends
/// the wait (the driver is gone).
pub async fn wait_pool_complete(
    client: &kube::Client,
    node_name: &str,
    kind: DriverKind,
    expected: usize,
    timeout: Duration,
    check: impl FnMut() -> Result<()>,
) -> Result<bool> {
    wait_pool_complete_named(
        client,
        node_name,
        kind.driver_name(),
        expected,
        timeout,
        check,
    )
    .await
}

/// [`wait_pool_complete`] for any driver name (the benchmark's reference driver).
pub async fn wait_pool_complete_named(
    client: &kube::Client,
    node_name: &str,
    driver_name: &str,
    expected: usize,
    timeout: Duration,
    mut check: impl FnMut() -> Result<()>,
) -> Result<bool> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!(
        "spec.nodeName={node_name},spec.driver={driver_name}"
    ));
    let started = Instant::now();
    loop {
        if let Ok(list) = slices.list(&lp).await
            && pool_complete(&list.items) == Some(expected)
        {
            return Ok(true);
        }
        check()?;
        if started.elapsed() > timeout {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Devices in a pool when all `resourceSliceCount` slices of its newest
/// generation are present; `None` while incomplete.
pub fn pool_complete(slices: &[ResourceSlice]) -> Option<usize> {
    let newest = slices.iter().map(|s| s.spec.pool.generation).max()?;
    let current: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.pool.generation == newest)
        .collect();
    let want = current.first()?.spec.pool.resource_slice_count;
    (current.len() as i64 == want).then(|| {
        current
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(generation: i64, count: i64, devices: usize) -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "s"},
            "spec": {
                "driver": "d", "nodeName": "n",
                "pool": {"name": "n", "generation": generation, "resourceSliceCount": count},
                "devices": (0..devices).map(|i| json!({"name": format!("d{i}")})).collect::<Vec<_>>(),
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_pool_is_complete_only_with_every_slice_of_its_newest_generation() {
        assert_eq!(pool_complete(&[]), None);
        assert_eq!(pool_complete(&[slice(1, 1, 32)]), Some(32));
        assert_eq!(pool_complete(&[slice(2, 2, 128)]), None);
        assert_eq!(
            pool_complete(&[slice(2, 2, 128), slice(2, 2, 2)]),
            Some(130)
        );
        assert_eq!(pool_complete(&[slice(1, 1, 5), slice(2, 1, 6)]), Some(6));
    }
}
