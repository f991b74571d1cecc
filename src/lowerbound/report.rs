//! Benanza's analyses (§III-D, questions Q1–Q6) answered from what trainplan has: the bounds, the
//! fused and tensor-core variants, and — when given — a measured latency or a Kineto trace of the
//! same model.
//!
//! From a trace step: the step's wall time (the measured latency), the sum of its GPU kernel,
//! copy and set times, the GPU busy time (their union: overlap shows concurrent streams), the
//! number of kernels, and how much GEMM/convolution kernel time ran in tensor-core kernels. Both
//! kernel classes are recognised by name (Benanza's rule, widened to later GPUs): GEMM/conv
//! kernels contain `gemm`, `conv`, `xmma`, `cutlass`, `implicit`, `wgrad` or `dgrad`; tensor-core
//! ones `884`, `1688`, `16816`, `hmma`, `xmma`, `tensorop`, `gmma` (`volta_h884gemm`,
//! `turing_s1688cudnn`, `ampere_fp16_s16816gemm`, `sm90_xmma_gemm`, `cutlass_tensorop`).

use crate::trace::graph::StepWindow;
use crate::trace::kineto::{Category, KinetoTrace, Phase};

use super::Analysis;

/// What one step of a trace shows.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TraceStats {
    pub file: String,
    pub step: String,
    pub step_ms: f64,
    /// Sum of the GPU activities' durations (kernels, copies, sets) inside the step.
    pub gpu_time_ms: f64,
    /// Union of those activities: time the GPU had something running.
    pub gpu_busy_ms: f64,
    pub kernels: usize,
    /// GEMM / convolution kernel time.
    pub matrix_kernel_ms: f64,
    /// Part of it in tensor-core kernels.
    pub tensor_core_kernel_ms: f64,
    /// The step runs a backward pass (autograd events): it is a training step, not one forward
    /// pass like the bound.
    pub training: bool,
}

fn is_matrix_kernel(name: &str) -> bool {
    [
        "gemm", "conv", "xmma", "cutlass", "implicit", "wgrad", "dgrad",
    ]
    .iter()
    .any(|p| name.contains(p))
}

fn is_tensor_core_kernel(name: &str) -> bool {
    ["884", "1688", "16816", "hmma", "xmma", "tensorop", "gmma"]
        .iter()
        .any(|p| name.contains(p))
}

/// Statistics of one step window of a trace.
pub fn trace_stats(trace: &KinetoTrace, w: &StepWindow, file: &str) -> TraceStats {
    let mut iv: Vec<(i64, i64)> = Vec::new();
    let (mut total, mut kernels, mut mat, mut tc) = (0i64, 0usize, 0i64, 0i64);
    let training = trace.events.iter().any(|e| {
        e.ts_ns >= w.start_ns
            && e.ts_ns < w.end_ns
            && !e.cat.is_gpu_activity()
            && (e.name.starts_with("autograd::engine") || e.name.contains("Backward"))
    });
    for e in &trace.events {
        if !(e.cat.is_gpu_activity() && e.ph == Phase::Complete) {
            continue;
        }
        if e.ts_ns < w.start_ns || e.ts_ns >= w.end_ns {
            continue;
        }
        total += e.dur_ns;
        iv.push((e.ts_ns, e.end_ns()));
        if e.cat == Category::Kernel {
            kernels += 1;
            let n = e.name.to_ascii_lowercase();
            if is_matrix_kernel(&n) {
                mat += e.dur_ns;
                if is_tensor_core_kernel(&n) {
                    tc += e.dur_ns;
                }
            }
        }
    }
    iv.sort_unstable();
    let (mut busy, mut cur): (i64, Option<(i64, i64)>) = (0, None);
    for (s, e) in iv {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                busy += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = cur {
        busy += ce - cs;
    }
    let ms = |ns: i64| ns as f64 / 1e6;
    TraceStats {
        file: file.to_string(),
        step: w.label.clone(),
        step_ms: ms(w.measured_ns() as i64),
        gpu_time_ms: ms(total),
        gpu_busy_ms: ms(busy),
        kernels,
        matrix_kernel_ms: ms(mat),
        tensor_core_kernel_ms: ms(tc),
        training,
    }
}

/// A measured latency to compare the bound with.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Measurement {
    pub ms: f64,
    /// Where it comes from (`--measured-ms`, or the trace and step).
    pub source: String,
    pub trace: Option<TraceStats>,
}

