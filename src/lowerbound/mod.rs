//! Benanza's "lower-bound" latency (IPDPS'20, §III) of an ONNX model on a GPU: the time of one
//! forward pass if every layer ran as its best library kernel, back to back, with no framework in
//! between.
//!
//! ```text
//! ONNX ──► layers (layers.rs: kernels, canonical keys) ──► unique layers ──► perf DB (db.rs)
//!             │                                                    │  analytic: roofline; measured: GPU
//!             └─► fusion groups (fusion.rs)                        ▼
//!                                      sequential = Σ layer latency; parallel = critical path of the
//!                                      layer DAG; the same with fused groups; fp16/bf16 tensor cores
//!                                                     │
//!                                       report.rs: Q1–Q6 against a measured latency or a trace
//! ```
//!
//! Analytic latency of one kernel (`crate::cost::compute`'s roofline and efficiency factors):
//! `max(matrix_flops / (matrix peak·0.7) + vector_flops / (vector peak·0.5), bytes / (bw·0.8)) +
//! launch`. A layer's latency is the sum over the kernels of its best unfused implementation; a
//! fused group is one kernel. Peaks are per dtype: fp16/bf16 matrix math runs on tensor cores
//! where the GPU config gives a matrix peak for it.

pub mod db;
pub mod fusion;
pub mod layers;
pub mod report;

use std::collections::{BTreeMap, HashMap};

use crate::cost::compute::{Efficiency, Roofline};
use crate::cost::config::{Dtype, GpuSpec};
use crate::onnx::Graph;
use crate::zoo::MathClass;

pub use db::{Entry, PerfDb, Source};
pub use fusion::Fused;
pub use layers::{Kernel, Layer};

/// Time of one kernel in ns under a roofline.
pub fn kernel_ns(r: &Roofline, k: &Kernel) -> f64 {
    let compute = r.time_ns(MathClass::Matrix, k.matrix_flops, 0.0, 0)
        + r.time_ns(MathClass::Vector, k.vector_flops, 0.0, 0);
    let memory = r.mem_time_ns(k.elems * r.dtype().bytes() as f64);
    compute.max(memory) + r.time_ns(MathClass::Vector, 0.0, 0.0, 1)
}

/// The dtype the tensor-core variant uses on `gpu` when the model runs in `dtype`: fp16 when the
/// GPU has an fp16 matrix peak, else bf16; none when `dtype` is already a 16-bit type or the GPU
/// has neither.
pub fn tensor_core_dtype(gpu: &GpuSpec, dtype: Dtype) -> Option<Dtype> {
    if matches!(dtype, Dtype::Fp16 | Dtype::Bf16 | Dtype::Fp8) {
        return None;
    }
    [Dtype::Fp16, Dtype::Bf16]
        .into_iter()
        .find(|d| gpu.matrix_tflops.contains_key(d))
}

/// Latencies of every layer and fused group in one dtype, in ms.
#[derive(Clone, Debug, PartialEq)]
pub struct Costs {
    pub dtype: Dtype,
    pub layer_ms: Vec<f64>,
    /// The implementation each layer's latency comes from (the fastest).
    pub layer_impl: Vec<String>,
    /// Analytic latency of each layer's default implementation (implicit GEMM for convolutions).
    pub default_ms: Vec<f64>,
    /// Each fused group: the faster of its fused kernel and its members run apart.
    pub fused_ms: Vec<f64>,
    /// Layers whose latency came from a measured database entry.
    pub measured_layers: usize,
}

/// The four bounds of one dtype, in ms.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Bounds {
    pub sequential_ms: f64,
    pub parallel_ms: f64,
    pub fused_sequential_ms: f64,
    pub fused_parallel_ms: f64,
}

/// The key of a fused group in the database.
pub fn fused_key(f: &Fused, layers: &[Layer]) -> String {
    let members: Vec<&str> = f.members.iter().map(|&m| layers[m].key.as_str()).collect();
    format!("fused:{}:{}", f.pattern, members.join(" + "))
}

