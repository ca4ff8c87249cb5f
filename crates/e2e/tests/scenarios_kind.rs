//! The end-to-end scenarios on a kind cluster, with the drivers installed
//! from the Helm charts (`e2e::kind_host`). Not part of `cargo test`: `cargo
//! xtask e2e --cluster kind` brings the cluster up, loads the images, and
//! runs this target with `AWS_DRA_KIND_KUBECONFIG` and `AWS_DRA_KIND_WORK`
//! set. Figures go to `$AWS_DRA_E2E_FIGURES`.

use std::path::PathBuf;
use std::process::ExitCode;

use e2e::ChartTestbed;
use e2e::kind_host::KindHost;

mod harness;

fn main() -> ExitCode {
    let (Some(kubeconfig), Some(work)) = (
        std::env::var_os("AWS_DRA_KIND_KUBECONFIG"),
        std::env::var_os("AWS_DRA_KIND_WORK"),
    ) else {
        eprintln!(
            "scenarios_kind runs on a kind cluster brought up by `cargo xtask e2e --cluster kind` \
             (AWS_DRA_KIND_KUBECONFIG and AWS_DRA_KIND_WORK unset)"
        );
        return ExitCode::FAILURE;
    };
    let (kubeconfig, work) = (PathBuf::from(kubeconfig), PathBuf::from(work));
    harness::main::<ChartTestbed<KindHost>>(
        // No `TestbedOp::EnableFeatureGates` on kind: nothing to turn on.
        Box::new(move |_| {
            let (kubeconfig, work) = (kubeconfig.clone(), work.clone());
            Box::pin(async move {
                ChartTestbed::start_kind(&kubeconfig, &work, &e2e::kind_host::roles()).await
            })
        }),
        "AWS_DRA_E2E_FIGURES",
    )
}
