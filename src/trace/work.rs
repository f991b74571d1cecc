//! The work of every GPU kernel of a recorded step, so that passes re-cost recorded kernels
//! relative to themselves (`recorded × model(new) / model(old)`, [`Job::recost_ns`]).
//!
//! **Shapes.** A kernel's owner is the innermost CPU operator above its launch that has a rule
//! in [`super::shapes`] and recorded `Input Dims` the rule accepts. The owner's work is shared
//! among the kernels it launched in proportion to their recorded times (a convolution's
//! transform kernels and main kernel keep the owner's FLOP-to-byte ratio). Context the shapes
//! alone lack comes from the step: a forward convolution's output size from its backward (the
//! same autograd sequence number), a backward convolution's weight and input from its forward,
//! which operand of a backward GEMM carries the batch from the forward activations' leading
//! sizes.
//!
//! **Names.** A kernel without an owner gets a class from its name and work sized to its
//! recorded time ([`shapes::class_work`]): the re-costing then assumes the kernel ran at the
//! model's efficiency for its class. `WorkSource` records which it was, so that reports state
//! the share of GPU time each covers.
//!
//! The precision the step ran in comes from the same owners: the storage dtype of the matrix
//! operators' inputs, weighted by their kernels' time (`c10::Half` → fp16: the job already ran
//! mixed precision, and `amp` says so).

use std::collections::{BTreeMap, HashMap};

use super::kineto::{Category, Event, Id};
use super::phase::name_phase;
use super::shapes::{self, Input, OpContext, ShapedWork};
use crate::cost::config::Dtype;
use crate::cost::kernel::{MathClass, OpClass};
use crate::graph::job::{CARRY_IN_LAYER, Job, WorkCoverage};
use crate::graph::{OpKind, Phase};

/// How an op's work is known.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkSource {
    /// From its owner operator's recorded shapes.
    Shapes,
    /// From shapes, with an assumption (a convolution's stride).
    ShapesApprox,
    /// From the kernel's name: a class, sized to the recorded time.
    KernelName,
    /// No work (CPU ops, copies, collectives).
    #[default]
    None,
}

/// What the step's CPU operators say beyond each one's own shapes.
#[derive(Clone, Debug, Default)]
pub struct StepContext<'a> {
    /// Enclosing event of each CPU event of the window.
    parent: Option<&'a HashMap<usize, usize>>,
    /// Sequence number → dims of the first input of its backward node (its output's gradient).
    bw_out: BTreeMap<i64, Vec<i64>>,
    /// Sequence number → (input, weight) dims of its forward convolution.
    fw_conv: BTreeMap<i64, (Vec<i64>, Vec<i64>)>,
    /// Leading sizes of forward activations of matrix operators.
    pub batch_like: Vec<i64>,
    /// Forward matrix operators in time order: (event, name, first activation dims).
    pub forward_matrix: Vec<(usize, String, Vec<i64>)>,
    /// Forward operators with shapes (event), in time order: what the memory estimate walks.
    pub forward_shaped: Vec<usize>,
    /// Forward calls of FBGEMM's table-batched embedding lookups (TorchRec's sharded tables),
    /// whose operands hold the tables and their fused optimizer state.
    pub table_lookups: Vec<usize>,
}

/// An FBGEMM table-batched embedding lookup with a fused optimizer
/// (`fbgemm::split_embedding_codegen_lookup_<optimizer>_function`).
pub fn is_table_lookup(name: &str) -> bool {
    name.strip_prefix("fbgemm::split_embedding_codegen_lookup_")
        .is_some_and(|rest| rest.ends_with("_function"))
}

fn is_conv_fw(name: &str) -> bool {
    let s = name.strip_prefix("aten::").unwrap_or(name);
    matches!(
        s,
        "convolution"
            | "_convolution"
            | "conv1d"
            | "conv2d"
            | "conv3d"
            | "cudnn_convolution"
            | "miopen_convolution"
            | "mkldnn_convolution"
            | "convolution_overrideable"
    )
}