/// The best entry of a layer after its analytic implementations are put into `db`.
struct Best {
    ms: f64,
    measured: bool,
    implementation: String,
    /// Analytic latency of the first (default) implementation.
    default_ms: f64,
}

/// Put the analytic entries of every unique layer and fused group into `db` (replacing older
/// analytic ones) and read back each one's best latency.
pub fn costs(
    gpu: &GpuSpec,
    dtype: Dtype,
    layers: &[Layer],
    fused: &[Fused],
    db: &mut PerfDb,
) -> Costs {
    let r = Roofline::new(gpu, dtype, Efficiency::default());
    let bytes = dtype.bytes() as f64;
    let mut cache: HashMap<String, (f64, bool, String, f64)> = HashMap::new();
    let mut lookup = |key: &str, impls: &[(&str, &[Kernel])], db: &mut PerfDb| -> Best {
        if impls.first().is_none_or(|(_, ks)| ks.is_empty()) {
            return Best {
                ms: 0.0,
                measured: false,
                implementation: "none".into(),
                default_ms: 0.0,
            };
        }
        if let Some((ms, measured, implementation, default_ms)) = cache.get(key) {
            return Best {
                ms: *ms,
                measured: *measured,
                implementation: implementation.clone(),
                default_ms: *default_ms,
            };
        }
        let mut default_ms = 0.0;
        for (i, (name, ks)) in impls.iter().enumerate() {
            let ms = ks.iter().map(|k| kernel_ns(&r, k)).sum::<f64>() / 1e6;
            if i == 0 {
                default_ms = ms;
            }
            db.upsert(Entry {
                gpu: gpu.name.clone(),
                dtype,
                layer: key.to_string(),
                implementation: name.to_string(),
                source: Source::Analytic,
                ms,
                flops: ks.iter().map(|k| k.matrix_flops + k.vector_flops).sum(),
                bytes: ks.iter().map(|k| k.elems).sum::<f64>() * bytes,
            });
        }
        let best = db
            .best(&gpu.name, dtype, key)
            .expect("an entry was just inserted");
        let v = (
            best.ms,
            best.source == Source::Measured,
            best.implementation.clone(),
            default_ms,
        );
        cache.insert(key.to_string(), v.clone());
        Best {
            ms: v.0,
            measured: v.1,
            implementation: v.2,
            default_ms,
        }
    };
    let (mut layer_ms, mut layer_impl, mut default_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut measured_layers = 0;
    for l in layers {
        let mut impls: Vec<(&str, &[Kernel])> = vec![(l.implementation, &l.kernels)];
        impls.extend(l.alternatives.iter().map(|(n, k)| (*n, k.as_slice())));
        let b = lookup(&l.key, &impls, db);
        measured_layers += b.measured as usize;
        layer_ms.push(b.ms);
        layer_impl.push(b.implementation);
        default_ms.push(b.default_ms);
    }
    let fused_ms = fused
        .iter()
        .map(|f| {
            let mut impls: Vec<(&str, &[Kernel])> =
                vec![("fused", std::slice::from_ref(&f.kernel))];
            impls.extend(
                f.alternatives
                    .iter()
                    .map(|(n, k)| (*n, std::slice::from_ref(k))),
            );
            let apart: f64 = f.members.iter().map(|&m| layer_ms[m]).sum();
            lookup(&fused_key(f, layers), &impls, db).ms.min(apart)
        })
        .collect();
    Costs {
        dtype,
        layer_ms,
        layer_impl,
        default_ms,
        fused_ms,
        measured_layers,
    }
}

/// Longest path through the layer DAG with per-layer weights; returns (length, path).
pub fn critical_path(layers: &[Layer], ms: &[f64]) -> (f64, Vec<usize>) {
    let mut finish = vec![0.0f64; layers.len()];
    let mut from = vec![usize::MAX; layers.len()];
    for (i, l) in layers.iter().enumerate() {
        let mut start = 0.0f64;
        for &p in &l.preds {
            debug_assert!(p < i, "layers are in topological order");
            if finish[p] > start {
                start = finish[p];
                from[i] = p;
            }
        }
        finish[i] = start + ms[i];
    }
    let Some(mut end) = (0..layers.len()).max_by(|&a, &b| finish[a].total_cmp(&finish[b])) else {
        return (0.0, Vec::new());
    };
    let len = finish[end];
    let mut path = vec![end];
    while from[end] != usize::MAX {
        end = from[end];
        path.push(end);
    }
    path.reverse();
    (len, path)
}

/// Sequential and parallel bounds, unfused and fused.
pub fn bounds(layers: &[Layer], fused: &[Fused], c: &Costs) -> Bounds {
    let sequential_ms = c.layer_ms.iter().sum();
    let (parallel_ms, _) = critical_path(layers, &c.layer_ms);
    // Collapse each fused group into one unit carried by its last member: every member's outside
    // inputs come from layers before that member (see fusion.rs: intermediates have one consumer),
    // so the layer order stays topological.
    let mut unit_ms = c.layer_ms.clone();
    let mut carrier: Vec<usize> = (0..layers.len()).collect();
    for (f, &ms) in fused.iter().zip(&c.fused_ms) {
        let last = *f.members.iter().max().expect("groups are not empty");
        for &m in &f.members {
            unit_ms[m] = 0.0;
            carrier[m] = last;
        }
        unit_ms[last] = ms;
    }
    let mut members_of: Vec<Vec<usize>> = vec![Vec::new(); layers.len()];
    for (j, &c) in carrier.iter().enumerate() {
        members_of[c].push(j);
    }
    let collapsed: Vec<Layer> = layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut preds: Vec<usize> = members_of[i]
                .iter()
                .flat_map(|&m| &layers[m].preds)
                .map(|&p| carrier[p])
                .filter(|&p| p != i)
                .collect();
            preds.sort_unstable();
            preds.dedup();
            Layer {
                preds,
                kernels: Vec::new(),
                ..l.clone()
            }
        })
        .collect();
    let (fused_parallel_ms, _) = critical_path(&collapsed, &unit_ms);
    Bounds {
        sequential_ms,
        parallel_ms,
        fused_sequential_ms: unit_ms.iter().sum(),
        fused_parallel_ms,
    }
}

