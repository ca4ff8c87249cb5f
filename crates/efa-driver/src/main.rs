//! `efa-driver`: the DRA driver for Elastic Fabric Adapters.
fn main() -> anyhow::Result<()> {
    anyhow::bail!("efa-driver: not built yet")
}