/// One of Benanza's questions and what the data says.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Answer {
    pub id: &'static str,
    pub question: &'static str,
    pub answer: String,
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

/// Benanza ratio (bound / measured) of the sequential bound, when measured.
pub fn ratio(a: &Analysis, m: Option<&Measurement>) -> Option<f64> {
    m.filter(|m| m.ms > 0.0)
        .map(|m| a.bounds.sequential_ms / m.ms)
}

/// One question's answer from the analysis and the measurement (when given).
type AnswerRule = fn(&Analysis, Option<&Measurement>) -> String;

/// Benanza's questions in order: id, question, and the function that answers it.
const QUESTIONS: &[(&str, &str, AnswerRule)] = &[
    ("Q1", "How far is the run from the lower bound?", q1_gap),
    (
        "Q2",
        "Are independent layers executed in parallel, and what would it buy?",
        q2_parallel,
    ),
    (
        "Q3",
        "Do convolutions use the best algorithm?",
        q3_convolutions,
    ),
    (
        "Q4",
        "Is the framework adding overhead between kernels?",
        q4_overhead,
    ),
    ("Q5", "What would layer fusion buy?", q5_fusion),
    (
        "Q6",
        "Does the run use tensor cores, and what do they buy?",
        q6_tensor_cores,
    ),
];

/// Answers to Q1–Q6.
pub fn answers(a: &Analysis, m: Option<&Measurement>) -> Vec<Answer> {
    QUESTIONS
        .iter()
        .map(|&(id, question, answer)| Answer {
            id,
            question,
            answer: answer(a, m),
        })
        .collect()
}

/// The trace step behind the measurement, when it comes from one.
fn trace_of(m: Option<&Measurement>) -> Option<&TraceStats> {
    m.and_then(|m| m.trace.as_ref())
}

/// Q1: the measurement against the sequential and fused-parallel bounds, with a warning when
/// it is a training step or below the bound.
fn q1_gap(a: &Analysis, m: Option<&Measurement>) -> String {
    let b = &a.bounds;
    match m {
        Some(m) if m.ms > 0.0 => {
            let mut s = format!(
                "measured {} ({}) is {:.2}x the sequential bound {} (Benanza \
                 ratio {:.2}); with fusion and parallel layers the bound is {} and the \
                 run {:.2}x that",
                crate::units::dur_ms(m.ms, 3),
                m.source,
                m.ms / b.sequential_ms,
                crate::units::dur_ms(b.sequential_ms, 3),
                b.sequential_ms / m.ms,
                crate::units::dur_ms(b.fused_parallel_ms, 3),
                m.ms / b.fused_parallel_ms
            );
            if m.trace.as_ref().is_some_and(|t| t.training) {
                s.push_str(
                    "; but the trace step runs a backward pass (a training step) while the \
                     bound is one forward pass, so this ratio overstates the gap: compare an \
                     inference trace, or use the other answers",
                );
            } else if m.ms < b.fused_parallel_ms {
                s.push_str(
                    "; the measurement is below the bound: the GPU config's peaks are too \
                     low for this GPU (run `trainplan calibrate`), or the run is not this \
                     model at this batch size and dtype",
                );
            }
            s
        }
        _ => "no measurement given: pass --measured-ms MS or --trace FILE".into(),
    }
}

