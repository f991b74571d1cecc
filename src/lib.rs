//! trainplan: predict and improve the iteration time of data-parallel training (library; the
//! `trainplan` binary is a thin front over `cli`). The architecture notes below are ARCHITECTURE.md.

#![doc = include_str!("../ARCHITECTURE.md")]

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
