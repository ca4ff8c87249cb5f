//! `neuron-driver`: the DRA driver for AWS Neuron chips.
fn main() -> anyhow::Result<()> {
    anyhow::bail!("neuron-driver: not built yet")
}
