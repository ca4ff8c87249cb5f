//! The order, lanes, priorities and limits of CI's steps, and how a failure
//! is reported.

use super::*;

#[test]
fn e2e_legs_cover_both_releases_after_their_preparation() {
    let steps = steps();
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    let legs: Vec<&Step> = steps
        .iter()
        .filter(|s| s.lane.is_some() && s.lane.as_deref() != Some(CHECKS_LANE))
        .collect();
    let main = format!("1.{MAIN_MINOR}");
    let oldest = format!("1.{}", CI_RELEASES[1]);
    let leg_names: Vec<&str> = legs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        leg_names,
        [
            format!("e2e-{main}-host"),
            format!("e2e-{main}-charts"),
            format!("e2e-{oldest}-host")
        ]
    );
    // The legs are neighbours (one batch), after every preparation and
    // the image build, before the chart checks.
    let first_leg = names.iter().position(|n| *n == leg_names[0]).unwrap();
    let positions: Vec<usize> = leg_names
        .iter()
        .map(|l| names.iter().position(|n| n == l).unwrap())
        .collect();
    assert_eq!(positions, [first_leg, first_leg + 1, first_leg + 2]);
    for before in [
        "image-build".to_string(),
        format!("e2e-prepare-{main}"),
        format!("e2e-prepare-{oldest}"),
    ] {
        let at = names.iter().position(|n| *n == before).unwrap();
        assert!(at < first_leg, "{before} must run before the legs");
    }
    // Each leg its own lane; the checks one lane after the legs, in the
    // same batch; the chart checks after the batch.
    for leg in &legs {
        assert_eq!(leg.lane.as_deref(), Some(leg.name.as_str()));
    }
    let checks: Vec<&str> = steps
        .iter()
        .filter(|s| s.lane.as_deref() == Some(CHECKS_LANE))
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        checks,
        [
            "supply-chain",
            "docs-links",
            "clippy",
            "fmt-fuzz",
            "clippy-fuzz",
            "clippy-sdk",
            "doc",
            "test",
            "e2e-unit",
            "kubectl-dra-release",
            "chart-scan"
        ]
    );
    let batch_end = first_leg + 3 + checks.len();
    assert!(steps[first_leg..batch_end].iter().all(|s| s.lane.is_some()));
    assert_eq!(names[batch_end], "charts");
    assert!(steps[..first_leg].iter().all(|s| s.lane.is_none()));
    assert_eq!(names[..2], ["doctor", "fmt"]);
    // The checks give way to the legs; the legs and the steps on the
    // way to them run at normal priority.
    for s in &steps {
        assert_eq!(
            s.nice,
            s.lane.as_deref() == Some(CHECKS_LANE) || s.name == "fuzz-smoke",
            "{}",
            s.name
        );
    }
    // The fuzz smoke run is the one background step: right after doctor and fmt,
    // so it runs beside the Kubernetes and image builds.
    let background: Vec<&str> = steps
        .iter()
        .filter(|s| s.background)
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(background, ["fuzz-smoke"]);
    assert_eq!(names[2], "fuzz-smoke");
    assert!(steps[2].lane.is_none());
    let prepare = steps
        .iter()
        .find(|s| s.name == format!("e2e-prepare-{main}"))
        .unwrap();
    assert!(prepare.args.iter().any(|a| a == "--prepare-only"));
    assert!(prepare.args.windows(2).any(|w| w == ["--testbed", "all"]));
    for leg in legs {
        assert!(!leg.args.iter().any(|a| a == "--prepare-only"));
    }
}

#[test]
fn every_step_has_a_limit_and_the_cold_builds_generous_ones() {
    let steps = steps();
    for s in &steps {
        assert!(
            s.limit >= Duration::from_secs(300),
            "{}: {:?} leaves no room for a loaded machine",
            s.name,
            s.limit
        );
        assert!(
            s.limit <= Duration::from_secs(2 * 3600),
            "{}: {:?} is no limit",
            s.name,
            s.limit
        );
    }
    let limit_of = |name: &str| steps.iter().find(|s| s.name == name).unwrap().limit;
    // Each release of Kubernetes takes up to ~1,700 s to build cold.
    let releases = u32::try_from(CI_RELEASES.len()).unwrap();
    assert!(limit_of("k8s-build") >= Duration::from_secs(1700) * releases);
    // The cold figures of docs/e2e.md, with room to spare.
    for (name, cold_s) in [
        ("fuzz-smoke", 1432),
        ("image-build", 521),
        ("clippy", 337),
        ("test", 253),
    ] {
        assert!(
            limit_of(name) >= Duration::from_secs(2 * cold_s),
            "{name}: {:?}",
            limit_of(name)
        );
    }
}

#[test]
fn a_failure_names_each_step_and_the_limit_it_ran_out_of() {
    let outcome = |name: &str, ok, ran_out: Option<u64>| Outcome {
        name: name.into(),
        ok,
        took: Duration::from_secs(1),
        ran_out: ran_out.map(Duration::from_secs),
    };
    let results = [
        outcome("fmt", true, None),
        outcome("clippy", false, None),
        outcome("e2e-1.37-host", false, Some(1800)),
    ];
    assert_eq!(
        failure_reasons(&results),
        "clippy, e2e-1.37-host (ran out of its 1800s limit)"
    );
    assert_eq!(
        results[2].summary(),
        "e2e-1.37-host RAN OUT of its 1800s limit (1s)"
    );
    assert_eq!(results[1].summary(), "clippy FAILED (1s)");
}
