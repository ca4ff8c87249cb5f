//! Generated sysfs and `/dev` trees that look like real AWS accelerator nodes.
