//! The disk check's parsing and decisions, on made-up machines and `df`
//! answers.

use super::*;

/// A fresh machine: nothing built, everything on one filesystem.
fn fresh() -> Machine {
    Machine {
        target: PathBuf::from("/w/target"),
        target_used: 0,
        cache: PathBuf::from("/root/.cache/aws-dra"),
        docker: PathBuf::from("/var/lib/docker"),
        docker_used: 0,
        built: Vec::new(),
    }
}

/// A `df` that puts every path under `/big` on a filesystem of its own and
/// the rest on `/`, with this much free on each.
fn df(
    root_free_gib: u64,
    big_free_gib: u64,
) -> impl Fn(&[&Path]) -> Result<Vec<Filesystem>, String> {
    move |paths| {
        Ok(paths
            .iter()
            .map(|p| {
                let (mount, free) = if p.starts_with("/big") {
                    ("/big", big_free_gib)
                } else {
                    ("/", root_free_gib)
                };
                Filesystem {
                    mount: mount.into(),
                    available: free * GIB,
                }
            })
            .collect())
    }
}

#[test]
fn df_lines_are_read_by_their_capacity_field() {
    let out = "Filesystem     1024-blocks     Used Available Capacity Mounted on\n\
               /dev/vda         264212084 19042900  76458364      20% /\n\
               map auto home            0        0         0     100% /System/Volumes/Data/home\n\
               /dev/vdb          1000000   500000    500000      50% /mnt/with space\n";
    assert_eq!(
        parse_df(out).unwrap(),
        [
            Filesystem {
                mount: "/".into(),
                available: 76_458_364 * 1024
            },
            Filesystem {
                mount: "/System/Volumes/Data/home".into(),
                available: 0
            },
            Filesystem {
                mount: "/mnt/with space".into(),
                available: 500_000 * 1024
            },
        ]
    );
    assert_eq!(parse_df("Filesystem ...\n").unwrap(), []);
    assert!(parse_df("Filesystem\ngarbage line\n").is_none());
}

#[test]
fn du_totals_are_read_from_the_last_line() {
    assert_eq!(parse_du("3400\t/w/target\n"), Some(3400 * 1024));
    assert_eq!(
        parse_du("du: cannot read x\n12\t/w/target\n"),
        Some(12 * 1024)
    );
    assert_eq!(parse_du(""), None);
}

#[test]
fn a_fresh_machine_needs_the_measured_figures() {
    let m = fresh();
    let demo: u64 = shares(Workload::Demo, &m).iter().map(|s| s.bytes).sum();
    let one_release = GO_BUILD_PEAK + GO_MODULES_AND_BINARIES_PER_RELEASE;
    assert_eq!(demo, TARGET_DEBUG + one_release);
    // Go's build cache is emptied after each release: it is needed once.
    let ci: u64 = shares(Workload::Ci, &m).iter().map(|s| s.bytes).sum();
    let releases = CI_RELEASES.len() as u64;
    assert_eq!(
        ci,
        TARGET_CI + GO_BUILD_PEAK + GO_MODULES_AND_BINARIES_PER_RELEASE * releases
    );
    let kind: u64 = shares(Workload::Kind, &m).iter().map(|s| s.bytes).sum();
    assert_eq!(kind, TARGET_DEBUG + one_release + DOCKER_KIND);
    // Only kind writes to Docker.
    for w in [Workload::Demo, Workload::Ci] {
        assert!(shares(w, &m).iter().all(|s| s.path != m.docker), "{w:?}");
    }
}

#[test]
fn what_is_there_already_is_not_needed_again() {
    let m = Machine {
        target_used: 20 * GIB,
        docker_used: 40 * GIB,
        built: vec![MAIN_MINOR],
        ..fresh()
    };
    // The demo's release is built and most of the target is there.
    let demo = shares(Workload::Demo, &m);
    assert_eq!(demo.len(), 1, "{demo:?}");
    assert_eq!(demo[0].bytes, TARGET_DEBUG - 20 * GIB);
    // ci still builds its other releases.
    let ci = shares(Workload::Ci, &m);
    let go = ci.iter().find(|s| s.path == m.cache).unwrap();
    assert_eq!(go.bytes, go_caches(CI_RELEASES.len() - 1));
    assert!(!go.what.contains(&format!("1.{MAIN_MINOR}")), "{}", go.what);
    // Docker holds more than kind's figure already.
    assert!(
        shares(Workload::Kind, &m)
            .iter()
            .all(|s| s.path != m.docker)
    );
    // Everything there: nothing to check.
    let warm = Machine {
        target_used: TARGET_CI,
        built: CI_RELEASES.to_vec(),
        ..m
    };
    assert!(shares(Workload::Ci, &warm).is_empty());
    let lines = report_on(&warm, &[Workload::Ci], |_| Err("df not needed".into()));
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].starts_with("ok       disk for `cargo xtask ci`: everything"),
        "{lines:?}"
    );
}

#[test]
fn shares_on_one_filesystem_add_up_and_a_shortfall_is_a_warning() {
    let m = fresh();
    // 32 GiB: enough for the demo (29.8), not for ci (34.8) nor kind (59.8).
    let lines = report_on(&m, &Workload::ALL, df(32, 0));
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(
        lines[0].starts_with(
            "ok       disk for `cargo xtask demo`: / has 32.0 GiB free, needs up to 29.8 GiB more"
        ),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with("WARNING  disk for `cargo xtask ci`"),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].contains("needs up to 34.8 GiB more"),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].contains("2.8 GiB short; README.md \"Disk\""),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with("WARNING  disk for `cargo xtask e2e --cluster kind`"),
        "{}",
        lines[2]
    );
    assert!(lines[2].contains("Docker 30.0 GiB"), "{}", lines[2]);
}

#[test]
fn each_filesystem_is_judged_on_its_own_shares() {
    // Docker on a big disk of its own, the rest on a small root.
    let m = Machine {
        docker: PathBuf::from("/big/docker"),
        ..fresh()
    };
    let shares = shares(Workload::Kind, &m);
    let filesystems =
        df(32, 100)(&shares.iter().map(|s| s.path.as_path()).collect::<Vec<_>>()).unwrap();
    let v = verdicts(&shares, &filesystems);
    assert_eq!(v.len(), 2, "{v:?}");
    assert_eq!(v[0].mount, "/");
    assert_eq!(v[0].needed, TARGET_DEBUG + go_caches(1));
    assert_eq!(v[0].parts.len(), 2);
    assert!(!v[0].short(), "{v:?}");
    assert_eq!((v[1].mount.as_str(), v[1].needed), ("/big", DOCKER_KIND));
    assert!(!v[1].short());
    // 20 GiB on root is short for the target and the Go cache together.
    let small = verdicts(
        &shares,
        &df(20, 100)(&[Path::new("/"), Path::new("/"), Path::new("/big")]).unwrap(),
    );
    assert!(small[0].short() && !small[1].short(), "{small:?}");
}

#[test]
fn a_df_that_fails_is_a_warning_not_an_error() {
    let lines = report_on(&fresh(), &[Workload::Demo], |_| {
        Err("df failed: boom".into())
    });
    assert_eq!(
        lines,
        ["WARNING  disk for `cargo xtask demo` not checked: df failed: boom"]
    );
}

#[test]
fn the_real_df_answers_for_paths_that_do_not_exist_yet() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not/yet/there");
    let found = filesystems(&[dir.path(), &missing]).unwrap();
    assert_eq!(found.len(), 2);
    assert_eq!(found[0], found[1]);
}
