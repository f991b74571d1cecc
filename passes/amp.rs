//! `amp`: automatic mixed precision (Daydream §5.1 / Appendix A.1, Micikevicius et al. 2018):
//! forward and backward compute in fp16 (or bf16), fp32 master weights and optimizer.
//!
//! **When it applies.** A job costed in fp32 (or tf32) on a GPU with half-precision peaks;
//! `dtype=bf16` needs a bf16 matrix (tensor-core) peak in the GPU's config (a V100 has none:
//! refused). A job already in half precision is refused.
//!
//! ```text
//! before:  FW(l) [fp32]                      ─ … ─ BW(l) [fp32]          ─ sync 4 B/param ─ UPDATE [fp32]
//! after:   cast(w: fp32→fp16) ─ FW(l) [fp16] ─ … ─ BW(l) [fp16]         ─ sync 4 B/param ─ UPDATE [fp32]
//!          activations ÷ 2 · static + 2 B/param (the fp16 weight copy) · sync ÷ 2 with fp16_allreduce=1
//! ```
//!
//! **Cost model.** Daydream shrinks kernels by fixed factors (3× for sgemm/cudnn, 2× for the
//! rest). Here every FW/BW op with [`OpWork`] is re-costed by the kernel model in the half dtype
//! (`Job::recost_ns(dur, work, half, 1)`: the model's time on a zoo job; on a trace, the
//! recorded time × model(half) / model(recorded dtype), so the kernel keeps its measured
//! efficiency): matrix ops run against the GPU's half-precision matrix peak,
//! vector ops against its half vector peak, and every element moves in 2 bytes instead of 4 — so
//! the speed-up of each op follows from the GPU config (a large GEMM on a V100: 125/15.7 ≈ 8×
//! when compute-bound, an element-wise op: 2×, launch-bound ops: ~1×). The element counts do not
//! change (weights and weight gradients are counted at 2 bytes too: autocast's fp16 weight copy,
//! and fp16 weight gradients before the cast back). A GPU op without work (a trace kernel) has no
//! known class, so it is scaled by the ratio the roofline gives a typical memory-bound op
//! (2^24 elements, one FLOP each): the conservative choice. UPDATE ops stay fp32 (master
//! weights) and CPU ops keep their time. One cast kernel per weight tensor is inserted before
//! its layer's first FW op: read 4 B + write 2 B per parameter at the GPU's memory bandwidth plus
//! one launch (with its CPU launch when the job has CPU threads; zoo jobs have none). Memory: the
//! activations saved by FW/BW ops are halved; static memory gains 2 B per parameter (fp16 weight
//! copy; master weights, gradients and optimizer state stay fp32). Gradients stay fp32 in
//! PyTorch native AMP, so sync bytes are unchanged unless `fp16_allreduce=1` (Horovod's
//! `Compression.fp16`) halves them. The job's dtype becomes the half dtype, so later passes
//! re-cost FW/BW ops consistently.
//!
//! **Styles.** `style=autocast` is the above: autocast around an FP32 model. `style=pure` is a
//! model stored in half precision with FP32 master weights in the optimizer (DeepSpeed's
//! fp16/bf16, Megatron-LM's --fp16/--bf16, apex O2; Micikevicius et al. 2018's own recipe):
//! autocast's FP32 operator classes (softmax, norms, reductions, the loss) run and save in half
//! too, the gradients are half (their buffers and shards: the effects of the gradients'
//! communication ops) and reduced in half — except Megatron-LM's bf16 models, whose gradients
//! it accumulates and reduces in FP32
//! ([`crate::cost::framework::Framework::keeps_fp32_grads`]). Static memory is autocast's: the
//! half weights beside the FP32 master weights (2 + 4 B per parameter) and the optimizer state, with ZeRO's
//! sharding of them (stages 1–2: the half weights whole, the rest sharded). The copy of the updated master
//! weights into the model (read 4 B, write 2 B per parameter) is priced as the autocast casts
//! are, one kernel per weight before its layer's forward. The FP32 gradients the optimizer
//! steps on (4 B per parameter the rank updates, from the first update kernel to the last) are
//! the graph's memory effects when it is expanded (`Job::master_grad_bytes`), so they follow
//! sharding and pipeline stages whichever pass runs first. `style=framework` (default) is the job's
//! framework's (`Framework::default_amp_style`: pure for deepspeed, autocast elsewhere); `pure`
//! is refused on a framework whose export applies autocast (the plan would not be what runs).
//!
//! **Knobs.** `dtype` = `fp16` (default) | `bf16`; `fp16_allreduce` = 0 (default) | 1;
//! `style` = `framework` (default) | `autocast` | `pure`.
//!
//! **Framework knobs** (DESIGN.md table): PyTorch `torch.autocast(dtype=…)` +
//! `torch.amp.GradScaler` (fp16 only), Horovod `compression=hvd.Compression.fp16` when
//! `fp16_allreduce=1`, TF mixed-precision policy `mixed_float16` / `mixed_bfloat16`, JAX dtype
//! policy.

use super::{Edit, Evaluated, KnobSpec, Knobs, Pass, PassError, Patch};
use crate::cost::compute::ns;
use crate::cost::config::Dtype;
use crate::cost::framework::{AmpStyle, Math, Precision};
use crate::cost::kernel::OpClass;
use crate::graph::job::{CollectiveKind, Job, OpWork};
use crate::graph::{DeviceKind, MemEffect, OpId, OpKind, OpSpec, Phase};