/// Per operator type: layer count, sequential latency, FLOPs.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct OpTypeStats {
    pub layers: usize,
    pub ms: f64,
    pub flops: f64,
}

/// One unique layer in the report.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct UniqueRow {
    pub op_type: String,
    /// The first layer with this key.
    pub name: String,
    pub key: String,
    pub count: usize,
    pub ms_each: f64,
    pub ms_total: f64,
}

/// One fusion pattern in the report.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct FusionRow {
    pub pattern: String,
    pub groups: usize,
    pub layers: usize,
    pub unfused_ms: f64,
    pub fused_ms: f64,
}

/// The whole analysis of a model on a GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct Analysis {
    pub gpu: String,
    pub dtype: Dtype,
    pub batch: i64,
    pub layers: Vec<Layer>,
    pub fused: Vec<Fused>,
    pub costs: Costs,
    pub bounds: Bounds,
    /// Tensor-core variant: its dtype, costs and bounds.
    pub tensor_core: Option<(Costs, Bounds)>,
    /// Layer indices on the (unfused) critical path.
    pub critical_path: Vec<usize>,
    /// The GPU has a matrix (tensor-core) peak for `dtype`.
    pub matrix_units: bool,
}

impl Analysis {
    /// Analyse a shape-inferred graph. Fills `db` with analytic entries (see `db.rs`).
    pub fn new(g: &Graph, gpu: &GpuSpec, dtype: Dtype, db: &mut PerfDb) -> Analysis {
        let layers = layers::layers(g);
        let fused = fusion::find(g, &layers);
        let c = costs(gpu, dtype, &layers, &fused, db);
        let b = bounds(&layers, &fused, &c);
        let (_, critical_path) = critical_path(&layers, &c.layer_ms);
        let tensor_core = tensor_core_dtype(gpu, dtype).map(|d| {
            let c = costs(gpu, d, &layers, &fused, db);
            let b = bounds(&layers, &fused, &c);
            (c, b)
        });
        Analysis {
            gpu: gpu.name.clone(),
            dtype,
            batch: g.batch,
            layers,
            fused,
            costs: c,
            bounds: b,
            tensor_core,
            critical_path,
            matrix_units: gpu.matrix_tflops.contains_key(&dtype),
        }
    }

