//! The training phase an event's name implies (`Optimizer.step` → update, autograd names →
//! backward), shared by the graph's thread stage and the kernels' work: a module of its own below
//! both, so that neither reaches up into the other.

use crate::graph::Phase;

/// Phase implied by an event's name, if any.
pub(crate) fn name_phase(name: &str) -> Option<Phase> {
    if name.starts_with("Optimizer.step") {
        Some(Phase::Update)
    } else if name.starts_with("Optimizer.zero_grad") {
        // Before the forward, once per iteration: not the update (whose ops an optimizer pass
        // fuses), nor part of a micro-step.
        Some(Phase::Other)
    } else if name.starts_with("autograd::engine::evaluate_function") || name.contains("Backward") {
        Some(Phase::Bw)
    } else {
        None
    }
}