/// The `amp` pass.
pub struct Amp;

const NAME: &str = "amp";

/// The half dtype a `dtype` knob names (`fp16`, `float16`, `half`, `bf16`, `bfloat16`; any
/// case, spaces around ignored), or `None`: the one set the pass, the plan reader and the
/// exports accept.
pub fn half_dtype(raw: &str) -> Option<Dtype> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "fp16" | "float16" | "half" => Some(Dtype::Fp16),
        "bf16" | "bfloat16" => Some(Dtype::Bf16),
        _ => None,
    }
}

impl Pass for Amp {
    fn name(&self) -> &str {
        NAME
    }
    fn doc(&self) -> &str {
        "automatic mixed precision: FW/BW re-costed in fp16/bf16 by the roofline, fp32 master weights (Daydream)"
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        vec![
            KnobSpec::text("dtype", "half-precision dtype: fp16 or bf16", "fp16"),
            KnobSpec::int(
                "fp16_allreduce",
                "1: all-reduce gradients in fp16 (Horovod Compression.fp16), halving sync bytes",
                0,
                0,
                1,
            ),
            KnobSpec::text(
                "style",
                "framework (its default), autocast (FP32 model, per-op casts) or pure (the model in half, FP32 master weights: DeepSpeed, Megatron-LM, apex O2)",
                "framework",
            ),
        ]
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        let bad = |v: &str, why: &str| PassError::BadKnob {
            pass: NAME.into(),
            knob: "dtype".into(),
            value: v.into(),
            why: why.into(),
        };
        let raw = knobs.text("dtype").trim();
        let Some(half) = half_dtype(raw) else {
            return Err(bad(raw, "must be fp16 or bf16"));
        };
        let job = &cx.job;
        if job.meta.offload {
            return Err(PassError::NotApplicable {
                pass: NAME.into(),
                why: "apply amp before shard with offload=1: the offloaded step's copies and host memory are priced in the job's precision".into(),
            });
        }
        if !job.gpu.matrix_tflops.contains_key(&half) {
            if half == Dtype::Bf16 {
                return Err(bad(
                    raw,
                    &format!(
                        "GPU {} has no bf16 matrix peak (no bf16 tensor cores)",
                        job.gpu.name
                    ),
                ));
            }
            tracing::warn!(
                gpu = job.gpu.name,
                "no fp16 matrix peak: matrix ops get only the fp16 vector peak"
            );
        }
        if job.dtype.bytes() <= half.bytes() {
            return Err(PassError::NotApplicable {
                pass: NAME.into(),
                why: format!("the job already computes in {:?}", job.dtype),
            });
        }
        let fp16_allreduce = knobs.int("fp16_allreduce") == 1;
        let raw_style = knobs.text("style").trim();
        let style = match amp_style(raw_style) {
            Some(s) => s.unwrap_or(job.framework.default_amp_style()),
            None => {
                return Err(PassError::BadKnob {
                    pass: NAME.into(),
                    knob: "style".into(),
                    value: raw_style.into(),
                    why: "must be framework, autocast or pure".into(),
                });
            }
        };
        if style == AmpStyle::Pure && job.framework.default_amp_style() != AmpStyle::Pure {
            // A plan is applied by its framework's export: PyTorch's, TensorFlow's, JAX's and
            // Horovod's AMP is autocast (`--amp-style pure` describes a baseline that already
            // runs the model in half, such as apex O2 or Megatron-LM).
            return Err(PassError::BadKnob {
                pass: NAME.into(),
                knob: "style".into(),
                value: raw_style.into(),
                why: format!(
                    "the model in half is DeepSpeed's AMP (--framework deepspeed); {}'s export applies autocast",
                    job.framework
                ),
            });
        }
        Ok(vec![amp_patch(job, half, fp16_allreduce, style)])
    }
}

/// The style a `style` knob names: `Some(None)` for `framework` (the job's framework's),
/// `None` when it names none.
pub fn amp_style(raw: &str) -> Option<Option<AmpStyle>> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "framework" | "" => Some(None),
        "autocast" => Some(Some(AmpStyle::Autocast)),
        "pure" => Some(Some(AmpStyle::Pure)),
        _ => None,
    }
}

