//! One rendering of a driver chart as typed k8s-openapi objects: each
//! rendered object is checked field for field against its API type
//! ([`manifest_checks::check_typed`]) and deserialized by type, so that the
//! chart checks read typed fields rather than JSON paths. Also the lookups
//! the checks share (the one object of a type, `Kind/name` for messages).

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{Metadata, NamespaceResourceScope, Resource};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::charts::expect::NAMESPACE;
use crate::manifest_checks;

/// Compact JSON of a typed value, for failure messages.
pub fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("<unprintable: {e}>"))
}

/// The objects of one rendering, by type.
pub struct Rendering {
    pub daemon_sets: Vec<DaemonSet>,
    pub service_accounts: Vec<ServiceAccount>,
    pub cluster_roles: Vec<ClusterRole>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    pub roles: Vec<Role>,
    pub role_bindings: Vec<RoleBinding>,
    pub services: Vec<Service>,
    pub service_monitors: Vec<ServiceMonitor>,
    pub policies: Vec<ValidatingAdmissionPolicy>,
    pub policy_bindings: Vec<ValidatingAdmissionPolicyBinding>,
    pub device_classes: Vec<DeviceClass>,
    pub network_policies: Vec<NetworkPolicy>,
}

impl Rendering {
    /// Checks each object against its API type (no unknown field) and sorts
    /// them by type. An object of any other type is an error: the charts
    /// render nothing the checks do not look at.
    pub fn from_objects(objs: &[Value]) -> Result<Rendering> {
        for obj in objs {
            manifest_checks::check_typed(obj)?;
        }
        let r = Rendering {
            daemon_sets: of_type(objs)?,
            service_accounts: of_type(objs)?,
            cluster_roles: of_type(objs)?,
            cluster_role_bindings: of_type(objs)?,
            roles: of_type(objs)?,
            role_bindings: of_type(objs)?,
            services: of_type(objs)?,
            service_monitors: of_type(objs)?,
            policies: of_type(objs)?,
            policy_bindings: of_type(objs)?,
            device_classes: of_type(objs)?,
            network_policies: of_type(objs)?,
        };
        let known = [
            (DaemonSet::API_VERSION, DaemonSet::KIND),
            (ServiceAccount::API_VERSION, ServiceAccount::KIND),
            (ClusterRole::API_VERSION, ClusterRole::KIND),
            (ClusterRoleBinding::API_VERSION, ClusterRoleBinding::KIND),
            (Role::API_VERSION, Role::KIND),
            (RoleBinding::API_VERSION, RoleBinding::KIND),
            (Service::API_VERSION, Service::KIND),
            (ServiceMonitor::API_VERSION, ServiceMonitor::KIND),
            (
                ValidatingAdmissionPolicy::API_VERSION,
                ValidatingAdmissionPolicy::KIND,
            ),
            (
                ValidatingAdmissionPolicyBinding::API_VERSION,
                ValidatingAdmissionPolicyBinding::KIND,
            ),
            (DeviceClass::API_VERSION, DeviceClass::KIND),
            (NetworkPolicy::API_VERSION, NetworkPolicy::KIND),
        ];
        let unknown: Vec<String> = objs
            .iter()
            .filter(|o| {
                !known
                    .iter()
                    .any(|(v, k)| o["apiVersion"] == *v && o["kind"] == *k)
            })
            .map(manifest_checks::id)
            .collect();
        ensure!(
            unknown.is_empty(),
            "objects of a type the chart checks do not know: {unknown:?}"
        );
        Ok(r)
    }
}

/// The fields of a Prometheus Operator ServiceMonitor that the checks read:
/// a custom resource, so k8s-openapi has no type for it.
#[derive(serde::Deserialize)]
pub struct ServiceMonitor {
    metadata: ObjectMeta,
    pub spec: ServiceMonitorSpec,
}

#[derive(serde::Deserialize)]
pub struct ServiceMonitorSpec {
    #[serde(default)]
    pub endpoints: Vec<ServiceMonitorEndpoint>,
}

#[derive(serde::Deserialize, serde::Serialize)]
pub struct ServiceMonitorEndpoint {
    pub port: Option<String>,
    pub path: Option<String>,
}

impl Resource for ServiceMonitor {
    const API_VERSION: &'static str = "monitoring.coreos.com/v1";
    const GROUP: &'static str = "monitoring.coreos.com";
    const KIND: &'static str = "ServiceMonitor";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "servicemonitors";
    type Scope = NamespaceResourceScope;
}

impl Metadata for ServiceMonitor {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The objects of type `K`, deserialized.
fn of_type<K: Resource + DeserializeOwned>(objs: &[Value]) -> Result<Vec<K>> {
    objs.iter()
        .filter(|o| o["apiVersion"] == K::API_VERSION && o["kind"] == K::KIND)
        .map(|o| {
            serde_json::from_value(o.clone())
                .with_context(|| format!("{} does not match its API type", manifest_checks::id(o)))
        })
        .collect()
}

pub fn name<K: Metadata<Ty = ObjectMeta>>(obj: &K) -> &str {
    obj.metadata().name.as_deref().unwrap_or("?")
}

/// `Kind/name`, for messages.
pub fn id<K: Metadata<Ty = ObjectMeta>>(obj: &K) -> String {
    format!("{}/{}", K::KIND, name(obj))
}

/// The one object of type `K` (named `name`, when given).
pub fn one<'a, K: Metadata<Ty = ObjectMeta>>(objs: &'a [K], want: Option<&str>) -> Result<&'a K> {
    let found: Vec<&K> = objs
        .iter()
        .filter(|o| want.is_none_or(|n| name(*o) == n))
        .collect();
    match found.as_slice() {
        [one] => Ok(one),
        _ => bail!(
            "expected exactly one {}{}, found {} (rendered: {:?})",
            K::KIND,
            want.map(|n| format!(" named {n}")).unwrap_or_default(),
            found.len(),
            objs.iter().map(name).collect::<Vec<_>>()
        ),
    }
}

/// Namespaced objects must land in the release namespace.
pub fn check_namespace<K>(objs: &[K]) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope> + Metadata<Ty = ObjectMeta>,
{
    for obj in objs {
        ensure!(
            obj.metadata().namespace.as_deref() == Some(NAMESPACE),
            "{} is not in the release namespace {NAMESPACE}: {:?}",
            id(obj),
            obj.metadata().namespace
        );
    }
    Ok(())
}