    /// Number of distinct layer keys.
    pub fn unique_layers(&self) -> usize {
        let keys: std::collections::HashSet<&str> =
            self.layers.iter().map(|l| l.key.as_str()).collect();
        keys.len()
    }

    /// Total forward FLOPs (one multiply-add = 2).
    pub fn flops(&self) -> f64 {
        self.layers.iter().map(Layer::flops).sum()
    }

    /// Kernels one forward launches, unfused and fused.
    pub fn kernels(&self) -> (usize, usize) {
        let unfused: usize = self.layers.iter().map(|l| l.kernels.len()).sum();
        let in_groups: usize = self
            .fused
            .iter()
            .flat_map(|f| &f.members)
            .map(|&m| self.layers[m].kernels.len())
            .sum();
        (unfused, unfused - in_groups + self.fused.len())
    }

    pub fn by_op_type(&self) -> BTreeMap<String, OpTypeStats> {
        let mut m: BTreeMap<String, OpTypeStats> = BTreeMap::new();
        for (l, ms) in self.layers.iter().zip(&self.costs.layer_ms) {
            let s = m.entry(l.op_type.clone()).or_default();
            s.layers += 1;
            s.ms += ms;
            s.flops += l.flops();
        }
        m
    }

    /// Unique layers by total sequential latency, largest first (ties: first appearance).
    pub fn unique_rows(&self) -> Vec<UniqueRow> {
        let mut rows: Vec<UniqueRow> = Vec::new();
        let mut at: HashMap<&str, usize> = HashMap::new();
        for (l, &ms) in self.layers.iter().zip(&self.costs.layer_ms) {
            match at.get(l.key.as_str()) {
                Some(&i) => {
                    rows[i].count += 1;
                    rows[i].ms_total += ms;
                }
                None => {
                    at.insert(&l.key, rows.len());
                    rows.push(UniqueRow {
                        op_type: l.op_type.clone(),
                        name: l.name.clone(),
                        key: l.key.clone(),
                        count: 1,
                        ms_each: ms,
                        ms_total: ms,
                    });
                }
            }
        }
        rows.sort_by(|a, b| b.ms_total.total_cmp(&a.ms_total));
        rows
    }