/// The activation operand of a forward matrix operator and its leading size(s).
fn matrix_activation(name: &str, ins: &[Input]) -> Option<(Vec<i64>, Vec<i64>)> {
    let s = name.strip_prefix("aten::").unwrap_or(name);
    let t = |i: usize| ins.get(i).and_then(Input::dims).map(<[i64]>::to_vec);
    let x = match s {
        "addmm" => t(1)?,
        "mm" | "linear" | "matmul" => t(0)?,
        _ if is_conv_fw(name) => t(0)?,
        "embedding" => t(1)?,
        _ => return None,
    };
    let first = *x.first()?;
    let mut lead = vec![first];
    if x.len() >= 3 && matches!(s, "linear" | "matmul") {
        lead.push(x[..x.len() - 1].iter().product());
    }
    if is_conv_fw(name) || matches!(s, "embedding") {
        lead.truncate(1);
    }
    Some((x, lead))
}

impl<'a> StepContext<'a> {
    /// Index the window's CPU operators.
    pub fn new(
        ev: &[Event],
        threads: &BTreeMap<Id, Vec<usize>>,
        parent: &'a HashMap<usize, usize>,
    ) -> StepContext<'a> {
        let mut cx = StepContext {
            parent: Some(parent),
            ..StepContext::default()
        };
        let mut all: Vec<usize> = threads
            .values()
            .flatten()
            .copied()
            .filter(|&i| ev[i].cat == Category::CpuOp && ev[i].args.input_dims.is_some())
            .collect();
        all.sort_by_key(|&i| (ev[i].ts_ns, i));
        for i in all {
            let e = &ev[i];
            let Some(ins) = e.args.input_dims.as_deref().and_then(shapes::parse_dims) else {
                continue;
            };
            let bw = name_phase(&e.name) == Some(Phase::Bw) || cx.phase(ev, i) == Phase::Bw;
            let seq = e.args.seq.filter(|&s| s >= 0);
            if bw {
                if let (Some(s), true) = (seq, !e.name.starts_with("aten::"))
                    && let Some(d) = ins.first().and_then(Input::dims)
                {
                    cx.bw_out.entry(s).or_insert_with(|| d.to_vec());
                }
                continue;
            }
            if cx.phase(ev, i) != Phase::Fw {
                continue;
            }
            if shapes::has_rule(&e.name) {
                cx.forward_shaped.push(i);
            }
            if is_table_lookup(&e.name) {
                cx.table_lookups.push(i);
            }
            if let Some(s) = seq
                && is_conv_fw(&e.name)
                && let (Some(x), Some(w)) = (
                    ins.first().and_then(Input::dims),
                    ins.get(1).and_then(Input::dims),
                )
            {
                cx.fw_conv
                    .entry(s)
                    .or_insert_with(|| (x.to_vec(), w.to_vec()));
            }
            if let Some((x, lead)) = matrix_activation(&e.name, &ins) {
                for l in lead {
                    if l > 0 && !cx.batch_like.contains(&l) {
                        cx.batch_like.push(l);
                    }
                }
                cx.forward_matrix.push((i, e.name.to_string(), x));
            }
        }
        cx
    }

    /// The chain of enclosing events of `i` (itself first).
    pub fn chain(&self, i: usize) -> Vec<usize> {
        let mut v = vec![i];
        let Some(p) = self.parent else { return v };
        let mut cur = i;
        while let Some(&up) = p.get(&cur) {
            if v.len() > 256 {
                break;
            }
            v.push(up);
            cur = up;
        }
        v
    }

    /// Phase of a CPU event from its name and its ancestors' (FW by default).
    pub fn phase(&self, ev: &[Event], i: usize) -> Phase {
        self.chain(i)
            .iter()
            .find_map(|&j| name_phase(&ev[j].name))
            .unwrap_or(Phase::Fw)
    }

    /// The autograd sequence number of an event or its nearest ancestor with one.
    fn seq(&self, ev: &[Event], i: usize) -> Option<i64> {
        self.chain(i)
            .iter()
            .find_map(|&j| ev[j].args.seq.filter(|&s| s >= 0))
    }

    /// The work of CPU operator `i` from its shapes and the step's context.
    pub fn op_work(&self, ev: &[Event], i: usize, phase: Phase) -> Option<ShapedWork> {
        let e = &ev[i];
        if e.cat != Category::CpuOp || !shapes::has_rule(&e.name) {
            return None;
        }
        let ins = shapes::parse_dims(e.args.input_dims.as_deref()?)?;
        let chain = self.chain(i);
        let seq = self.seq(ev, i);
        let fw = seq.and_then(|s| self.fw_conv.get(&s));
        let cx = OpContext {
            phase: Some(phase),
            output: seq.and_then(|s| self.bw_out.get(&s).cloned()),
            fw_input: fw.map(|f| f.0.clone()),
            fw_weight: fw.map(|f| f.1.clone()),
            concrete: e
                .args
                .concrete_inputs
                .as_deref()
                .map(shapes::parse_types)
                .unwrap_or_default(),
            batch_like: self.batch_like.clone(),
            weight_grad: chain.iter().any(|&j| ev[j].name.contains("AccumulateGrad")),
        };
        shapes::op_work(&e.name, &ins, &cx)
    }

    /// The innermost operator above launch `l` whose shapes give work.
    fn owner(
        &self,
        ev: &[Event],
        l: usize,
        phase: Phase,
        cache: &mut HashMap<usize, Option<ShapedWork>>,
    ) -> Option<(usize, ShapedWork)> {
        for &j in self.chain(l).iter().skip(1) {
            let w = *cache.entry(j).or_insert_with(|| self.op_work(ev, j, phase));
            if let Some(w) = w {
                return Some((j, w));
            }
        }
        None
    }
}

