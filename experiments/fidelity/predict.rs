//! A case's prediction through the library path the CLI takes: the zoo model as its framework
//! runs it by default (`search::baselines::zoo_baseline`), then the passes the measured run
//! used (`recompute`, `grad-accumulation:k=K`), replayed on the symmetric form.

use std::collections::BTreeMap;

use trainplan::cost::config::{self, ArchSpec, Cluster};
use trainplan::cost::host::HostSpec;
use trainplan::cost::memory::{MemorySpec, ModuleLoading};
use trainplan::graph::job::Job;
use trainplan::passes;
use trainplan::search::baselines;

use super::rows::{Case, MemoryKind};

/// What the model says about a case.
#[derive(Clone, Copy, Debug)]
pub struct Prediction {
    pub iteration_ms: f64,
    /// Peak memory per GPU of the kind the case measured, GB.
    pub memory_gb: f64,
    /// The device-used peak and the GPU's memory, bytes: whether the job fits.
    pub device_used: u64,
    /// What the job needs, bytes: device used plus what the framework keeps out of its pool
    /// (`MemoryPeaks::needed`, what the CLI compares with the GPU).
    pub needed: u64,
    pub capacity: u64,
}

impl Prediction {
    /// Predicted to fit the GPU.
    pub fn fits(&self) -> bool {
        self.needed <= self.capacity
    }
}

/// The case's cluster: `gpus` GPUs of its type on `nodes` nodes, NVLink inside a node unless the
/// row states another transport.
pub fn cluster(c: &Case) -> Result<Cluster, String> {
    let intra = c.intra.unwrap_or(match c.gpu {
        g if g.starts_with("v100") => "nvlink-v100",
        g if g.starts_with("a100") => "nvlink-a100",
        _ => "nvlink-h100",
    });
    let per_node = c.gpus / c.nodes.max(1);
    if per_node * c.nodes != c.gpus {
        return Err(format!(
            "{} GPUs do not split over {} nodes",
            c.gpus, c.nodes
        ));
    }
    let yaml = format!(
        "name: {n}x{g}\ngpu: {g}\nnodes: {nodes}\ngpus_per_node: {per_node}\nintra: {intra}\n{inter}sync: ring\n",
        n = c.gpus,
        g = c.gpu,
        nodes = c.nodes,
        inter = c.inter.map_or(String::new(), |i| {
            format!("inter: {i}\nnics_per_node: {}\n", c.nics.max(1))
        }),
    );
    config::parse_cluster(&yaml, "fidelity", None).map_err(|e| e.to_string())
}

/// `job` with its gradients in apex DDP's buckets of `elems` elements, in the order autograd
/// makes them ready (DDP's layout with both caps at `elems` × the bytes each gradient element
/// is reduced in, read off the job: its collectives' bytes over its parameters' FP32 bytes ÷ 4).
/// apex closes a bucket once it reaches `elems` and DDP before it passes the cap, which differ
/// only for a model larger than one bucket.
fn apex_buckets(job: Job, flat: &Job, elems: u64) -> Result<Job, String> {
    let fp32: u64 = flat.local.tensors.iter().map(|t| t.bytes).sum();
    let reduced: u64 = job.syncs.iter().map(|s| s.bytes).sum();
    if fp32 == 0 || reduced == 0 {
        return Ok(job);
    }
    let cap = (elems as f64 * reduced as f64 / (fp32 as f64 / 4.0)).round() as u64;
    let layout = baselines::DdpLayout::of(flat, cap, cap)
        .ok_or("apex DDP buckets: the job's gradient order is unknown")?;
    Ok(layout.apply(job))
}

/// Constants the fit varies: architecture constants by name, the hosts' speed factor.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub arch: BTreeMap<String, ArchSpec>,
    pub host_speed: Option<f64>,
    pub host_micro_step_us: Option<f64>,
    /// The host's collective-call time (`HostSpec::collective_call_us`), µs.
    pub host_collective_call_us: Option<f64>,
}

