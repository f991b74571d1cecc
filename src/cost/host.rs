//! The host side of an iteration: how long the CPU takes to issue each operator's kernels.
//!
//! An eager framework (PyTorch) runs every operator through Python, the dispatcher and the
//! autograd engine before its kernels are launched, so a GPU can only run as fast as the CPU
//! feeds it: small kernels (micro-batch 1, narrow layers) leave it waiting. A compiled graph
//! (XLA, `torch.compile`) launches its kernels from a runtime that does little per operator.
//!
//! ```text
//! CPU time of an op = speed · (dispatch[class, phase] + launch · (kernels − 1))
//! ```
//!
//! `dispatch` is the measured CPU time of one operator of the class (its first kernel's launch
//! included), `launch` the cost of each further kernel, `speed` a factor for the machine
//! (fitted on the fidelity set's fit half: the traces the dispatch times come from were
//! recorded under the profiler, which slows the host). The constants live in
//! `configs/hosts/*.yaml` (`eager`, `graph`), each citing its measurement.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::ConfigError;
use super::framework::Exec;
use super::kernel::OpClass;

/// Host constants of one execution mode (`configs/hosts/*.yaml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub name: String,
    /// CPU time of one forward operator by class, µs (its first kernel's launch included).
    pub forward_us: BTreeMap<OpClass, f64>,
    /// CPU time of one backward operator (autograd node) by class, µs.
    pub backward_us: BTreeMap<OpClass, f64>,
    /// CPU time of each kernel an operator launches beyond its first, µs.
    pub launch_us: f64,
    /// One multi-tensor optimizer call (`torch._foreach_*`), µs, plus per tensor in the list.
    pub foreach_call_us: f64,
    pub foreach_tensor_us: f64,
    /// Fixed CPU work per optimizer step (`zero_grad`, `optimizer.step`'s Python), µs.
    pub step_us: f64,
    /// Fixed CPU work per micro-step (fetching the batch, its host-to-device copy, the
    /// training loop's Python, `backward()`'s setup), µs.
    pub micro_step_us: f64,
    /// CPU time of one collective call from the framework (`c10d::allreduce_`: the process
    /// group's bookkeeping, stream synchronisation and the NCCL launch), µs; 0 when a file
    /// leaves it out. What tensor parallelism's all-reduces cost the host.
    #[serde(default)]
    pub collective_call_us: f64,
    /// The machine's factor on all of the above (1 = the measured host).
    pub speed: f64,
    /// An offloaded optimizer's step on the host CPU (DeepSpeed's `DeepSpeedCPUAdam`), billions
    /// of parameters a node updates per second, shared by the ranks on the node; not scaled by
    /// `speed` (it is bound by the host's memory, not the framework's Python). Default
    /// [`CPU_ADAM_GPARAMS_PER_S`].
    #[serde(default = "cpu_adam_default")]
    pub cpu_adam_gparams_per_s: f64,
    #[serde(default)]
    pub source: String,
}

/// DeepSpeed's CPU Adam on one host: an 11.6 B-parameter GPT-2's optimizer step in 8.2 s
/// (56 s with `torch.optim.Adam`), as measured by its author in deepspeedai/DeepSpeed pull
/// request #735 (2021-02-08): 1.41 billion parameters per second. Hosts differ several-fold
/// (a 10-core Xeon Silver took 22.9 s for 1.35 B, DeepSpeed issue #1635): a cluster whose CPU
/// is known sets `cpu_adam_gparams_per_s` in its host file.
pub const CPU_ADAM_GPARAMS_PER_S: f64 = 11.6 / 8.2;

fn cpu_adam_default() -> f64 {
    CPU_ADAM_GPARAMS_PER_S
}

impl Default for HostSpec {
    /// The eager (PyTorch) host.
    fn default() -> Self {
        HostSpec::builtin(Exec::Eager)
    }
}

impl HostSpec {
    /// The built-in constants of an execution mode.
    pub fn builtin(exec: Exec) -> HostSpec {
        let (file, text) = match exec {
            Exec::Eager => (
                "configs/hosts/eager.yaml",
                include_str!("../../configs/hosts/eager.yaml"),
            ),
            Exec::Graph => (
                "configs/hosts/graph.yaml",
                include_str!("../../configs/hosts/graph.yaml"),
            ),
        };
        parse_host(text, file).unwrap_or_else(|e| panic!("built-in host config: {e}"))
    }