/// `job` (built in FP32) at the precision a run uses: `None` is the framework's default (its
/// TF32 use on GPUs that have it); `fp32` switches TF32 off, `tf32` uses it for every matrix
/// class; `fp16`/`bf16` apply this pass (mixed precision, FP32 master weights); `fp8` is bf16
/// mixed precision with GEMMs on the FP8 tensor cores, on GPUs with an FP8 peak.
///
/// `channels_last` sets the activations' layout (default: the framework's: NCHW for PyTorch,
/// NHWC for TensorFlow and JAX); `style` how mixed precision holds the model (default: the
/// framework's).
pub fn with_precision(
    job: &Job,
    precision: Option<Precision>,
    style: Option<AmpStyle>,
    channels_last: Option<bool>,
) -> Result<Job, PassError> {
    let bad = |why: String| PassError::NotApplicable {
        pass: "--precision".into(),
        why,
    };
    if job.dtype != Dtype::Fp32 {
        return Err(bad(format!(
            "the job is already in {:?}; --precision starts from an FP32 job",
            job.dtype
        )));
    }
    let mut out = job.clone();
    let layout = channels_last.unwrap_or(job.framework.default_math(&job.gpu).channels_last);
    let recost = |mut j: Job, math: Math| {
        j.math = Math {
            channels_last: layout,
            pure_half: j.math.pure_half,
            ..math
        };
        for i in 0..j.local.ops.len() {
            if let Some(w) = j.local.ops[i].work {
                j.local_mut().ops[i].spec.dur_ns = j.cost_ns(&w, j.dtype, 1.0);
            }
        }
        j
    };
    out = recost(out, job.framework.default_math(&job.gpu));
    let half = match precision {
        None => return Ok(out),
        Some(Precision::Fp32) => return Ok(recost(out, Math::FP32)),
        Some(Precision::Tf32) => {
            if !job.gpu.matrix_tflops.contains_key(&Dtype::Tf32) {
                return Err(bad(format!(
                    "GPU {} has no TF32 tensor cores (no tf32 matrix peak in its config)",
                    job.gpu.name
                )));
            }
            return Ok(recost(out, Math::TF32));
        }
        Some(Precision::Fp16) => Dtype::Fp16,
        Some(Precision::Bf16) | Some(Precision::Fp8) => Dtype::Bf16,
    };
    for need in [
        Some(half),
        (precision == Some(Precision::Fp8)).then_some(Dtype::Fp8),
    ]
    .into_iter()
    .flatten()
    {
        if need != Dtype::Fp16 && !job.gpu.matrix_tflops.contains_key(&need) {
            return Err(bad(format!(
                "GPU {} has no {} matrix peak in its config",
                job.gpu.name,
                format!("{need:?}").to_lowercase()
            )));
        }
    }
    let style = style.unwrap_or(job.framework.default_amp_style());
    let mut out = super::apply(&out, &amp_patch(&out, half, false, style))?;
    if precision == Some(Precision::Fp8) {
        let math = Math {
            conv: Dtype::Bf16,
            matmul: Dtype::Fp8,
            channels_last: layout,
            pure_half: out.math.pure_half,
        };
        out = recost(out, math);
    }
    Ok(out)
}

/// Ratio half/full time the roofline gives a typical memory-bound op (2^24 elements, 1 FLOP
/// each, one kernel): what a trace kernel of unknown class is scaled by.
pub fn memory_bound_ratio(job: &Job, half: Dtype) -> f64 {
    let e = (1u64 << 24) as f64;
    let w = OpWork::new(OpClass::Elementwise, e, 2.0 * e, 0.0, 1);
    let t = |d: Dtype| job.kernels().time_ns(&w, d, job.math);
    t(half) / t(job.dtype)
}

/// The AMP patch: compute re-costed in `half`, half-precision activations, the fp16 weight
/// copy, the weight casts, optionally fp16 gradients, then the job's dtype. `Pure` (the model
/// in half) also runs autocast's FP32 classes in half, keeps no extra copy (the master weights
/// take the FP32 weights' and gradients' bytes) and reduces the half gradients.
fn amp_patch(job: &Job, half: Dtype, fp16_allreduce: bool, style: AmpStyle) -> Patch {
    let l = &job.local;
    let pure = style == AmpStyle::Pure;
    let fp16_allreduce = fp16_allreduce || (pure && !job.framework.keeps_fp32_grads(half));
    let math = Math {
        pure_half: pure,
        ..job.math
    };
    let (mut edits, before_ns, after_ns) = if math == job.math {
        recost_in_half(job, half)
    } else {
        let mut j = job.clone();
        j.math = math;
        recost_in_half(&j, half)
    };
    edits.push(Edit::Math(math));
    let half_grads = pure && fp16_allreduce;
    let act_saved = half_activations(job, half, pure, half_grads, &mut edits);
    // The fp16 weight copy, and one cast kernel per weight tensor before its layer's first FW.
    // A job sharded at stage 3 keeps only its shard of the copy (DeepSpeed's fp16 partition;
    // FSDP2 casts the shard before gathering it), and every parameter all-gather moves the
    // half-precision parameters (FSDP2's `MixedPrecisionPolicy(param_dtype)`, ZeRO's fp16
    // params). The gathered units' memory is an effect of forward/backward ops: halved with the
    // activations.
    let params: u64 = l.tensors.iter().map(|t| t.bytes / job.dtype.bytes()).sum();
    let copy = params * half.bytes();
    edits.push(Edit::StaticMemory {
        bytes: static_with_half_copy(job, copy),
    });
    let cast_ns = weight_casts(job, half, cast_launch_ns(job), &mut edits);
    let factor = half.bytes() as f64 / job.dtype.bytes() as f64;
    let gathers: Vec<usize> = (0..job.syncs.len())
        .filter(|&i| job.syncs[i].kind == CollectiveKind::AllGather)
        .collect();
    if fp16_allreduce {
        edits.push(Edit::ScaleSyncBytes {
            syncs: (0..job.syncs.len()).collect(),
            factor,
        });
    } else if !gathers.is_empty() {
        edits.push(Edit::ScaleSyncBytes {
            syncs: gathers,
            factor,
        });
    }
    edits.push(Edit::Dtype(half));
    Patch {
        pass: NAME.into(),
        why: format!(
            "{half:?} forward/backward ({}): GPU FW+BW {:.2} ms → {:.2} ms by the roofline (+{:.2} ms of {} weight {}); activations {:.2} GB → {:.2} GB; {}; gradients all-reduced in {}",
            if pure {
                "the model in half, FP32 master weights"
            } else {
                "autocast"
            },
            before_ns as f64 / 1e6,
            after_ns as f64 / 1e6,
            cast_ns as f64 / 1e6,
            l.tensors.len(),
            if pure {
                "copies from the master weights"
            } else {
                "casts"
            },
            act_saved as f64 / 1e9,
            (act_saved * half.bytes()).div_ceil(job.dtype.bytes()) as f64 / 1e9,
            if pure {
                format!(
                    "+{:.2} GB of half weights beside the FP32 master weights; gradients in half",
                    copy as f64 / 1e9
                )
            } else {
                format!("+{:.2} GB fp16 weight copy", copy as f64 / 1e9)
            },
            if fp16_allreduce {
                format!("{half:?}").to_lowercase()
            } else {
                "fp32".into()
            },
        ),
        edits,
    }
}