/// Q2: the parallel bound against the sequential one, and the trace's GPU overlap.
fn q2_parallel(a: &Analysis, m: Option<&Measurement>) -> String {
    let b = &a.bounds;
    let mut q2 = format!(
        "parallel bound {} vs sequential {}: running independent layers concurrently \
         saves {:.1} % ({} of {} layers are on the critical path)",
        crate::units::dur_ms(b.parallel_ms, 3),
        crate::units::dur_ms(b.sequential_ms, 3),
        pct(b.sequential_ms - b.parallel_ms, b.sequential_ms),
        a.critical_path.len(),
        a.layers.len()
    );
    if let Some(t) = trace_of(m) {
        q2.push_str(&format!(
            "; in the trace, GPU work overlapped for {} (sum {}, busy {})",
            crate::units::dur_ms(t.gpu_time_ms - t.gpu_busy_ms, 3),
            crate::units::dur_ms(t.gpu_time_ms, 3),
            crate::units::dur_ms(t.gpu_busy_ms, 3)
        ));
    }
    q2
}

/// Q3: on how many eligible convolutions Winograd beats implicit GEMM, and what it saves.
fn q3_convolutions(a: &Analysis, _: Option<&Measurement>) -> String {
    let b = &a.bounds;
    let convs: Vec<usize> = (0..a.layers.len())
        .filter(|&i| a.layers[i].op_type == "Conv")
        .collect();
    let eligible = convs
        .iter()
        .filter(|&&i| !a.layers[i].alternatives.is_empty())
        .count();
    let winograd: Vec<usize> = convs
        .iter()
        .copied()
        .filter(|&i| a.costs.layer_impl[i] == super::layers::WINOGRAD)
        .collect();
    let saved: f64 = winograd
        .iter()
        .map(|&i| a.costs.default_ms[i] - a.costs.layer_ms[i])
        .sum();
    let mut q3 = if convs.is_empty() {
        "the model has no convolutions".to_string()
    } else {
        format!(
            "in the {} model, Winograd F(2x2,3x3) beats implicit GEMM on {} of the {} eligible \
             3x3 convolutions ({} convolutions in all), saving {} ({:.1} % of the \
             sequential bound)",
            if a.costs.measured_layers > 0 {
                "measured + analytic"
            } else {
                "analytic"
            },
            winograd.len(),
            eligible,
            convs.len(),
            crate::units::dur_ms(saved, 3),
            pct(saved, b.sequential_ms)
        )
    };
    if !convs.is_empty() {
        q3.push_str(
            "; which algorithm the framework's cuDNN picked needs its log (CUDNN_LOGINFO_DBG=1), \
             which trainplan does not read",
        );
    }
    q3
}

/// Q4: the trace step's GPU idle time and kernel count against the bound's.
fn q4_overhead(a: &Analysis, m: Option<&Measurement>) -> String {
    let b = &a.bounds;
    let (k_unfused, k_fused) = a.kernels();
    match trace_of(m) {
        Some(t) => format!(
            "in {} the GPU was idle {} of the {} step ({:.1} %); {} kernels ran \
             where the bound needs {} unfused / {} fused; kernel time {} vs the \
             sequential bound {}",
            t.step,
            crate::units::dur_ms(t.step_ms - t.gpu_busy_ms, 3),
            crate::units::dur_ms(t.step_ms, 3),
            pct(t.step_ms - t.gpu_busy_ms, t.step_ms),
            t.kernels,
            k_unfused,
            k_fused,
            crate::units::dur_ms(t.gpu_time_ms, 3),
            crate::units::dur_ms(b.sequential_ms, 3)
        ),
        None => format!(
            "needs a trace (--trace FILE); the bound launches {k_unfused} kernels unfused, \
             {k_fused} fused"
        ),
    }
}

/// Q5: the fused sequential bound against the sequential one, and the fusion groups by
/// pattern.
fn q5_fusion(a: &Analysis, _: Option<&Measurement>) -> String {
    let b = &a.bounds;
    let fusion: Vec<String> = a
        .fusion_rows()
        .iter()
        .map(|r| {
            format!(
                "{} x{} ({:.3} → {})",
                r.pattern,
                r.groups,
                r.unfused_ms,
                crate::units::dur_ms(r.fused_ms, 3)
            )
        })
        .collect();
    let fused_layers: usize = a.fused.iter().map(|f| f.members.len()).sum();
    format!(
        "fused sequential bound {} vs {}: {:.1} % less; {} of {} layers in {} \
         groups{}{}",
        crate::units::dur_ms(b.fused_sequential_ms, 3),
        crate::units::dur_ms(b.sequential_ms, 3),
        pct(b.sequential_ms - b.fused_sequential_ms, b.sequential_ms),
        fused_layers,
        a.layers.len(),
        a.fused.len(),
        if fusion.is_empty() { "" } else { ": " },
        fusion.join(", ")
    )
}

