//! Cost models: compute (roofline), communication (α–β per link) and the hardware descriptions
//! they read (`configs/`).

pub mod comm;
pub mod compute;
pub mod config;
pub mod framework;
pub mod host;
pub mod kernel;
pub mod memory;