/// Static bytes once mixed precision adds its `copy` bytes of half-precision weights. A
/// sharded job (parameter all-gathers over groups of g): at stage 3 each rank keeps 1/g of the
/// copy; at stages 1–2 the whole copy, and its FP32 weights become master weights sharded with
/// the optimizer state (ZeRO's 2Ψ + 12Ψ/N, Rajbhandari et al. §5).
fn static_with_half_copy(job: &Job, copy: u64) -> u64 {
    let l = &job.local;
    let Some(gather) = job
        .syncs
        .iter()
        .find(|s| s.kind == CollectiveKind::AllGather)
    else {
        return l.static_mem_bytes + copy;
    };
    let g = u64::from(if gather.group.size == 0 {
        job.workers
    } else {
        gather.group.size
    })
    .max(1);
    let stage3 = job.syncs.iter().any(|s| {
        s.kind == CollectiveKind::AllGather
            && s.ready.iter().any(|&r| {
                l.ops
                    .get(r as usize)
                    .is_some_and(|o| o.spec.phase == Phase::Fw)
            })
    });
    if stage3 {
        return l.static_mem_bytes + copy.div_ceil(g);
    }
    let fp32: u64 = l.tensors.iter().map(|t| t.bytes).sum();
    l.static_mem_bytes - fp32.min(l.static_mem_bytes) + fp32.div_ceil(g) + copy
}

/// The GPU's forward and backward ops in `half`: an op with work re-costed by the roofline
/// (`Job::recost_ns`), one without scaled by [`memory_bound_ratio`]. Returns the edits and the
/// ops' total time before and after, ns.
fn recost_in_half(job: &Job, half: Dtype) -> (Vec<Edit>, u64, u64) {
    let l = &job.local;
    let mut edits = Vec::new();
    let (mut before_ns, mut after_ns) = (0u64, 0u64);
    let ratio = memory_bound_ratio(job, half);
    let is_gpu = |d: u32| {
        matches!(
            l.devices.get(d as usize),
            Some(DeviceKind::GpuStream { .. })
        )
    };
    let mut untyped = Vec::new();
    for (i, op) in l.ops.iter().enumerate() {
        let s = &op.spec;
        if s.kind.is_virtual() || !matches!(s.phase, Phase::Fw | Phase::Bw) || !is_gpu(s.device) {
            continue;
        }
        before_ns += s.dur_ns;
        match &op.work {
            Some(w) => {
                let d = job.recost_ns(s.dur_ns, w, half, 1.0);
                after_ns += d;
                edits.push(Edit::SetDuration {
                    op: i as OpId,
                    dur_ns: d,
                });
            }
            None => {
                after_ns += (s.dur_ns as f64 * ratio).round() as u64;
                untyped.push(i as OpId);
            }
        }
    }
    if !untyped.is_empty() {
        edits.push(Edit::Scale {
            ops: untyped,
            factor: ratio,
        });
    }
    (edits, before_ns, after_ns)
}