/// Give every GPU compute op of `job` its work (see the module docs); sets `job.dtype` to the
/// precision the matrix operators ran in. Returns each op's source and that precision's name.
pub fn attach(
    job: &mut Job,
    ev: &[Event],
    op_event: &[Option<usize>],
    launch_of: &BTreeMap<i64, usize>,
    cx: &StepContext,
) -> (Vec<WorkSource>, Option<String>) {
    let n = job.local.ops.len();
    let mut source = vec![WorkSource::None; n];
    let carry = job
        .local
        .layers
        .iter()
        .position(|l| l == CARRY_IN_LAYER)
        .map(|p| p as u32);
    let mut cache: HashMap<usize, Option<ShapedWork>> = HashMap::new();
    // Owner of each kernel, and the kernels of each owner.
    let mut owned: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut owner_work: BTreeMap<usize, ShapedWork> = BTreeMap::new();
    let mut unowned: Vec<usize> = Vec::new();
    for i in 0..n {
        let s = &job.local.ops[i].spec;
        if s.kind != OpKind::Compute {
            continue;
        }
        let Some(g) = op_event.get(i).copied().flatten() else {
            continue;
        };
        let launch = ev[g]
            .args
            .correlation
            .and_then(|c| launch_of.get(&c))
            .copied();
        let found = match launch {
            Some(l) if Some(s.layer) != carry => cx.owner(ev, l, s.phase, &mut cache),
            _ => None,
        };
        match found {
            Some((o, w)) => {
                owned.entry(o).or_default().push(i);
                owner_work.insert(o, w);
            }
            None => unowned.push(i),
        }
    }
    // Precision: the matrix owners' input dtype, weighted by their kernels' time.
    let mut by_dtype: BTreeMap<Dtype, u64> = BTreeMap::new();
    for (o, ops) in &owned {
        if owner_work[o].work.math != MathClass::Matrix {
            continue;
        }
        let t: u64 = ops.iter().map(|&i| job.local.ops[i].spec.dur_ns).sum();
        let d = ev[*o]
            .args
            .input_type
            .as_deref()
            .map(shapes::parse_types)
            .and_then(|v| v.iter().find_map(|t| shapes::float_dtype(t)));
        if let Some(d) = d {
            *by_dtype.entry(d).or_default() += t;
        }
    }
    let total: u64 = by_dtype.values().sum();
    let main = by_dtype.iter().max_by_key(|(_, t)| **t).map(|(d, _)| *d);
    if let Some(d) = main
        && matches!(d, Dtype::Fp16 | Dtype::Bf16)
        && 2 * by_dtype[&d] > total
    {
        job.dtype = d;
    }
    let precision = main.map(|d| format!("{d:?}").to_lowercase());
    for (o, ops) in &owned {
        let w = owner_work[o];
        let total: u64 = ops.iter().map(|&i| job.local.ops[i].spec.dur_ns).sum();
        for &i in ops {
            let f = if total == 0 {
                1.0 / ops.len() as f64
            } else {
                job.local.ops[i].spec.dur_ns as f64 / total as f64
            };
            job.local_mut().ops[i].work = Some(shapes::share(&w.work, f));
            source[i] = if w.approximate {
                WorkSource::ShapesApprox
            } else {
                WorkSource::Shapes
            };
        }
    }
    for i in unowned {
        let Some(g) = op_event[i] else { continue };
        let spec = &job.local.ops[i].spec;
        let class = shapes::kernel_class(&ev[g].name);
        let w = shapes::class_work(job, class, spec.dur_ns, spec.phase == Phase::Update);
        job.local_mut().ops[i].work = Some(w);
        source[i] = WorkSource::KernelName;
    }
    (source, precision)
}

