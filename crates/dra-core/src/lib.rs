//! Everything a DRA node driver needs that is not device-specific.
