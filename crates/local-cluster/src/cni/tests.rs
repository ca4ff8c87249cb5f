//! The pod network's config: per-node bridge and subnet, and the plugins.

use super::*;

#[test]
fn each_reservable_port_gets_its_own_bridge_and_subnet() {
    let mut subnets = std::collections::BTreeSet::new();
    // Every port the reservations hand out (10,000 up to the default
    // ephemeral range): no two nodes on the host share a subnet.
    for port in 10_000..32_768u16 {
        let net = PodNetwork::for_kubelet_port(port);
        assert!(net.bridge.len() <= 15, "{}", net.bridge);
        assert!(subnets.insert(net.subnet), "{port}: {}", net.subnet);
        // Inside 100.64.0.0/10, on a /25 boundary.
        let addr = u32::from(net.subnet);
        assert_eq!(addr >> 22, u32::from(POOL) >> 22, "{}", net.subnet);
        assert_eq!(addr % 128, 0, "{}", net.subnet);
    }
    assert_eq!(
        PodNetwork::for_kubelet_port(10_000),
        PodNetwork {
            bridge: "ad-cni10000".into(),
            subnet: Ipv4Addr::new(100, 83, 136, 0),
        }
    );
    assert_eq!(PodNetwork::for_kubelet_port(65_535).bridge, "ad-cni65535");
}

#[test]
fn the_conflist_is_a_bridge_with_host_local_addresses_of_the_node() {
    let net = PodNetwork::for_kubelet_port(10_001);
    let config = net.conflist(Path::new("/s/0/cni/ipam"), false);
    assert_eq!(config["cniVersion"], "1.0.0");
    let plugins = config["plugins"].as_array().unwrap();
    assert_eq!(plugins.len(), 1, "no portmap without iptables");
    let bridge = &plugins[0];
    assert_eq!(bridge["type"], "bridge");
    assert_eq!(bridge["bridge"], "ad-cni10001");
    assert_eq!(bridge["isGateway"], true);
    let ipam = &bridge["ipam"];
    assert_eq!(ipam["type"], "host-local");
    assert_eq!(ipam["dataDir"], "/s/0/cni/ipam");
    let range = &ipam["ranges"][0][0];
    assert_eq!(range["subnet"], "100.83.136.128/25");
    assert_eq!(range["gateway"], "100.83.136.129");
    assert_eq!(range["rangeStart"], "100.83.136.130");
    assert_eq!(range["rangeEnd"], "100.83.136.254");

    let with_portmap = net.conflist(Path::new("/ipam"), true);
    let types: Vec<&str> = with_portmap["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["bridge", "portmap"]);
}

#[test]
fn the_conflist_is_written_where_containerd_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let net = PodNetwork::for_kubelet_port(12_345);
    net.write(dir.path(), &dir.path().join("ipam"), &bin)
        .unwrap();
    let text = std::fs::read_to_string(dir.path().join("10-aws-dra-local.conflist")).unwrap();
    let written: Value = serde_json::from_str(&text).unwrap();
    // No portmap binary in `bin`: bridge only.
    assert_eq!(written, net.conflist(&dir.path().join("ipam"), false));
}
