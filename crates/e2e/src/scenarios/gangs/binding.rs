//! Watching a gang from the API: creating a PodGroup and its pods, waiting
//! for them to bind, checking a refusal (unschedulable, nothing bound,
//! nothing allocated), and removing pods that no kubelet serves. Shared by
//! the shadow phases of scenario 33.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ResourceExt,
};
use serde_json::Value;

use super::super::kit;
use crate::testbed::Testbed;

pub const ID_2: &str = "neuron.amazonaws.com/ultraserver-server-id-2";
pub const ID_4: &str = "neuron.amazonaws.com/ultraserver-server-id-4";
/// A gang that fits binds within this (the scheduler, no kubelet).
pub const BIND: Duration = Duration::from_secs(120);
/// A gang that does not fit is reported unschedulable within this.
const REFUSED: Duration = Duration::from_secs(90);
/// After the refusal: nothing may bind or be allocated in this time either.
const STILL: Duration = Duration::from_secs(5);
pub const GONE: Duration = Duration::from_secs(60);

pub fn pod_groups(tb: &impl Testbed, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("scheduling.k8s.io", "v1beta1", "PodGroup");
    Api::namespaced_with(tb.client(), ns, &ApiResource::from_gvk(&gvk))
}

/// The gangs of one namespace.
pub struct Gangs<'a, T: Testbed> {
    pub tb: &'a T,
    pub ns: &'a str,
}

impl<T: Testbed> Gangs<'_, T> {
    /// Creates the PodGroup `group`, then its `pods`; returns the pod names.
    pub async fn start(&self, group: Value, pods: Vec<Value>) -> Result<Vec<String>> {
        let names = pods
            .iter()
            .map(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        kit::apply_all(self.tb, self.ns, &[group]).await?;
        kit::apply_all(self.tb, self.ns, &pods).await?;
        Ok(names)
    }

    /// Waits until every pod of `pods` is bound; pod → node.
    pub async fn bound(
        &self,
        pods: &[String],
        timeout: Duration,
    ) -> Result<BTreeMap<String, String>> {
        let api: Api<Pod> = Api::namespaced(self.tb.client(), self.ns);
        let started = Instant::now();
        let out = kit::wait_for(self.tb, &format!("{pods:?} bound"), timeout, || async {
            let mut out = BTreeMap::new();
            for p in pods {
                let node = (api.get(p).await?.spec).and_then(|s| s.node_name);
                let Some(node) = node else { return Ok(None) };
                out.insert(p.clone(), node);
            }
            Ok(Some(out))
        })
        .await?;
        eprintln!(
            "aws-dra-e2e: {pods:?} bound in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        Ok(out)
    }

    /// The gang's pods are reported unschedulable, and for a while after,
    /// none is bound and none of their claims (`claims_each` per pod) is
    /// allocated. Returns the scheduler's reason and message.
    pub async fn refused(&self, pods: &[String], claims_each: usize) -> Result<String> {
        let api: Api<Pod> = Api::namespaced(self.tb.client(), self.ns);
        let started = Instant::now();
        let why = kit::wait_for(
            self.tb,
            &format!("{pods:?} unschedulable"),
            REFUSED,
            || async {
                let mut why = None;
                for p in pods {
                    let pod = api.get(p).await?;
                    match kit::unschedulable(&pod) {
                        Some((reason, message)) => why = Some(format!("{reason}: {message}")),
                        None => return Ok(None),
                    }
                }
                Ok(why)
            },
        )
        .await?;
        tokio::time::sleep(STILL).await;
        let bound: Vec<String> = self.bound_now(pods).await?;
        let allocated = self.allocated_claims(pods, claims_each).await?;
        ensure!(
            bound.is_empty() && allocated.is_empty(),
            "a gang that does not fit: pods bound {bound:?}, claims allocated {allocated:?}"
        );
        eprintln!(
            "aws-dra-e2e: {pods:?} unschedulable after {:.1}s, none bound and none of their {} \
             claims allocated {}s later; the scheduler said {why:?}",
            started.elapsed().as_secs_f64() - STILL.as_secs_f64(),
            pods.len() * claims_each,
            STILL.as_secs()
        );
        Ok(why)
    }

    async fn bound_now(&self, pods: &[String]) -> Result<Vec<String>> {
        let api: Api<Pod> = Api::namespaced(self.tb.client(), self.ns);
        let mut out = Vec::new();
        for p in pods {
            if let Some(node) = (api.get(p).await?.spec).and_then(|s| s.node_name) {
                out.push(format!("{p} on {node}"));
            }
        }
        Ok(out)
    }

    /// Allocated claims owned by any of `pods`, which must own
    /// `claims_each` claims each (every claim of the namespace is read, so
    /// a claim generated late is seen too).
    pub async fn allocated_claims(
        &self,
        pods: &[String],
        claims_each: usize,
    ) -> Result<Vec<String>> {
        let claims: Api<ResourceClaim> = Api::namespaced(self.tb.client(), self.ns);
        let mut seen = 0;
        let mut out = Vec::new();
        for c in claims.list(&ListParams::default()).await?.items {
            let owned = (c.owner_references().iter()).any(|o| pods.contains(&o.name));
            if !owned {
                continue;
            }
            seen += 1;
            if !kit::allocation(&c).is_empty() {
                out.push(c.name_any());
            }
        }
        ensure!(
            seen == pods.len() * claims_each,
            "{seen} claims owned by {pods:?}, want {claims_each} each"
        );
        Ok(out)
    }

    /// Deletes pods at once (no kubelet confirms) and waits until gone.
    pub async fn delete_now(&self, pods: &[String]) -> Result<()> {
        let api: Api<Pod> = Api::namespaced(self.tb.client(), self.ns);
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        for p in pods {
            api.delete(p, &now)
                .await
                .with_context(|| format!("deleting {p}"))?;
        }
        kit::wait_for(self.tb, &format!("{pods:?} gone"), GONE, || async {
            for p in pods {
                if api.get_opt(p).await?.is_some() {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        })
        .await
    }
}