/// Saved activations in half precision: the memory effects of forward and backward ops
/// shrunk by `half`'s size over the job's dtype, except autocast's FP32 ops (which keep FP32
/// outputs and what they save) unless the model is `pure` half, gradient buffers (the
/// effects of communication ops) with `half_grads`, and dropout masks (one byte per element in any
/// dtype: PyTorch's `native_dropout` returns a bool mask). Pushes one `SetMem` per op;
/// returns the activation bytes allocated before (alloc-at-start effects of FW/BW ops).
fn half_activations(
    job: &Job,
    half: Dtype,
    pure: bool,
    half_grads: bool,
    edits: &mut Vec<Edit>,
) -> u64 {
    let l = &job.local;
    let mut by_op: std::collections::BTreeMap<OpId, Vec<MemEffect>> = Default::default();
    let fp32_op = |op: OpId| {
        !pure
            && l.ops[op as usize]
                .work
                .is_some_and(|w| w.class.runs_in_fp32())
    };
    let halves = |m: &MemEffect| -> bool {
        let op = &l.ops[m.op as usize];
        // A dropout's mask (what it saves) is one byte per element in any dtype.
        let mask = m.when != crate::graph::MemWhen::During
            && op.work.is_some_and(|w| w.class == OpClass::Dropout);
        match op.spec.phase {
            // Autocast's FP32 ops keep FP32 outputs (and what they save).
            Phase::Fw | Phase::Bw => !fp32_op(m.op) && !mask,
            // A half model's gradients (the buffers its gradients' communication ops hold),
            // unless they stay FP32 ([`crate::cost::framework::Framework::keeps_fp32_grads`]).
            Phase::Comm => half_grads,
            _ => false,
        }
    };
    // `SetMem` replaces all of an op's effects: an op with one effect to halve gets all of
    // them, the others unchanged.
    let touched: std::collections::BTreeSet<OpId> =
        l.mem.iter().filter(|m| halves(m)).map(|m| m.op).collect();
    for m in l.mem.iter().filter(|m| touched.contains(&m.op)) {
        let bytes = if halves(m) {
            (m.bytes * half.bytes()).div_ceil(job.dtype.bytes())
        } else {
            m.bytes
        };
        by_op
            .entry(m.op)
            .or_default()
            .push(MemEffect { bytes, ..*m });
    }
    let act_saved: u64 = l
        .mem
        .iter()
        .filter(|m| m.when == crate::graph::MemWhen::AllocAtStart)
        .filter(|m| matches!(l.ops[m.op as usize].spec.phase, Phase::Fw | Phase::Bw))
        .map(|m| m.bytes)
        .sum();
    for (op, effects) in by_op {
        edits.push(Edit::SetMem { op, effects });
    }
    act_saved
}

/// The host's cost of issuing one weight cast (autocast's `aten::to` per weight): priced by
/// the host model when a zoo job's ops carry launches, the median recorded launch for a trace
/// (its launches are recorded, not modelled), none when the job has no launches.
fn cast_launch_ns(job: &Job) -> Option<u64> {
    let l = &job.local;
    if !l.ops.iter().any(|o| o.spec.kind == OpKind::Launch) {
        return None;
    }
    Some(match job.meta.source.as_str() {
        "zoo" => ns(job.host.op_ns(OpClass::Copy, false, 1)),
        _ => {
            let mut v: Vec<u64> = l
                .ops
                .iter()
                .filter(|o| o.spec.kind == OpKind::Launch)
                .map(|o| o.spec.dur_ns)
                .collect();
            v.sort_unstable();
            v[v.len() / 2]
        }
    })
}