    /// CPU time to issue one operator of `class` with `kernels` kernels, ns.
    pub fn op_ns(&self, class: OpClass, backward: bool, kernels: u32) -> f64 {
        let table = if backward {
            &self.backward_us
        } else {
            &self.forward_us
        };
        // A depthwise conv is dispatched as every convolution is (cuDNN's setup), unless the
        // host config prices it apart.
        let dispatch = table
            .get(&class)
            .or_else(|| {
                (class == OpClass::DepthwiseConv)
                    .then(|| table.get(&OpClass::Conv))
                    .flatten()
            })
            .or_else(|| table.get(&OpClass::Elementwise))
            .copied()
            .unwrap_or(0.0);
        let extra = f64::from(kernels.saturating_sub(1)) * self.launch_us;
        self.speed * (dispatch + extra) * 1e3
    }

    /// CPU time of one multi-tensor optimizer call over `tensors` tensors, ns.
    pub fn foreach_ns(&self, tensors: usize) -> f64 {
        self.speed * (self.foreach_call_us + self.foreach_tensor_us * tensors as f64) * 1e3
    }

    /// CPU time of one collective call, ns.
    pub fn collective_call_ns(&self) -> f64 {
        self.speed * self.collective_call_us * 1e3
    }

    /// Fixed CPU time per micro-step, ns.
    pub fn micro_step_ns(&self) -> f64 {
        self.speed * self.micro_step_us * 1e3
    }

    /// Fixed CPU time per optimizer step, ns.
    pub fn step_ns(&self) -> f64 {
        self.speed * self.step_us * 1e3
    }

    /// The host CPU's Adam step over `params` parameters while `sharing` ranks of the node
    /// run theirs at the same time, ns.
    pub fn cpu_adam_ns(&self, params: f64, sharing: u32) -> f64 {
        params * f64::from(sharing.max(1)) / self.cpu_adam_gparams_per_s
    }
}

/// Parse and validate a host file.
pub fn parse_host(text: &str, file: &str) -> Result<HostSpec, ConfigError> {
    let h: HostSpec = super::config::parse_yaml(text, file)?;
    let bad = |field: String, v: f64| ConfigError::File {
        file: file.to_string(),
        message: format!("field {field}: must be between 0 and 100000 µs, got {v}"),
    };
    for (name, table) in [
        ("forward_us", &h.forward_us),
        ("backward_us", &h.backward_us),
    ] {
        for (c, v) in table {
            if !(v.is_finite() && (0.0..=1e5).contains(v)) {
                return Err(bad(format!("{name}.{c:?}"), *v));
            }
        }
    }
    for (field, v) in [
        ("launch_us", h.launch_us),
        ("foreach_call_us", h.foreach_call_us),
        ("foreach_tensor_us", h.foreach_tensor_us),
        ("step_us", h.step_us),
        ("micro_step_us", h.micro_step_us),
    ] {
        if !(v.is_finite() && (0.0..=1e5).contains(&v)) {
            return Err(bad(field.to_string(), v));
        }
    }
    if !(h.speed.is_finite() && h.speed > 0.0 && h.speed <= 100.0) {
        return Err(ConfigError::File {
            file: file.to_string(),
            message: format!("field speed: must be > 0 and ≤ 100, got {}", h.speed),
        });
    }
    let adam = h.cpu_adam_gparams_per_s;
    if !(adam.is_finite() && (1e-6..=1e4).contains(&adam)) {
        return Err(ConfigError::File {
            file: file.to_string(),
            message: format!(
                "field cpu_adam_gparams_per_s: must be between 0.000001 and 10000 billion parameters per second, got {adam}"
            ),
        });
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse_and_price_by_class() {
        let e = HostSpec::builtin(Exec::Eager);
        let g = HostSpec::builtin(Exec::Graph);
        // A convolution's dispatch (cuDNN descriptors, algorithm cache) costs more than a ReLU's.
        assert!(e.op_ns(OpClass::Conv, false, 1) > e.op_ns(OpClass::Elementwise, false, 1));
        // Further kernels cost one launch each.
        let one = e.op_ns(OpClass::Softmax, false, 1);
        let three = e.op_ns(OpClass::Softmax, false, 3);
        assert!((three - one - 2.0 * e.speed * e.launch_us * 1e3).abs() < 1e-6);
        // A compiled graph issues kernels for less than eager dispatch.
        assert!(g.op_ns(OpClass::Conv, false, 1) < e.op_ns(OpClass::Conv, false, 1));
        // A depthwise conv is a cuDNN call like any convolution.
        assert_eq!(
            e.op_ns(OpClass::DepthwiseConv, true, 1),
            e.op_ns(OpClass::Conv, true, 1)
        );
    }

    #[test]
    fn bad_values_name_the_field() {
        let t =
            include_str!("../../configs/hosts/eager.yaml").replace("launch_us: ", "launch_us: -");
        let e = parse_host(&t, "h.yaml").unwrap_err().to_string();
        assert!(e.contains("h.yaml") && e.contains("launch_us"), "{e}");
    }
}
