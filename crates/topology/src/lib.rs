//! Where accelerator and network devices sit on the PCI tree of an AWS node.
//!
//! Pure and synchronous: every path is relative to an injectable sysfs root so
//! that the same code runs against `/sys` and against generated fixtures.