    pub fn fusion_rows(&self) -> Vec<FusionRow> {
        let mut m: BTreeMap<&str, FusionRow> = BTreeMap::new();
        for (f, &ms) in self.fused.iter().zip(&self.costs.fused_ms) {
            let r = m.entry(f.pattern).or_insert_with(|| FusionRow {
                pattern: f.pattern.to_string(),
                groups: 0,
                layers: 0,
                unfused_ms: 0.0,
                fused_ms: 0.0,
            });
            r.groups += 1;
            r.layers += f.members.len();
            r.unfused_ms += f
                .members
                .iter()
                .map(|&i| self.costs.layer_ms[i])
                .sum::<f64>();
            r.fused_ms += ms;
        }
        m.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::config::load_gpu;
    use crate::onnx::shape::tests::{A, init, input, model, node};
    use crate::onnx::{InferOptions, from_proto};

    fn graph(
        nodes: Vec<crate::onnx::proto::NodeProto>,
        x: &[i64],
        inits: Vec<crate::onnx::proto::TensorProto>,
    ) -> Graph {
        from_proto(
            &model(nodes, vec![input("x", x)], inits, 13),
            "t.onnx",
            &InferOptions::default(),
        )
        .unwrap()
    }

    // V100 fp32 by hand: vector peak 15.7 TFLOP/s (no fp32 matrix peak), 900 GB/s, 4 µs launch;
    // efficiencies 0.7 matrix, 0.5 vector, 0.8 memory.
    const MATRIX: f64 = 15.7e3 * 0.7; // FLOP/ns
    const VECTOR: f64 = 15.7e3 * 0.5;
    const BW: f64 = 900.0 * 0.8; // B/ns
    const LAUNCH: f64 = 4000.0;
    const N: f64 = 1024.0 * 1024.0;

    fn gemm_ns() -> f64 {
        (2.0 * 1024f64.powi(3) / MATRIX).max(3.0 * N * 4.0 / BW) + LAUNCH
    }
    fn relu_ns() -> f64 {
        (N / VECTOR).max(2.0 * N * 4.0 / BW) + LAUNCH
    }

    #[test]
    fn a_gemm_and_a_relu_by_hand() {
        let g = graph(
            vec![
                node("Gemm", &["x", "w"], &["h"], &[]),
                node("Relu", &["h"], &["y"], &[]),
            ],
            &[1024, 1024],
            vec![init("w", &[1024, 1024], None)],
        );
        let v100 = load_gpu("v100-32gb").unwrap();
        let mut db = PerfDb::new();
        let a = Analysis::new(&g, &v100, Dtype::Fp32, &mut db);
        let ms = |ns: f64| ns / 1e6;
        assert!(
            (a.bounds.sequential_ms - ms(gemm_ns() + relu_ns())).abs() < 1e-9,
            "{:?}",
            a.bounds
        );
        assert_eq!(a.bounds.parallel_ms, a.bounds.sequential_ms);
        // Fused: one kernel with the GEMM's and the ReLU's FLOPs, moving A, B and the output once.
        let fused = (2.0 * 1024f64.powi(3) / MATRIX + N / VECTOR).max(3.0 * N * 4.0 / BW) + LAUNCH;
        assert_eq!(a.fused.len(), 1);
        assert_eq!(a.fused[0].pattern, "gemm+bias+act");
        assert!((a.bounds.fused_sequential_ms - ms(fused)).abs() < 1e-9);
        assert_eq!(a.kernels(), (2, 1));
        // fp16 on V100's tensor cores: 125 TFLOP/s matrix, 2-byte elements.
        let (c, tb) = a.tensor_core.as_ref().unwrap();
        assert_eq!(c.dtype, Dtype::Fp16);
        let g16 = (2.0 * 1024f64.powi(3) / (125e3 * 0.7)).max(3.0 * N * 2.0 / BW) + LAUNCH;
        let r16 = (N / (31.4e3 * 0.5)).max(2.0 * N * 2.0 / BW) + LAUNCH;
        assert!((tb.sequential_ms - ms(g16 + r16)).abs() < 1e-9);
        // The database now holds the analytic entries of both dtypes: 2 layers + 1 group each.
        assert_eq!(db.len(), 6);
        assert!(db.entries().all(|e| e.source == Source::Analytic));
    }

    #[test]
    fn parallel_bound_follows_the_longest_branch() {
        // x ─► Relu ─┐
        //  └─► Gemm ─┴► Add
        let g = graph(
            vec![
                node("Relu", &["x"], &["a"], &[]),
                node("Gemm", &["x", "w"], &["b"], &[]),
                node("Add", &["a", "b"], &["y"], &[]),
            ],
            &[1024, 1024],
            vec![init("w", &[1024, 1024], None)],
        );
        let v100 = load_gpu("v100-32gb").unwrap();
        let a = Analysis::new(&g, &v100, Dtype::Fp32, &mut PerfDb::new());
        let add = (N / VECTOR).max(3.0 * N * 4.0 / BW) + LAUNCH;
        assert!((a.bounds.sequential_ms * 1e6 - (relu_ns() + gemm_ns() + add)).abs() < 1e-3);
        assert!((a.bounds.parallel_ms * 1e6 - (gemm_ns() + add)).abs() < 1e-3);
        let names: Vec<&str> = a
            .critical_path
            .iter()
            .map(|&i| a.layers[i].name.as_str())
            .collect();
        assert_eq!(names, ["b", "y"]);
    }

    #[test]
    fn a_measured_entry_replaces_the_analytic_one() {
        let g = graph(
            vec![node("Relu", &["x"], &["y"], &[])],
            &[1024, 1024],
            vec![],
        );
        let v100 = load_gpu("v100-32gb").unwrap();
        let mut db = PerfDb::new();
        let before = Analysis::new(&g, &v100, Dtype::Fp32, &mut db);
        db.upsert(Entry {
            gpu: "v100-32gb".into(),
            dtype: Dtype::Fp32,
            layer: before.layers[0].key.clone(),
            implementation: "nvrtc".into(),
            source: Source::Measured,
            ms: 0.5,
            flops: 0.0,
            bytes: 0.0,
        });
        let after = Analysis::new(&g, &v100, Dtype::Fp32, &mut db);
        assert_eq!(after.bounds.sequential_ms, 0.5);
        assert_eq!(after.costs.measured_layers, 1);
        // The analytic entry was refreshed, not dropped.
        assert_eq!(db.len(), 3);
    }

    #[test]
    fn conv_bias_is_two_kernels_unless_fused() {
        let g = graph(
            vec![
                node(
                    "Conv",
                    &["x", "w", "b"],
                    &["c"],
                    &[("pads", A::Is(&[1, 1, 1, 1]))],
                ),
                node("Relu", &["c"], &["y"], &[]),
            ],
            &[8, 64, 56, 56],
            vec![init("w", &[64, 64, 3, 3], None), init("b", &[64], None)],
        );
        let layers = layers::layers(&g);
        assert_eq!(layers[0].kernels.len(), 2);
        let n = 8.0 * 64.0 * 56.0 * 56.0;
        assert_eq!(layers[0].kernels[0].matrix_flops, 2.0 * n * 64.0 * 9.0);
        assert_eq!(layers[0].kernels[1].vector_flops, n);
        let f = fusion::find(&g, &layers);
        assert_eq!(
            (f.len(), f[0].pattern, f[0].members.as_slice()),
            (1, "conv+bias+act", &[0, 1][..])
        );
        assert_eq!(f[0].kernel.elems, n + 64.0 * 64.0 * 9.0 + 64.0 + n);
    }

    #[test]
    fn a_value_read_twice_is_not_fused_away() {
        // The conv output feeds the ReLU and the Add: fusing conv+relu would lose it; only the
        // conv's own bias joins its kernel.
        let g = graph(
            vec![
                node("Conv", &["x", "w", "b"], &["c"], &[]),
                node("Relu", &["c"], &["r"], &[]),
                node("Add", &["c", "r"], &["y"], &[]),
            ],
            &[1, 4, 8, 8],
            vec![init("w", &[4, 4, 1, 1], None), init("b", &[4], None)],
        );
        let layers = layers::layers(&g);
        let f = fusion::find(&g, &layers);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            (f[0].pattern, f[0].members.as_slice()),
            ("conv+bias", &[0][..])
        );
    }

