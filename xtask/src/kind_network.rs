//! The pod network of the offline kind cluster, without a CNI image.
//!
//! kind normally applies kindnetd (an image from a registry). The offline
//! cluster disables it (`networking.disableDefaultCNI`) and does what
//! kindnetd does, once, from outside: on every node a CNI config for
//! Debian's `ptp` plugin with `host-local` addresses from the node's
//! `spec.podCIDR` (allocated by kube-controller-manager), and a route to
//! every other node's pod range via that node's address on kind's Docker
//! network. Nodes are fixed once kind has created them, so nothing has to
//! watch for changes. Limit: no masquerading for traffic leaving the
//! cluster (the scenarios stay inside it).

use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::docker;

/// Where the config lands on each node.
pub const CNI_CONFIG: &str = "/etc/cni/net.d/10-aws-dra-ptp.conflist";

/// One node: its kind container name (= Kubernetes node name), its address
/// on the kind network, its pod range.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeNet {
    pub name: String,
    pub ip: String,
    pub pod_cidr: String,
}

/// The CNI config list of a node whose pods get addresses from `pod_cidr`.
pub fn cni_config(pod_cidr: &str) -> String {
    let config = json!({
        "cniVersion": "0.4.0",
        "name": "aws-dra-ptp",
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
                "mtu": 1500,
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    });
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

/// The `ip route replace` arguments node `me` needs: one per other node.
pub fn routes(me: &str, nodes: &[NodeNet]) -> Vec<Vec<String>> {
    nodes
        .iter()
        .filter(|n| n.name != me)
        .map(|n| {
            ["ip", "route", "replace", &n.pod_cidr, "via", &n.ip]
                .map(str::to_owned)
                .to_vec()
        })
        .collect()
}

fn node_nets(cluster: &str) -> Result<Vec<NodeNet>> {
    let names = docker::output(
        "docker ps (kind nodes)",
        Command::new("docker").args([
            "ps",
            "--filter",
            &format!("label=io.x-k8s.kind.cluster={cluster}"),
            "--format",
            "{{.Names}}",
        ]),
    )?;
    let names: Vec<&str> = names
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let control_plane = names
        .iter()
        .find(|n| n.ends_with("-control-plane"))
        .with_context(|| format!("cluster {cluster} has no control-plane container"))?;
    // `name podCIDR` per line, from the control plane's admin kubeconfig.
    let cidrs = docker::output(
        "kubectl get nodes (pod ranges)",
        Command::new("docker").args([
            "exec",
            control_plane,
            "kubectl",
            "--kubeconfig=/etc/kubernetes/admin.conf",
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.podCIDR}{\"\\n\"}{end}",
        ]),
    )?;
    let mut nodes = Vec::new();
    for name in &names {
        let ip = docker::output(
            "docker inspect",
            Command::new("docker").args([
                "inspect",
                "-f",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                name,
            ]),
        )?;
        let pod_cidr = cidrs
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .with_context(|| {
                format!("node {name} has no spec.podCIDR (is --allocate-node-cidrs on?): {cidrs}")
            })?;
        nodes.push(NodeNet {
            name: name.to_string(),
            ip: ip.trim().to_string(),
            pod_cidr: pod_cidr.to_string(),
        });
    }
    Ok(nodes)
}

/// Wires the pod network of kind cluster `cluster` (see the module docs).
pub fn wire(cluster: &str) -> Result<()> {
    let nodes = node_nets(cluster)?;
    for n in &nodes {
        eprintln!("    {} {} pods {}", n.name, n.ip, n.pod_cidr);
        let mut write = Command::new("docker");
        // `-i`: without it docker exec gives the command an empty stdin.
        write.args([
            "exec",
            "-i",
            &n.name,
            "sh",
            "-c",
            &format!(
                "sysctl -qw net.ipv4.ip_forward=1 && mkdir -p /etc/cni/net.d && cat > {CNI_CONFIG}.tmp && mv {CNI_CONFIG}.tmp {CNI_CONFIG}"
            ),
        ]);
        let mut child = write
            .stdin(std::process::Stdio::piped())
            .spawn()
            .context("docker exec")?;
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().context("docker exec stdin")?;
            stdin.write_all(cni_config(&n.pod_cidr).as_bytes())?;
        }
        if !child.wait()?.success() {
            bail!("writing the CNI config on {} failed", n.name);
        }
        for route in routes(&n.name, &nodes) {
            docker::output(
                &format!("{} on {}", route.join(" "), n.name),
                Command::new("docker").arg("exec").arg(&n.name).args(&route),
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_routes_to_the_others_pod_ranges() {
        let nodes: Vec<NodeNet> = [
            ("cp", "172.18.0.2", "10.244.0.0/24"),
            ("w1", "172.18.0.3", "10.244.1.0/24"),
            ("w2", "172.18.0.4", "10.244.2.0/24"),
        ]
        .into_iter()
        .map(|(n, ip, c)| NodeNet {
            name: n.into(),
            ip: ip.into(),
            pod_cidr: c.into(),
        })
        .collect();
        let r = routes("w1", &nodes);
        assert_eq!(
            r,
            vec![
                vec![
                    "ip",
                    "route",
                    "replace",
                    "10.244.0.0/24",
                    "via",
                    "172.18.0.2"
                ],
                vec![
                    "ip",
                    "route",
                    "replace",
                    "10.244.2.0/24",
                    "via",
                    "172.18.0.4"
                ],
            ]
        );
        let c: serde_json::Value = serde_json::from_str(&cni_config("10.244.1.0/24")).unwrap();
        assert_eq!(c["plugins"][0]["type"], "ptp");
        assert_eq!(
            c["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.244.1.0/24"
        );
    }
}
