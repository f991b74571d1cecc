//! trainplan: predict and improve the iteration time of data-parallel training (library; the
//! `trainplan` binary is a thin front over `cli`). The architecture notes below are ARCHITECTURE.md.

#![doc = include_str!("../ARCHITECTURE.md")]

/// Say why a test is skipped on the process's real stderr: libtest captures `eprintln!` and
/// shows it only for a failing test, so a test that skipped (no `../shared`, no python3) looked
/// like one that passed (issue 27). `cargo test` prints these lines as they happen.
#[cfg(test)]
macro_rules! skip_note {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "SKIPPED: {}", format_args!($($t)*));
    }};
}
#[cfg(test)]
pub(crate) use skip_note;

pub mod calibrate;
pub mod cli;
pub mod cost;
pub mod graph;
pub mod input;
pub mod limits;
pub mod lowerbound;
pub mod onnx;
#[path = "../passes/mod.rs"]
pub mod passes;
pub mod plan;
pub mod replay;
pub mod search;
pub mod trace;
pub mod units;
pub mod zoo;