/// The prediction of `c`, with the configs' constants replaced by `o`'s (the fit).
pub fn predict(c: &Case, o: &Overrides) -> Result<Prediction, String> {
    // As the CLI does: a framework whose own loop runs the loss decides it.
    let opts = trainplan::zoo::ModelOptions {
        loss: c
            .opts
            .loss
            .or_else(|| trainplan::zoo::framework_loss(&c.model, c.framework)),
        graph_ops: Some(trainplan::zoo::framework_graph_ops(c.framework)),
        ..c.opts.clone()
    };
    let model = trainplan::zoo::model(&c.model, &opts).map_err(|e| e.to_string())?;
    let mut cl = cluster(c)?;
    if let Some(a) = o.arch.get(&cl.gpu.arch) {
        cl.gpu.kernels = a.clone();
    }
    let host = (o.host_speed.is_some()
        || o.host_micro_step_us.is_some()
        || o.host_collective_call_us.is_some())
    .then(|| {
        let b = HostSpec::builtin(c.framework.exec());
        HostSpec {
            speed: o.host_speed.unwrap_or(b.speed),
            micro_step_us: o.host_micro_step_us.unwrap_or(b.micro_step_us),
            collective_call_us: o.host_collective_call_us.unwrap_or(b.collective_call_us),
            ..b
        }
    });
    let (mut job, flat, _) = baselines::zoo_baseline(
        &model,
        &cl,
        c.framework,
        c.precision,
        c.amp_style,
        false,
        true,
        host,
        c.channels_last,
    )?;
    if c.horovod_sync {
        let fw = trainplan::cost::framework::Framework::Horovod;
        job = baselines::framework_default(&flat, fw, &|j| passes::evaluate(j))
            .map_err(|e| e.to_string())?
            .0;
    }
    if let Some(elems) = c.apex_bucket_elems.filter(|_| job.workers > 1) {
        job = apex_buckets(job, &flat, elems)?;
    }
    let reg = passes::registry();
    let mut steps: Vec<(&str, Vec<(String, String)>)> = Vec::new();
    // Tensor parallelism first (a layout, before the passes that rewrite the job), keeping the
    // row's batch per model replica (Megatron's --micro-batch-size).
    if c.tp > 1 {
        steps.push(("tensor-parallel", {
            let mut k = vec![
                ("degree".into(), c.tp.to_string()),
                ("batch".into(), "replica".into()),
            ];
            if c.sequence_parallel {
                k.push(("sequence".into(), "1".into()));
            }
            k
        }));
    }
    if c.recompute {
        let knobs = if c.recompute_selective {
            vec![("policy".into(), "selective".into())]
        } else if c.recompute_blocks {
            vec![("policy".into(), "full".into())]
        } else {
            Vec::new()
        };
        steps.push(("recompute", knobs));
    }
    // Sharding before accumulation (which then reduce-scatters every micro-step, as FSDP and
    // DeepSpeed ZeRO-2/3 do): the stage the run used, with its defaults (one unit per block,
    // resharding after the forward, prefetch one).
    if let Some(stage) = c.shard {
        let mut knobs = vec![("stage".into(), stage.to_string())];
        if c.offload {
            knobs.push(("offload".into(), "1".into()));
        }
        steps.push(("shard", knobs));
    }
    // A pipeline's micro-batches are the row's accumulation steps (Megatron: global batch /
    // (micro-batch × data-parallel size)); it comes last.
    if c.pp > 1 {
        steps.push((
            "pipeline",
            vec![
                ("stages".into(), c.pp.to_string()),
                ("microbatches".into(), c.accum.to_string()),
                ("batch".into(), "replica".into()),
            ],
        ));
    } else if c.accum > 1 {
        steps.push(("grad-accumulation", vec![("k".into(), c.accum.to_string())]));
    }
    // Every source with a memory figure or fact ran before CUDA's lazy module loading became
    // PyTorch's default (1.13, CUDA 11.7, October 2022): NGC 19.03-21.11 containers, TensorFlow
    // 1.x, and the Hugging Face page that measures the 1.3 GB eager context itself.
    // The framework's allocator (a TensorFlow job synchronised by Horovod keeps TensorFlow's).
    job.memory = std::sync::Arc::new(MemorySpec {
        module_loading: ModuleLoading::Eager,
        ..MemorySpec::builtin(c.framework)
    });
    let mut cur = passes::evaluate(job).map_err(|e| e.to_string())?;
    for (name, knobs) in steps {
        let p = passes::find(&reg, name).map_err(|e| e.to_string())?;
        let k = passes::resolve_knobs(p, &knobs).map_err(|e| e.to_string())?;
        let patches = trainplan::passes::propose(p, &cur, &k).map_err(|e| e.to_string())?;
        let j = passes::apply_all(&cur.job, &patches).map_err(|e| e.to_string())?;
        cur = passes::evaluate(j).map_err(|e| e.to_string())?;
    }
    let p = cur.memory.peaks;
    let memory = match c.memory_kind {
        MemoryKind::DeviceUsed => p.device_used,
        _ => p.allocated,
    };
    Ok(Prediction {
        iteration_ms: cur.iteration_ns() as f64 / 1e6,
        memory_gb: memory as f64 / 1e9,
        device_used: p.device_used,
        needed: p.needed(),
        capacity: cur.job.gpu.memory_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use trainplan::cost::framework::{AmpStyle, Framework, Precision};

    use super::*;

    /// BERT-base's 110 M gradients fit one 250 M-element apex bucket: one all-reduce of every
    /// gradient's bytes (half under apex O2), where DDP's 25 MiB buckets make several; apex's
    /// default 10^7 elements makes several too.
    #[test]
    fn apex_buckets_hold_bert_base_in_one() {
        let model = trainplan::zoo::model("bert-base", &Default::default()).unwrap();
        let cl = config::load_cluster("8xv100").unwrap();
        let (job, flat, _) = baselines::zoo_baseline(
            &model,
            &cl,
            Framework::Pytorch,
            Some(Precision::Fp16),
            Some(AmpStyle::Pure),
            false,
            true,
            None,
            None,
        )
        .unwrap();
        let bytes = |j: &Job| j.syncs.iter().map(|s| s.bytes).sum::<u64>();
        assert!(job.syncs.len() > 1, "DDP's default buckets");
        let one = apex_buckets(job.clone(), &flat, 250_000_000).unwrap();
        assert_eq!(one.syncs.len(), 1);
        assert_eq!(bytes(&one), bytes(&job));
        let fp32: u64 = flat.local.tensors.iter().map(|t| t.bytes).sum();
        assert_eq!(bytes(&one), fp32 / 2, "apex O2 reduces half gradients");
        let small = apex_buckets(job.clone(), &flat, 10_000_000).unwrap();
        assert!(small.syncs.len() >= 5, "{}", small.syncs.len());
        assert_eq!(bytes(&small), bytes(&job));
    }
}