/// The step's GPU time by work source.
pub fn coverage(job: &Job, source: &[WorkSource]) -> WorkCoverage {
    let mut c = WorkCoverage::default();
    for (i, o) in job.local.ops.iter().enumerate() {
        if !matches!(o.spec.kind, OpKind::Compute | OpKind::Memcpy) {
            continue;
        }
        let d = o.spec.dur_ns;
        match source.get(i).copied().unwrap_or_default() {
            WorkSource::Shapes | WorkSource::ShapesApprox => c.shapes_ns += d,
            WorkSource::KernelName => c.names_ns += d,
            WorkSource::None => c.none_ns += d,
        }
    }
    c
}

/// Which extreme to size name-classed kernels at (for the uncertainty `whatif` states).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// All their time is math: they speed up as much as the GPU's peaks allow.
    Compute,
    /// All their time is memory traffic (or launch): they gain only what bytes save.
    Memory,
}

/// `job` with every name-classed kernel's work replaced by one that spends its modelled time
/// on math only (`Compute`) or on memory traffic only (`Memory`): the two ends between which the
/// kernel's real operating point lies. Shapes-derived work is left alone.
pub fn at_bound(job: &Job, source: &[WorkSource], bound: Bound) -> Job {
    let mut out = job.clone();
    let m = job.kernels();
    for (i, op) in out.local_mut().ops.iter_mut().enumerate() {
        if source.get(i) != Some(&WorkSource::KernelName) {
            continue;
        }
        let Some(w) = op.work else { continue };
        let t = m.time_ns(&w, job.dtype, job.math);
        let launch_only = m.time_ns(
            &crate::graph::job::OpWork {
                flops: 0.0,
                act_elems: 0.0,
                weight_elems: 0.0,
                ..w
            },
            job.dtype,
            job.math,
        );
        if t <= launch_only {
            continue;
        }
        let mut e = w;
        match bound {
            Bound::Compute => {
                // Bytes down to almost nothing; FLOPs up until the time is back.
                e.act_elems *= 1e-6;
                e.weight_elems *= 1e-6;
                if e.flops <= 0.0 {
                    e.flops = 1.0;
                    if e.class.math() == MathClass::Vector && e.class == OpClass::Copy {
                        e.class = OpClass::Elementwise;
                    }
                }
            }
            Bound::Memory => {
                e.flops *= 1e-6;
                for g in e.gemms.iter_mut() {
                    *g = crate::cost::kernel::Gemm::NONE;
                }
                if e.act_elems + e.weight_elems <= 0.0 {
                    e.act_elems = 1.0;
                }
            }
        }
        // Scale the remaining quantity until the model gives the same time again.
        let scale_to = |f: f64| e.times(f);
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        while m.time_ns(&scale_to(hi), job.dtype, job.math) < t && hi < 1e18 {
            lo = hi;
            hi *= 4.0;
        }
        for _ in 0..80 {
            let mid = 0.5 * (lo + hi);
            if m.time_ns(&scale_to(mid), job.dtype, job.math) < t {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        op.work = Some(scale_to(hi));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::job::OpWork;

    #[test]
    fn bounds_keep_the_modelled_time() {
        let mut job = crate::passes::recompute::tests::chain(&[1000], &[0]);
        job.meta.source = "trace".into();
        let w = shapes::class_work(&job, OpClass::Gemm, 500_000, false);
        job.local_mut().ops[0].work = Some(w);
        let src = {
            let mut v = vec![WorkSource::None; job.local.ops.len()];
            v[0] = WorkSource::KernelName;
            v
        };
        let m = job.kernels();
        let t0 = m.time_ns(&w, job.dtype, job.math);
        for b in [Bound::Compute, Bound::Memory] {
            let j = at_bound(&job, &src, b);
            let e: OpWork = j.local.ops[0].work.unwrap();
            let t = m.time_ns(&e, job.dtype, job.math);
            assert!((t - t0).abs() < 1e-6 * t0, "{b:?}: {t} vs {t0}");
        }
        // In half precision the compute-bound version gains more than the memory-bound one.
        let half = |b| {
            let j = at_bound(&job, &src, b);
            j.recost_ns(500_000, &j.local.ops[0].work.unwrap(), Dtype::Fp16, 1.0)
        };
        assert!(half(Bound::Compute) < half(Bound::Memory));
    }
}
