//! The pass registry: one file per optimization pass, listed here in a sorted, explicit order.
//!
//! A pass proposes patches (data) on a frozen graph and never mutates it or does IO; the driver
//! applies, checks, replays and can undo them. The registry is empty until the pass issue lands;
//! `trainplan passes` reports that plainly rather than listing placeholders.

/// Names of the registered passes, sorted.
pub const REGISTERED: &[&str] = &[];
