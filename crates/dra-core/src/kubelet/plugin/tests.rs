use super::*;

fn efa_with_root(root: &str) -> PluginSockets {
    let mut o = PluginOptions::new("efa.networking.k8s.aws", "efa");
    o.registrar_dir = PathBuf::from(format!("{root}/plugins_registry"));
    o.plugins_dir = PathBuf::from(format!("{root}/plugins"));
    o.pod_uid = Some("d1431689-5802-499d-b841-6d64da00d9d0".into());
    o.sockets()
}

#[test]
fn per_pod_sockets_fit_under_a_kubelet_root_of_21_bytes_and_not_22() {
    // The default root, and the longest one that fits.
    for root in ["/var/lib/kubelet", "/var/lib/kubelet-abcd"] {
        assert!(root.len() <= 21);
        efa_with_root(root).check_lengths().unwrap();
    }
    let s = efa_with_root("/var/lib/kubelet-abcde");
    assert_eq!(s.registration.as_os_str().len(), 108);
    let err = s.check_lengths().unwrap_err().to_string();
    assert!(err.contains("108 bytes"), "{err}");
    assert!(err.contains("hostPaths.kubeletRoot"), "{err}");
}
