#![doc = include_str!("../ARCHITECTURE.md")]

pub mod cli;
pub mod cost;
pub mod graph;
#[path = "../passes/mod.rs"]
pub mod passes;
pub mod replay;
pub mod trace;
pub mod zoo;