/// One cast kernel per weight tensor before each forward run of its layer (autocast's cast
/// cache lives for one autocast region: one micro-step, and again in a checkpoint's re-run),
/// after that run's forward predecessors. Pushes the inserts; returns their total time, ns.
fn weight_casts(job: &Job, half: Dtype, launch_ns: Option<u64>, edits: &mut Vec<Edit>) -> u64 {
    let l = &job.local;
    let mut preds: Vec<Vec<OpId>> = vec![Vec::new(); l.ops.len()];
    for &(a, b) in &l.edges {
        preds[b as usize].push(a);
    }
    let mut cast_ns = 0u64;
    let fw_runs: Vec<(usize, &crate::graph::job::LocalOp)> = l
        .ops
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            o.spec.kind == OpKind::Compute
                && o.spec.phase == Phase::Fw
                && o.spec.tensor == crate::graph::NONE
        })
        .collect();
    for (ti, t) in l.tensors.iter().enumerate() {
        for &(f, fop) in fw_runs.iter().filter(|(_, o)| o.spec.layer == t.layer) {
            let elems = (t.bytes / job.dtype.bytes()) as f64;
            // Read 4 B, write 2 B per parameter = 3 half-precision elements.
            let work = OpWork::new(
                OpClass::Elementwise,
                0.0,
                0.0,
                elems * (job.dtype.bytes() + half.bytes()) as f64 / half.bytes() as f64,
                1,
            );
            let dur = job.cost_ns(&work, half, 1.0);
            cast_ns += dur;
            let mut after: Vec<OpId> = preds[f]
                .iter()
                .copied()
                .filter(|&p| {
                    l.ops[p as usize].spec.phase == Phase::Fw
                        && l.ops[p as usize].spec.kind != OpKind::Launch
                })
                .collect();
            after.sort_unstable();
            after.dedup();
            edits.push(Edit::Insert {
                spec: OpSpec {
                    tensor: ti as u32,
                    ..OpSpec::compute(fop.spec.device, Phase::Fw, t.layer, dur)
                },
                work: Some(work),
                after,
                before: vec![f as OpId],
                launch_ns,
            });
        }
    }
    cast_ns
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::config::load_gpu;
    use crate::passes::recompute::tests::chain;
    use crate::passes::{apply_all, evaluate, find, registry, resolve_knobs};

    /// Bytes the forward ops that `keep` selects allocate at their start (what they save).
    fn fw_saved(e: &Evaluated, keep: impl Fn(&crate::graph::job::LocalOp) -> bool) -> u64 {
        e.job
            .local
            .mem
            .iter()
            .filter(|m| m.when == crate::graph::MemWhen::AllocAtStart)
            .filter(|m| {
                let o = &e.job.local.ops[m.op as usize];
                o.spec.phase == Phase::Fw && keep(o)
            })
            .map(|m| m.bytes)
            .sum()
    }

    fn run(job: Job, args: &[(&str, &str)]) -> Result<(Evaluated, Evaluated), PassError> {
        let reg = registry();
        let p = find(&reg, NAME).unwrap();
        let given: Vec<(String, String)> = args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let knobs = resolve_knobs(p, &given)?;
        let base = evaluate(job).unwrap();
        let patches = p.propose(&base, &knobs)?;
        let after = evaluate(apply_all(&base.job, &patches)?).unwrap();
        Ok((base, after))
    }

    /// Bytes of the gradient buffers: the allocations of the syncs' `Out` ops.
    fn grads(e: &Evaluated) -> u64 {
        e.job
            .local
            .mem
            .iter()
            .filter(|m| e.job.syncs.iter().any(|s| s.ready.contains(&m.op)))
            .map(|m| m.bytes)
            .sum()
    }

    #[test]
    fn chain_in_fp16_on_a_v100() {
        // Two layers, FW 1000 / 3000 ns (hand-set), work flops 1e4·t (matrix, no shapes), act
        // elems t. fp16 on V100: 125 TFLOP/s × Volta's tensor-core GEMM efficiency; 2 B at
        // 900 GB/s × its memory efficiency; one launch floor (4 µs). The re-costing uses the
        // work, not the old duration.
        let job = chain(&[1000, 3000], &[1000, 3000]);
        let a = job.gpu.kernels.clone();
        let (rate, bw) = (
            125e3 * a.gemm_efficiency.tensor_core,
            900.0 * a.memory_efficiency,
        );
        let c = |t: f64| (1e4 * t / rate).max(2.0 * t / bw) + 4000.0;
        let (base, after) = run(job.clone(), &[]).unwrap();
        let fwbw: u64 = [1000.0, 3000.0, 2000.0, 6000.0]
            .iter()
            .map(|&t| c(t).round() as u64)
            .sum();
        // Cast of l0.weight: 1000 B = 250 params → 750 half elements · 2 B, one launch.
        let cast = (1500.0_f64 / bw + 4000.0).round() as u64;
        assert!((4001..4005).contains(&cast), "{cast}");
        assert_eq!(base.iteration_ns(), 13_000);
        assert_eq!(after.iteration_ns(), fwbw + cast + 1000);
        // Activations halved, + 2 B/param.
        assert_eq!(base.memory.peak_bytes, 1_004_000);
        assert_eq!(after.memory.peak_bytes, 1_000_000 + 250 * 2 + 500 + 1500);
        assert_eq!(after.job.dtype, Dtype::Fp16);
        assert_eq!(after.job.syncs[0].bytes, 1000);
        // fp16_allreduce halves the sync bytes.
        let (_, after) = run(job, &[("fp16_allreduce", "1")]).unwrap();
        assert_eq!(after.job.syncs[0].bytes, 500);
    }

    #[test]
    fn factors_come_from_the_gpu_config() {
        let job = chain(&[1000], &[0]);
        // Memory-bound: the same bytes in half the size → ratio (2^24·2·2/bw + 4000) /
        // (2^24·2·4/bw + 4000) on a V100 (vector compute is far below the memory time).
        let e = (1u64 << 24) as f64;
        let bw = 900.0 * job.gpu.kernels.memory_efficiency;
        let expect = (4.0 * e / bw + 4000.0) / (8.0 * e / bw + 4000.0);
        assert!((memory_bound_ratio(&job, Dtype::Fp16) - expect).abs() < 1e-12);
        assert!(memory_bound_ratio(&job, Dtype::Fp16) > 0.5);
    }

    #[test]
    fn bf16_needs_bf16_tensor_cores_and_bad_dtypes_are_refused() {
        let job = chain(&[1000], &[0]);
        let e = run(job.clone(), &[("dtype", "bf16")]).unwrap_err();
        assert!(e.to_string().contains("bf16"), "{e}");
        let e = run(job.clone(), &[("dtype", "int8")]).unwrap_err();
        assert!(e.to_string().contains("fp16 or bf16"), "{e}");
        assert!(run(job.clone(), &[("fp16_allreduce", "2")]).is_err());
        let mut a100 = job;
        a100.gpu = load_gpu("a100-80gb").unwrap();
        let (_, after) = run(a100.clone(), &[("dtype", "bf16")]).unwrap();
        assert_eq!(after.job.dtype, Dtype::Bf16);
        // Applying AMP twice is refused.
        let e = run(after.job, &[]).unwrap_err();
        assert!(e.to_string().contains("already"), "{e}");
    }

    #[test]
    fn resnet50_on_v100_speeds_up_and_halves_activations() {
        let (m, job) = crate::zoo::build::test_job("resnet50", 32, "dpro-16xv100-rdma");
        let params = m.param_elems();
        let (base, after) = run(job, &[]).unwrap();
        let (s0, s1) = (
            base.job.local.static_mem_bytes,
            after.job.local.static_mem_bytes,
        );
        assert_eq!(s1, s0 + 2 * params);
        // Saved activations halve (rounded up per effect), but for autocast's FP32 ops (here
        // the loss); the peak falls.
        let saved = |e: &Evaluated, fp32: bool| {
            fw_saved(e, |o| {
                o.work.is_some_and(|w| w.class.runs_in_fp32()) == fp32
            })
        };
        let (a0, a1) = (saved(&base, false), saved(&after, false));
        assert!(a1 * 2 >= a0 && a1 * 2 <= a0 + 200, "{a1} vs {a0}");
        assert_eq!(saved(&base, true), saved(&after, true));
        assert!(saved(&base, true) > 0);
        assert!(after.memory.peak_bytes < base.memory.peak_bytes);
        let speedup = base.iteration_ns() as f64 / after.iteration_ns() as f64;
        // Below the tensor-core 8× bound; above 1.3× although the host's dispatch and the
        // per-tensor all-reduces over 16 GPUs do not shrink with fp16 (measured 1.49×).
        assert!(speedup > 1.3 && speedup < 8.0, "{speedup}");
        // One cast per weight tensor, each issued by the host (its launch op).
        let casts = after.job.local.ops.len() - base.job.local.ops.len();
        assert_eq!(casts, 2 * base.job.local.tensors.len());
    }

    #[test]
    fn pure_half_halves_every_activation_and_the_gradients() {
        let (m, job) = crate::zoo::build::test_job("bert-base", 8, "8xv100");
        let params = m.param_elems();
        let (base, auto) = run(job.clone(), &[("style", "autocast")]).unwrap();
        let mut ds = job.clone();
        ds.framework = crate::cost::framework::Framework::Deepspeed;
        let (_, pure) = run(ds.clone(), &[("style", "pure")]).unwrap();
        // PyTorch's export applies autocast: the pass refuses the other style there.
        let e = run(job.clone(), &[("style", "pure")]).unwrap_err();
        assert!(e.to_string().contains("--framework deepspeed"), "{e}");
        // The framework's style is pytorch's: autocast.
        let (_, dflt) = run(job.clone(), &[]).unwrap();
        assert_eq!(
            dflt.job.local.static_mem_bytes,
            auto.job.local.static_mem_bytes
        );
        // Both keep 2 B of half weights beside 4 B of FP32 (master) weights per parameter.
        let s0 = base.job.local.static_mem_bytes;
        assert_eq!(auto.job.local.static_mem_bytes, s0 + 2 * params);
        assert_eq!(pure.job.local.static_mem_bytes, s0 + 2 * params);
        // Gradient buffers: FP32 under autocast, half in a half model.
        assert_eq!(grads(&auto), grads(&base));
        assert_eq!(grads(&base), 4 * params);
        assert!(grads(&pure) * 2 >= grads(&base) && grads(&pure) * 2 <= grads(&base) + 1000);
        // Softmax, LayerNorm and the loss keep FP32 under autocast, not in a half model.
        let saved = |e: &Evaluated| {
            let fp32 =
                |o: &crate::graph::job::LocalOp| o.work.is_some_and(|w| w.class.runs_in_fp32());
            (fw_saved(e, |o| !fp32(o)), fw_saved(e, fp32))
        };
        let ((h0, f0), (h1, f1), (h2, f2)) = (saved(&base), saved(&auto), saved(&pure));
        assert!(f0 > 0 && h0 > 0);
        assert_eq!(f1, f0);
        assert_eq!(h2, h1);
        assert!(f2 * 2 >= f0 && f2 * 2 <= f0 + 1000, "{f2} vs {f0}");
        assert!(pure.memory.peak_bytes < auto.memory.peak_bytes);
        // Dropout masks are one byte per element in every dtype: what dropout ops save is
        // unchanged by either style.
        let masks =
            |e: &Evaluated| fw_saved(e, |o| o.work.is_some_and(|w| w.class == OpClass::Dropout));
        assert!(masks(&base) > 0);
        assert_eq!(masks(&auto), masks(&base));
        assert_eq!(masks(&pure), masks(&base));
        // Half gradients are reduced in half.
        let bytes = |e: &Evaluated| e.job.syncs.iter().map(|s| s.bytes).sum::<u64>();
        assert_eq!(bytes(&auto), bytes(&base));
        assert!(bytes(&pure) * 2 <= bytes(&base) + base.job.syncs.len() as u64);
        // FP32 classes run in half: faster than under autocast, which casts around them.
        assert!(pure.job.math.pure_half && !auto.job.math.pure_half);
        assert!(pure.iteration_ns() < auto.iteration_ns());
        // A framework whose AMP is the model in half gets it by default.
        let (_, d) = run(ds, &[]).unwrap();
        assert!(d.job.math.pure_half);
        assert_eq!(d.iteration_ns(), pure.iteration_ns());
        let e = run(base.job.clone(), &[("style", "o2")]).unwrap_err();
        assert!(e.to_string().contains("framework, autocast or pure"), "{e}");
    }

    /// A model kept in half steps on FP32 copies of its gradients (DeepSpeed's and Megatron-LM's
    /// fp16 optimizers): 4 B per parameter the rank updates, live through the step: on top of
    /// the states and half gradients, not the activations, which are freed by then.
    #[test]
    fn a_half_model_steps_on_fp32_gradients() {
        use crate::cost::framework::Framework;
        let (m, job) = crate::zoo::build::test_job("gpt", 1, "8xh200");
        let params = m.param_elems();
        let with = |fw: Framework, args: &[(&str, &str)]| {
            let mut j = job.clone();
            j.framework = fw;
            run(j, args).unwrap().1
        };
        let ds = with(Framework::Deepspeed, &[]);
        assert!(ds.job.math.pure_half);
        assert_eq!(ds.job.master_grad_bytes(), 4 * params);
        // The step's peak: the states, the half gradients and their FP32 copies.
        let step = ds.job.local.static_mem_bytes + grads(&ds) + 4 * params;
        assert!(
            ds.memory.peak_bytes >= step,
            "{} < {step}",
            ds.memory.peak_bytes
        );
        // Held from the first update kernel's start to the last one's end, on every rank.
        let g = ds.job.expand_data_parallel().unwrap();
        let kernels = ds.job.step_kernels();
        let per = ds.job.local.ops.len() as u32;
        let held: Vec<_> = g
            .mem_effects()
            .iter()
            .filter(|e| e.worker == 0 && e.bytes == 4 * params)
            .map(|e| (e.op, e.when))
            .collect();
        assert_eq!(
            held,
            vec![
                (kernels[0], crate::graph::MemWhen::AllocAtStart),
                (*kernels.last().unwrap(), crate::graph::MemWhen::FreeAtEnd)
            ]
        );
        assert!(kernels.len() > 1 && kernels[0] < per);
        // A pipeline's stages each hold their own layers' share.
        let reg = registry();
        let pp = find(&reg, "pipeline").unwrap();
        let given = [("stages", "2"), ("microbatches", "2")].map(|(k, v)| (k.into(), v.into()));
        let knobs = resolve_knobs(pp, &given).unwrap();
        let piped = apply_all(&ds.job, &pp.propose(&ds, &knobs).unwrap()).unwrap();
        assert_eq!(piped.master_grad_bytes(), 4 * params);
        let g = piped.expand().unwrap();
        let by_rank = |r: u32| {
            g.mem_effects()
                .iter()
                .filter(|e| {
                    e.worker == r
                        && e.when == crate::graph::MemWhen::AllocAtStart
                        && g.phase(e.op) == crate::graph::Phase::Update
                })
                .map(|e| e.bytes)
                .sum::<u64>()
        };
        let (a, b) = (by_rank(0), by_rank(1));
        assert!(
            a > 0 && b > 0 && a < 4 * params && b < 4 * params,
            "{a} {b}"
        );
        assert!((a + b).abs_diff(4 * params) <= 2, "{a} + {b}");
        // Megatron-LM: its fp16 model as DeepSpeed's; its bf16 model accumulates in FP32.
        let fp16 = with(Framework::Megatron, &[("dtype", "fp16")]);
        assert_eq!(fp16.job.master_grad_bytes(), 4 * params);
        assert_eq!(fp16.memory.peak_bytes, ds.memory.peak_bytes);
        let bf16 = with(Framework::Megatron, &[("dtype", "bf16")]);
        assert_eq!(bf16.job.master_grad_bytes(), 0);
        // Autocast keeps FP32 gradients: nothing more to hold.
        let auto = with(Framework::Pytorch, &[]);
        assert!(!auto.job.math.pure_half);
        assert_eq!(auto.job.master_grad_bytes(), 0);
        // Sharded (ZeRO-1 over the 8 ranks), each rank converts its own partition; offloaded,
        // the host does.
        let zero = |offload: bool| {
            let s = crate::passes::shard::Sharding {
                stage: 1,
                replicas: 1,
                reshard: true,
                prefetch: 1,
                offload,
            };
            evaluate(crate::passes::shard::shard(&ds.job, s).unwrap()).unwrap()
        };
        let z1 = zero(false);
        assert_eq!(z1.job.master_grad_bytes(), (4 * params).div_ceil(8));
        assert!(z1.memory.peak_bytes >= z1.job.local.static_mem_bytes + (4 * params).div_ceil(8));
        assert_eq!(zero(true).job.master_grad_bytes(), 0);
    }

    /// Megatron-LM's bf16 model keeps FP32 gradients (buffers and reduction), its fp16 model
    /// half ones; both compute in half with FP32 classes in half.
    #[test]
    fn megatron_bf16_reduces_fp32_gradients() {
        let (_, mut job) = crate::zoo::build::test_job("gpt", 2, "8xh200");
        job.framework = crate::cost::framework::Framework::Megatron;
        let bytes = |e: &Evaluated| e.job.syncs.iter().map(|s| s.bytes).sum::<u64>();
        let (base, bf16) = run(job.clone(), &[("dtype", "bf16")]).unwrap();
        let (_, fp16) = run(job.clone(), &[("dtype", "fp16")]).unwrap();
        assert!(bf16.job.math.pure_half && fp16.job.math.pure_half);
        assert!(grads(&base) > 0);
        assert_eq!(bytes(&bf16), bytes(&base));
        assert_eq!(grads(&bf16), grads(&base));
        assert!(bytes(&fp16) * 2 <= bytes(&base) + base.job.syncs.len() as u64);
        assert!(grads(&fp16) * 2 <= grads(&base) + 1000);
        // Gradients are allocated in the backward, after the activations' peak here.
        assert!(bf16.memory.peak_bytes >= fp16.memory.peak_bytes);
        // Reducing twice the bytes is not faster.
        assert!(bf16.iteration_ns() >= fp16.iteration_ns());
        // Asked for in bf16 (Megatron-LM's --grad-reduce-in-bf16), they are.
        let (_, asked) = run(job, &[("dtype", "bf16"), ("fp16_allreduce", "1")]).unwrap();
        assert_eq!(bytes(&asked), bytes(&fp16));
        assert!(asked.iteration_ns() <= bf16.iteration_ns());
    }
}