/// Q6: the tensor-core bound (or why there is none), and the trace's tensor-core share of
/// GEMM/conv kernel time.
fn q6_tensor_cores(a: &Analysis, m: Option<&Measurement>) -> String {
    let b = &a.bounds;
    let mut q6 = match &a.tensor_core {
        Some((c, tb)) => format!(
            "in {} on tensor cores the bound is {} ({:.2}x faster than {}), {} fused",
            dtype_name(c.dtype),
            crate::units::dur_ms(tb.sequential_ms, 3),
            b.sequential_ms / tb.sequential_ms,
            dtype_name(a.dtype),
            crate::units::dur_ms(tb.fused_sequential_ms, 3)
        ),
        None if a.matrix_units => format!(
            "the bound is already in {} on tensor cores",
            dtype_name(a.dtype)
        ),
        None if matches!(
            a.dtype,
            crate::cost::config::Dtype::Fp16 | crate::cost::config::Dtype::Bf16
        ) =>
        {
            format!(
                "{} has no {} matrix peak in its config: the bound runs {} math on the vector \
                 units",
                a.gpu,
                dtype_name(a.dtype),
                dtype_name(a.dtype)
            )
        }
        None => format!("{} has no fp16/bf16 matrix peak in its config", a.gpu),
    };
    if let Some(t) = trace_of(m) {
        q6.push_str(&format!(
            "; in the trace {:.3} of {} of GEMM/conv kernel time ran in tensor-core kernels \
             ({:.0} %, by kernel name)",
            t.tensor_core_kernel_ms,
            crate::units::dur_ms(t.matrix_kernel_ms, 3),
            pct(t.tensor_core_kernel_ms, t.matrix_kernel_ms)
        ));
    }
    q6
}

/// The config-file spelling of a dtype.
pub fn dtype_name(d: crate::cost::config::Dtype) -> &'static str {
    use crate::cost::config::Dtype::*;
    match d {
        Fp64 => "fp64",
        Fp32 => "fp32",
        Tf32 => "tf32",
        Fp16 => "fp16",
        Bf16 => "bf16",
        Fp8 => "fp8",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::graph::pick_step;
    use crate::trace::parse_kineto;

    #[test]
    fn trace_step_statistics() {
        // One inference step: two launches, a tensor-core GEMM and an element-wise kernel on two
        // streams overlapping for 20 µs.
        let json = r#"{"traceEvents": [
          {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
          {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 1, "dur": 6},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "args": {"correlation": 7}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 4, "dur": 2, "args": {"correlation": 8}},
          {"ph": "X", "cat": "kernel", "name": "volta_h884gemm_64x64_nn", "pid": 0, "tid": 7, "ts": 10, "dur": 30, "args": {"correlation": 7, "stream": 7}},
          {"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "pid": 0, "tid": 8, "ts": 20, "dur": 30, "args": {"correlation": 8, "stream": 8}}
        ]}"#;
        let trace = parse_kineto(json.as_bytes(), "t.json").unwrap();
        let w = pick_step(&trace, "t.json", None).unwrap();
        let t = trace_stats(&trace, &w, "t.json");
        assert_eq!(t.step, "ProfilerStep#1");
        assert_eq!((t.step_ms, t.gpu_time_ms, t.gpu_busy_ms), (0.1, 0.06, 0.04));
        assert_eq!(
            (t.kernels, t.matrix_kernel_ms, t.tensor_core_kernel_ms),
            (2, 0.03, 0.03)
        );
        assert!(!t.training);
    }
}