    #[test]
    fn tensor_core_dtype_per_gpu() {
        let v100 = load_gpu("v100-32gb").unwrap();
        assert_eq!(tensor_core_dtype(&v100, Dtype::Fp32), Some(Dtype::Fp16));
        assert_eq!(tensor_core_dtype(&v100, Dtype::Fp16), None);
        let mut no_tc = v100.clone();
        no_tc.matrix_tflops.clear();
        assert_eq!(tensor_core_dtype(&no_tc, Dtype::Fp32), None);
    }

    #[test]
    fn exported_erf_gelu_joins_the_gemm_epilogue() {
        // MatMul → Add(bias) → x·(1 + erf(x/√2))·0.5, as torch.onnx.export writes GELU.
        let g = graph(
            vec![
                node("MatMul", &["x", "w"], &["m"], &[]),
                node("Add", &["m", "b"], &["h"], &[]),
                node("Div", &["h", "sqrt2"], &["d"], &[]),
                node("Erf", &["d"], &["e"], &[]),
                node("Add", &["e", "one"], &["p"], &[]),
                node("Mul", &["h", "p"], &["q"], &[]),
                node("Mul", &["q", "half"], &["y"], &[]),
            ],
            &[4, 16, 32],
            vec![
                init("w", &[32, 64], None),
                init("b", &[64], None),
                init("sqrt2", &[], None),
                init("one", &[], None),
                init("half", &[], None),
            ],
        );
        let layers = layers::layers(&g);
        let f = fusion::find(&g, &layers);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].pattern, f[0].members.len()), ("gemm+bias+act", 7));
        let y = 4.0 * 16.0 * 64.0;
        assert_eq!(
            f[0].kernel.elems,
            4.0 * 16.0 * 32.0 + 32.0 * 64.0 + 64.0 + y
        );
        let v100 = load_gpu("v100-32gb").unwrap();
        let a = Analysis::new(&g, &v100, Dtype::Fp32, &mut PerfDb::new());
        assert_eq!(a.kernels(), (7, 1));
    }

    #[test]
    fn winograd_is_taken_where_it_is_faster() {
        // A large stride-1 3x3 conv is compute-bound in fp32 on V100: Winograd's 2.25x fewer
        // multiplies win; a strided one has no Winograd variant.
        let g = graph(
            vec![
                node(
                    "Conv",
                    &["x", "w"],
                    &["a"],
                    &[("pads", A::Is(&[1, 1, 1, 1]))],
                ),
                node(
                    "Conv",
                    &["a", "w"],
                    &["y"],
                    &[("pads", A::Is(&[1, 1, 1, 1])), ("strides", A::Is(&[2, 2]))],
                ),
            ],
            &[32, 128, 28, 28],
            vec![init("w", &[128, 128, 3, 3], None)],
        );
        let v100 = load_gpu("v100-32gb").unwrap();
        let a = Analysis::new(&g, &v100, Dtype::Fp32, &mut PerfDb::new());
        assert_eq!(a.layers[0].alternatives.len(), 1);
        assert!(a.layers[1].alternatives.is_empty());
        assert_eq!(a.costs.layer_impl, [layers::WINOGRAD, "implicit-gemm"]);
        let n = 32.0 * 128.0 * 28.0 * 28.0;
        let direct = 2.0 * n * 128.0 * 9.0;
        let wino = (direct / 2.25 / MATRIX + (8.0 * n + 6.0 * n) / VECTOR)
            .max((2.0 * n + 128.0 * 128.0 * 9.0) * 4.0 / BW)
            + LAUNCH;
        assert!((a.costs.layer_ms[0] * 1e6 - wino).abs() < 1e-3);
        assert!((a.costs.default_ms[0] * 1e6 - (direct / MATRIX + LAUNCH)).abs() < 1e-3);
        let q3 = &report::answers(&a, None)[2].answer;
        assert!(q3.contains("beats implicit GEMM on 1 of the 1 eligible 3x3 convolutions (2 convolutions in all)"), "{q3}");
    }

    #[test]
    fn constant_subgraphs_cost_nothing() {
        // scale = 1 / sqrt(Cast(Gather(Shape(x), 1))) is folded at load; x · scale is real work.
        let g = graph(
            vec![
                node("Shape", &["x"], &["s"], &[]),
                node("Gather", &["s", "i"], &["d"], &[]),
                node("Cast", &["d"], &["df"], &[("to", A::I(1))]),
                node("Sqrt", &["df"], &["r"], &[]),
                node("Reciprocal", &["r"], &["scale"], &[]),
                node("Mul", &["x", "scale"], &["y"], &[]),
            ],
            &[1024, 1024],
            vec![init("i", &[], Some(&[1]))],
        );
        let layers = layers::layers(&g);
        let costed: Vec<&str> = layers
            .iter()
            .filter(|l| !l.kernels.is_empty())
            .map(|l| l.op_type.as_str())
            .collect();
        assert_eq!(costed, ["Mul"]);
    }
}
