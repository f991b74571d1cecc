//! DeepSpeed: `ds_config.json`, the configuration `deepspeed.initialize(config=...)` reads, and
//! `trainplan_deepspeed.py`, which loads it, sets the optimizer's hyper-parameters and gives the
//! context to build the model in — `deepspeed.zero.MiCS_Init` for a plan sharded in replica
//! groups, the one thing the JSON cannot say.
//!
//! | plan | `ds_config.json` |
//! |---|---|
//! | `workload.batch` b, `grad_accumulation` k, `workload.ranks` n | `train_micro_batch_size_per_gpu` = b/k, `gradient_accumulation_steps` = k, `train_batch_size` = b·n; batch unknown (a trace without shapes): k only, the user adds the micro-batch (never a fraction) |
//! | `dtype` / the `amp` decision | `bf16.enabled`, or `fp16.enabled` with dynamic loss scaling (`loss_scale` 0); `communication_data_type` = the half dtype with `fp16_allreduce=1` or the model in half (`style=pure`, DeepSpeed's own AMP and the `amp` pass's default here), else `fp32` (what the plan priced) |
//! | `sharding.stage` (0 when absent) | `zero_optimization.stage` |
//! | `tensor_groups` + `tensor_bytes` (stages 1–3) | `reduce_bucket_size` = the largest group's elements; stages 1–2: `allgather_bucket_size` = all groups' elements (the plan's one all-gather after the step) |
//! | a planned shard | `overlap_comm` true (the replay runs every collective beside the compute), `contiguous_gradients` true |
//! | `sharding.prefetch` p, `unit_bytes` (stage 3) | `stage3_prefetch_bucket_size` = p × the largest block unit's elements |
//! | `sharding.replicas` > 1 (stage 3) | `mics_shard_size` = `shard_size`; the model built in `MiCS_Init` (`trainplan_deepspeed.model_init`) |
//! | `sharding.offload` | `offload_optimizer` on the CPU |
//! | `fused-adam` | `optimizer.type` AdamW: DeepSpeed's FusedAdam (DeepSpeedCPUAdam when offloaded), hyper-parameters FusedAdam's defaults until the user sets them |
//! | `baseline:zero2_default` / `zero3_default` as the last sharding decision | that stage with DeepSpeed's defaults written out (buckets 5e8 elements, prefetch 5e7, persistence 1e5, `overlap_comm` at stage 3 only) |
//!
//! Stage 0 (no `sharding`, `baseline:deepspeed_default`) writes no bucket: DeepSpeed without
//! ZeRO all-reduces the gradients after the backward in buffers of 5e8 elements, a size no key
//! sets. A sharding DeepSpeed has no setting for ([`shard_supported`]: stage 3 without
//! `reshard`, replica groups below stage 3) is refused naming the field.
//!
//! **Element counts.** DeepSpeed sizes buckets in elements, the plan in bytes. Zoo jobs are
//! built in FP32 and mixed precision keeps FP32 master weights, so `tensor_bytes` and
//! `unit_bytes` hold 4 bytes per element; a trace planned in half precision without an `amp`
//! decision recorded its tensors in that dtype (2 bytes). The notes say which was assumed.
//!
//! **Not applied** (said in the notes, in [`mechanism`]'s words): recomputation, fused op
//! regions, per-tensor partitions, gradient groups other than DeepSpeed's fill-by-size buckets,
//! and any other pass. The planned wrap units are not written either: stage 3 gathers
//! parameters module by module, and parameters under `stage3_param_persistence_threshold`
//! (1e5 elements, left at its default) stay whole on every rank where the plan shards them.
//!
//! **Versions.** Checked against DeepSpeed 0.19.6 (`tests/frameworks/deepspeed_config.py`, its
//! `DeepSpeedConfig` and a CPU training run). DeepSpeed 0.19.7 removed MiCS and refuses
//! `mics_shard_size`: a plan with replica groups needs 0.19.6 or older.

use serde_json::{Map, Value, json};

use super::escape::json_text;
use super::{EmitError, Emitted, Facts, comment_text, header, names_doc, py_str, unmapped_passes};
use crate::cost::framework::Framework as Fw;
use crate::plan::{Plan, ShardConfig};
use crate::search::framework::{Names, mechanism, shard_supported};

/// `reduce_bucket_size` and `allgather_bucket_size` when not set (DeepSpeedZeroConfig), elements.
pub const DEFAULT_BUCKET_ELEMS: u64 = 500_000_000;
/// `stage3_prefetch_bucket_size`'s default, elements.
pub const DEFAULT_PREFETCH_ELEMS: u64 = 50_000_000;
/// `stage3_param_persistence_threshold`'s default, elements.
pub const DEFAULT_PERSISTENCE_ELEMS: u64 = 100_000;

const CONFIG_FILE: &str = "ds_config.json";
const MODULE_FILE: &str = "trainplan_deepspeed.py";

pub(super) fn emit(plan: &Plan, f: &Facts) -> Result<Emitted, EmitError> {
    let mut notes = Vec::new();
    let mut cfg = Map::new();
    batch_keys(plan, f, &mut cfg, &mut notes);
    precision_keys(f, &mut cfg, &mut notes);
    let zero = zero_section(plan, f, &mut notes)?;
    cfg.insert("zero_optimization".into(), Value::Object(zero));
    let offload = plan.config.sharding.as_ref().is_some_and(|s| s.offload);
    if let Some(o) = optimizer_section(f, offload, &mut notes) {
        cfg.insert("optimizer".into(), o);
    }
    not_applied(plan, f, &mut notes);
    let module = module(plan, f, &cfg);
    Ok(Emitted {
        files: vec![
            (CONFIG_FILE.into(), json_text(&Value::Object(cfg))),
            (MODULE_FILE.into(), module),
        ],
        notes,
    })
}

/// Micro-batch, accumulation and global batch; the batch keys only when the plan knows its
/// batch.
fn batch_keys(plan: &Plan, f: &Facts, cfg: &mut Map<String, Value>, notes: &mut Vec<String>) {
    let k = f.k;
    cfg.insert("gradient_accumulation_steps".into(), json!(k));
    let ranks = plan.workload.ranks;
    match (f.micro_batch, plan.workload.batch()) {
        (Some(micro), Some(batch)) => {
            // micro × k is the per-GPU batch (Facts checked that k divides it): no overflow.
            let total = u64::from(batch) * u64::from(ranks);
            cfg.insert("train_micro_batch_size_per_gpu".into(), json!(micro));
            cfg.insert("train_batch_size".into(), json!(total));
            notes.push(format!(
                "batch: train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps {k} x {ranks} ranks = train_batch_size {total}; DeepSpeed checks this product against its data-parallel world size: launch {ranks} ranks"
            ));
        }
        _ => notes.push(format!(
            "the plan does not know its batch (a trace without input shapes): ds_config.json sets gradient_accumulation_steps = {k} only; add train_micro_batch_size_per_gpu (your per-GPU batch / {k}) before use — DeepSpeed refuses a config with neither it nor train_batch_size"
        )),
    }
}

/// `bf16` / `fp16` sections and the gradients' communication dtype.
fn precision_keys(f: &Facts, cfg: &mut Map<String, Value>, notes: &mut Vec<String>) {
    let half = f.half.as_deref();
    let bf16 = half == Some("bf16");
    let fp16 = half.is_some() && !bf16;
    cfg.insert("bf16".into(), json!({ "enabled": bf16 }));
    cfg.insert(
        "fp16".into(),
        if fp16 {
            // DeepSpeed's documented dynamic-scaling defaults, written out: loss_scale 0 is
            // dynamic, starting at 2^16, halved on an overflow (whose step is skipped), doubled
            // after 1000 clean steps.
            json!({
                "enabled": true,
                "loss_scale": 0,
                "initial_scale_power": 16,
                "loss_scale_window": 1000,
                "hysteresis": 2,
                "min_loss_scale": 1
            })
        } else {
            json!({ "enabled": false })
        },
    );
    let Some(h) = half else {
        notes.push("precision: FP32 (no AMP planned): bf16 and fp16 stay disabled".into());
        return;
    };
    let comm = if f.fp16_allreduce { h } else { "fp32" };
    cfg.insert("communication_data_type".into(), json!(comm));
    notes.push(format!(
        "AMP {h}: {h}.enabled{} — DeepSpeed casts the model to {h} and keeps FP32 master weights in its optimizer; gradients are reduced in {comm} as planned (communication_data_type{})",
        if fp16 {
            " with dynamic loss scaling (loss_scale 0)"
        } else {
            ""
        },
        if comm == "fp32" {
            "; the plan's amp decision has fp16_allreduce=0 — DeepSpeed's own default would reduce in half precision, which the plan did not price"
        } else {
            ""
        }
    ));
}

/// The last decision that set the sharding, when it is one of DeepSpeed's default baselines.
fn default_baseline(plan: &Plan) -> Option<&'static str> {
    let last = plan.decisions.iter().rev().find(|d| {
        d.pass == "shard" || (d.pass.starts_with("baseline:") && d.knobs.contains_key("stage"))
    })?;
    ["zero2_default", "zero3_default"]
        .into_iter()
        .find(|b| last.pass.strip_prefix("baseline:") == Some(*b))
}

/// Bytes per element of `tensor_bytes` and `unit_bytes`, and the dtype that assumes (module
/// docs, **Element counts**).
fn element_bytes(plan: &Plan, f: &Facts) -> (u64, &'static str) {
    let c = &plan.config;
    match f.half.as_deref() {
        Some(h) if plan.workload.source == "trace" && !c.passes.iter().any(|p| p == "amp") => {
            (2, if h == "bf16" { "bf16" } else { "fp16" })
        }
        _ => (4, "fp32"),
    }
}

/// The `zero_optimization` section.
fn zero_section(
    plan: &Plan,
    f: &Facts,
    notes: &mut Vec<String>,
) -> Result<Map<String, Value>, EmitError> {
    let mut z = Map::new();
    let Some(sh) = &plan.config.sharding else {
        z.insert("stage".into(), json!(0));
        notes.push("ZeRO stage 0 (the plan shards nothing): DeepSpeed all-reduces every gradient after the backward, in buffers of 5e8 elements (a fixed size, not a config key)".into());
        return Ok(z);
    };
    supported(sh)?;
    z.insert("stage".into(), json!(sh.stage));
    match default_baseline(plan) {
        Some(name) => {
            defaults(sh.stage, &mut z);
            notes.push(format!(
                "ZeRO stage {}: the plan starts from {name}, DeepSpeed's own setting: its defaults are written out (buckets of 5e8 elements{}, overlap_comm {})",
                sh.stage,
                if sh.stage == 3 {
                    ", prefetch 5e7 elements, parameters under 1e5 elements kept whole"
                } else {
                    ""
                },
                if sh.stage == 3 { "on" } else { "off" }
            ));
        }
        None => planned(plan, f, sh, &mut z, notes)?,
    }
    if sh.replicas > 1 {
        z.insert("mics_shard_size".into(), json!(sh.shard_size));
        z.insert("mics_hierarchical_params_gather".into(), json!(false));
        notes.push(format!(
            "{} replica groups of {} ranks: MiCS (mics_shard_size {}); build the model in trainplan_deepspeed.model_init(config) — deepspeed.zero.MiCS_Init, which MiCS requires. DeepSpeed 0.19.7 and later removed MiCS and refuse the key: use 0.19.6 or older",
            sh.replicas, sh.shard_size, sh.shard_size
        ));
    } else if sh.stage == 3 {
        notes.push("stage 3: build the model in trainplan_deepspeed.model_init(config) (deepspeed.zero.Init: parameters partitioned as they are created) or let deepspeed.initialize partition it (a Hugging Face model: see model_init's doc)".into());
    }
    if sh.offload {
        z.insert(
            "offload_optimizer".into(),
            json!({ "device": "cpu", "pin_memory": true }),
        );
        notes.push(
            "optimizer offloaded: offload_optimizer on the CPU (state and step there)".into(),
        );
    }
    Ok(z)
}

/// `Err` naming the field when DeepSpeed has no setting for the sharding.
fn supported(sh: &ShardConfig) -> Result<(), EmitError> {
    shard_supported(Fw::Deepspeed, sh.stage, sh.replicas, sh.reshard).map_err(|why| {
        let field = if sh.replicas > 1 && sh.stage != 3 {
            "replicas"
        } else if sh.stage == 3 && !sh.reshard {
            "reshard"
        } else {
            "stage"
        };
        EmitError::Unsupported {
            field: format!("config.sharding.{field}"),
            why: format!(
                "{why} (stage {}, {} replica group(s), reshard {})",
                sh.stage,
                sh.replicas,
                u8::from(sh.reshard)
            ),
        }
    })
}

/// DeepSpeed's defaults for `stage`, written out.
fn defaults(stage: u32, z: &mut Map<String, Value>) {
    z.insert("contiguous_gradients".into(), json!(true));
    z.insert("overlap_comm".into(), json!(stage == 3));
    z.insert("reduce_bucket_size".into(), json!(DEFAULT_BUCKET_ELEMS));
    if stage < 3 {
        z.insert("allgather_bucket_size".into(), json!(DEFAULT_BUCKET_ELEMS));
    } else {
        z.insert(
            "stage3_prefetch_bucket_size".into(),
            json!(DEFAULT_PREFETCH_ELEMS),
        );
        z.insert(
            "stage3_param_persistence_threshold".into(),
            json!(DEFAULT_PERSISTENCE_ELEMS),
        );
    }
}

/// The sizes of a planned shard, from the plan's groups and units.
fn planned(
    plan: &Plan,
    f: &Facts,
    sh: &ShardConfig,
    z: &mut Map<String, Value>,
    notes: &mut Vec<String>,
) -> Result<(), EmitError> {
    let (elem, dtype) = element_bytes(plan, f);
    z.insert("contiguous_gradients".into(), json!(true));
    z.insert("overlap_comm".into(), json!(true));
    match f.group_bytes.as_deref() {
        Some(g) if !g.is_empty() => {
            let largest = g.iter().copied().max().unwrap_or(0).div_ceil(elem).max(1);
            z.insert("reduce_bucket_size".into(), json!(largest));
            let mut sizes = format!("reduce_bucket_size {largest} (the largest gradient group)");
            if sh.stage < 3 {
                let total = g
                    .iter()
                    .try_fold(0u64, |a, &b| a.checked_add(b))
                    .ok_or_else(|| {
                        EmitError::Inconsistent("config.tensor_groups: the groups' bytes overflow".into())
                    })?
                    .div_ceil(elem)
                    .max(1);
                z.insert("allgather_bucket_size".into(), json!(total));
                sizes.push_str(&format!(
                    ", allgather_bucket_size {total} (every parameter: the plan gathers the updated parameters in one all-gather)"
                ));
            }
            notes.push(format!(
                "ZeRO stage {}, overlap_comm on: {sizes}; elements = the plan's bytes / {elem} ({dtype} tensors, as the plan sizes them)",
                sh.stage
            ));
        }
        _ => notes.push(format!(
            "ZeRO stage {}, overlap_comm on; the plan has no tensor_bytes: reduce_bucket_size and allgather_bucket_size are left at DeepSpeed's default (5e8 elements)",
            sh.stage
        )),
    }
    if sh.stage == 3 {
        prefetch(sh, elem, z, notes);
    }
    Ok(())
}

/// `stage3_prefetch_bucket_size`: `prefetch` units of the largest block unit (the root unit,
/// embeddings and head, when there is no other).
fn prefetch(sh: &ShardConfig, elem: u64, z: &mut Map<String, Value>, notes: &mut Vec<String>) {
    let blocks = sh
        .units
        .iter()
        .zip(&sh.unit_bytes)
        .filter(|(u, _)| !u.is_empty())
        .map(|(_, &b)| b)
        .max();
    let unit = blocks
        .or_else(|| sh.unit_bytes.iter().copied().max())
        .unwrap_or(0)
        .div_ceil(elem);
    // prefetch ≤ 64 and a unit ≤ 16 TiB (Plan::check): no overflow.
    let bucket = u64::from(sh.prefetch) * unit;
    z.insert("stage3_prefetch_bucket_size".into(), json!(bucket));
    notes.push(format!(
        "stage 3 gathers parameters module by module, not by the plan's {} units: stage3_prefetch_bucket_size {bucket} = prefetch {} x the largest unit's {unit} elements lets it fetch that far ahead; parameters under 1e5 elements (stage3_param_persistence_threshold, left at its default) stay whole on every rank, where the plan shards them all",
        sh.units.len(),
        sh.prefetch
    ));
}

/// The optimizer section when the plan counts fused Adam.
fn optimizer_section(f: &Facts, offload: bool, notes: &mut Vec<String>) -> Option<Value> {
    if !f.passes.iter().any(|p| p == "fused-adam") {
        notes.push(format!(
            "no fused Adam planned: no optimizer section — pass your optimizer to deepspeed.initialize(optimizer=...); ZeRO runs torch.optim.Adam / AdamW (others need zero_allow_untested_optimizer){}",
            if offload {
                "; with the optimizer offloaded DeepSpeed requires deepspeed.ops.adam.DeepSpeedCPUAdam (zero_force_ds_cpu_optimizer)"
            } else {
                ""
            }
        ));
        return None;
    }
    notes.push(format!(
        "fused Adam: optimizer.type AdamW — deepspeed.initialize builds {} from it; its params are FusedAdam's defaults (lr 1e-3, weight_decay 0): set yours with trainplan_deepspeed.load_config(lr=..., weight_decay=...) and pass no optimizer= (a client optimizer takes precedence over this section)",
        if offload {
            "DeepSpeedCPUAdam (the optimizer is offloaded)"
        } else {
            "DeepSpeed's FusedAdam (multi-tensor, AdamW mode)"
        }
    ));
    Some(json!({
        "type": "AdamW",
        "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    }))
}

/// Notes for what the plan holds and DeepSpeed's export does not apply, in the words of the
/// mechanism table.
fn not_applied(plan: &Plan, f: &Facts, notes: &mut Vec<String>) {
    let names = Names::of(&plan.workload.names);
    let why = |pass: &str| mechanism(Fw::Deepspeed, pass, names).err().unwrap_or("");
    if !f.recompute.is_empty() {
        notes.push(format!(
            "recomputation of {} layer(s)/module(s) is not applied: {}",
            f.recompute.len(),
            why("recompute")
        ));
    }
    if !f.clusters.is_empty() {
        notes.push(format!(
            "the plan's {} fused op region(s) are not applied: {}",
            f.clusters.len(),
            why("op-fusion")
        ));
    }
    if !plan.config.partitions.is_empty() {
        notes.push(format!(
            "per-tensor partitions of {} group(s) are not applied: {}",
            plan.config.partitions.len(),
            why("tensor-partition")
        ));
    }
    if plan.workload.framework != Fw::Deepspeed && f.groups.len() > 1 {
        notes.push(format!(
            "the plan was made for --framework {}: its {} gradient groups are not applied ({}); DeepSpeed's buckets will differ (plan with --framework deepspeed)",
            plan.workload.framework.name(),
            f.groups.len(),
            why("tensor-fusion")
        ));
    }
    notes.extend(unmapped_passes(f, &["amp", "fused-adam"], "DeepSpeed"));
}

/// `trainplan_deepspeed.py`: the plan's values as constants, then [`DS_PY`].
fn module(plan: &Plan, f: &Facts, cfg: &Map<String, Value>) -> String {
    let sh = plan.config.sharding.as_ref();
    let opt = |v: Option<u32>| v.map_or_else(|| "None".to_string(), |x| x.to_string());
    let mut py = format!(
        "\"\"\"Apply a trainplan plan with DeepSpeed: ds_config.json beside this module holds the ZeRO\nstage, bucket and prefetch sizes, precision, batch and gradient accumulation; this module\nreads it, sets the optimizer's hyper-parameters and gives the context to build the model in.\n\n    import deepspeed, trainplan_deepspeed as tp\n    config = tp.load_config(lr=3e-4)        # optimizer params (when the plan uses DeepSpeed's Adam)\n    with tp.model_init(config):             # MiCS_Init / zero.Init where the plan shards parameters\n        model = build_model()\n    engine, _, _, _ = deepspeed.initialize(\n        model=model, model_parameters=model.parameters(), config=config)\n    for batch in loader:                    # MICRO_BATCH samples per rank\n        loss = engine(batch)\n        engine.backward(loss)\n        engine.step()                       # the optimizer steps every GRADIENT_ACCUMULATION_STEPS\n\nThe plan and whose names it uses are in the comments below.\n\"\"\"\n\n{}# names: {}\n",
        header(plan, "DeepSpeed (ds_config.json beside this module)"),
        comment_text(&names_doc(plan))
    );
    py.push_str(&format!("NAMES = {}\n", py_str(&plan.workload.names)));
    py.push_str(&format!("CONFIG_FILE = {}\n", py_str(CONFIG_FILE)));
    py.push_str(&format!("ZERO_STAGE = {}\n", sh.map_or(0, |s| s.stage)));
    py.push_str(&format!(
        "# Ranks per MiCS shard group (replica groups hold copies of each other); None: one group of every rank.\nMICS_SHARD_SIZE = {}\n",
        opt(sh.filter(|s| s.replicas > 1).map(|s| s.shard_size))
    ));
    py.push_str(&format!(
        "# Samples per rank per micro-step; None: the plan does not know its batch (add it to the config).\nMICRO_BATCH = {}\n",
        opt(f.micro_batch.filter(|_| cfg.contains_key("train_micro_batch_size_per_gpu")))
    ));
    py.push_str(&format!("GRADIENT_ACCUMULATION_STEPS = {}\n", f.k));
    py.push_str(&format!("RANKS = {}\n", plan.workload.ranks));
    py.push_str(&format!(
        "DTYPE = {}\n",
        py_str(f.half.as_deref().unwrap_or("fp32"))
    ));
    py.push_str(&format!(
        "# True: the config's optimizer section (DeepSpeed's AdamW) is the plan's fused Adam.\nDEEPSPEED_OPTIMIZER = {}\n",
        if cfg.contains_key("optimizer") {
            "True"
        } else {
            "False"
        }
    ));
    py.push_str(DS_PY);
    py
}

const DS_PY: &str = r#"

def load_config(path=None, **optimizer_params):
    """ds_config.json (beside this module unless path is given) as a dict for
    deepspeed.initialize(config=...). Keyword arguments (lr, betas, eps, weight_decay) set the
    optimizer's hyper-parameters; only when the plan uses DeepSpeed's Adam."""
    import json
    import os

    if path is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), CONFIG_FILE)
    with open(path) as fh:
        config = json.load(fh)
    if optimizer_params:
        if "optimizer" not in config:
            raise ValueError(
                "the plan keeps your optimizer (no fused Adam planned): pass it to "
                "deepspeed.initialize(optimizer=...) instead of setting %s" % sorted(optimizer_params)
            )
        config["optimizer"].setdefault("params", {}).update(optimizer_params)
    return config


def model_init(config=None):
    """The context to build the model in: deepspeed.zero.MiCS_Init when the plan shards in
    replica groups (MiCS partitions parameters as they are created: required),
    deepspeed.zero.Init at stage 3 (parameters partitioned as they are created, so the whole
    model never sits on one device), else a context that does nothing.

    A Hugging Face model constructed directly in this context misses its own weight init (it
    runs on parameters already partitioned: a tiny GPT-2 started at loss 39 instead of 4.8).
    Use transformers' DeepSpeed integration for those (HfDeepSpeedConfig(config) before
    from_config / from_pretrained), or, without MiCS, build the model outside and let
    deepspeed.initialize partition it."""
    import contextlib

    if config is None:
        config = load_config()
    if MICS_SHARD_SIZE is not None:
        import deepspeed

        return deepspeed.zero.MiCS_Init(config_dict_or_path=config)
    if ZERO_STAGE == 3:
        import deepspeed

        return deepspeed.zero.Init(config_dict_or_path=config)
    return contextlib.nullcontext()
"#;

#[cfg(test)]
mod tests {
    use super::super::tests::{check_files, decision, file, tiny_plan};
    use super::*;
    use crate::plan::emit::{Framework, emit};

    fn config(p: &Plan) -> (Value, Emitted) {
        let e = emit(p, Framework::Deepspeed).unwrap();
        check_files(&e);
        let text = file(&e, "ds_config.json");
        assert!(text.chars().all(|c| c == '\n' || (' '..='~').contains(&c)));
        (serde_json::from_str(text).unwrap(), e)
    }

    fn sharded(stage: u32, replicas: u32) -> Plan {
        let mut p = tiny_plan();
        p.config.sharding = Some(ShardConfig {
            stage,
            shard_size: 8 / replicas,
            replicas,
            reshard: true,
            prefetch: 2,
            offload: false,
            units: vec!["".into(), "net.0".into(), "net.1".into()],
            unit_bytes: vec![1 << 20, 4096, 8192],
        });
        p
    }

    fn has(e: &Emitted, s: &str) -> bool {
        e.notes.iter().any(|n| n.contains(s))
    }

    #[test]
    fn the_tiny_plan_is_stage_0_fp16_with_its_batch_and_fused_adam() {
        let (c, e) = config(&tiny_plan());
        // batch 4 per GPU, k = 2, 8 ranks.
        assert_eq!(c["train_micro_batch_size_per_gpu"], 2);
        assert_eq!(c["gradient_accumulation_steps"], 2);
        assert_eq!(c["train_batch_size"], 32);
        assert_eq!(c["zero_optimization"], json!({"stage": 0}));
        assert_eq!(c["fp16"]["enabled"], true);
        assert_eq!(c["fp16"]["loss_scale"], 0);
        assert_eq!(c["bf16"]["enabled"], false);
        // The amp decision all-reduces in fp16.
        assert_eq!(c["communication_data_type"], "fp16");
        assert_eq!(c["optimizer"]["type"], "AdamW");
        // What DeepSpeed cannot apply is said, in the mechanism table's words.
        assert!(has(&e, "blueconnect"), "{:?}", e.notes);
        assert!(has(
            &e,
            "fused op region(s) are not applied: ds_config.json has no compile regions"
        ));
        assert!(has(
            &e,
            "per-tensor partitions of 1 group(s) are not applied"
        ));
        assert!(has(&e, "made for --framework pytorch"));
        let py = file(&e, "trainplan_deepspeed.py");
        assert!(py.contains("\nMICRO_BATCH = 2\n") && py.contains("\nZERO_STAGE = 0\n"));
        assert!(
            py.contains("\nDEEPSPEED_OPTIMIZER = True\n") && py.contains("\nDTYPE = \"fp16\"\n")
        );
    }

    #[test]
    fn stage_2_buckets_are_the_plans_groups_in_fp32_elements() {
        let (c, e) = config(&sharded(2, 1));
        let z = &c["zero_optimization"];
        assert_eq!(z["stage"], 2);
        assert_eq!(z["overlap_comm"], true);
        assert_eq!(z["contiguous_gradients"], true);
        // Largest group 4 MiB + 2 KiB = 4196352 bytes; all groups 16781312 bytes; fp32.
        assert_eq!(z["reduce_bucket_size"], 4196352 / 4);
        assert_eq!(z["allgather_bucket_size"], 16781312 / 4);
        assert!(z.get("stage3_prefetch_bucket_size").is_none());
        assert!(has(&e, "bytes / 4 (fp32 tensors"));
        // Stage 1 the same; without tensor bytes DeepSpeed's defaults stay.
        let mut p = sharded(1, 1);
        p.config.tensor_bytes.clear();
        let (c, e) = config(&p);
        assert_eq!(c["zero_optimization"]["stage"], 1);
        assert!(c["zero_optimization"].get("reduce_bucket_size").is_none());
        assert!(has(&e, "no tensor_bytes"));
    }

    #[test]
    fn stage_3_prefetches_units_and_replicas_are_mics() {
        let (c, e) = config(&sharded(3, 1));
        let z = &c["zero_optimization"];
        assert_eq!(z["stage"], 3);
        // prefetch 2 x the largest block unit (8192 bytes, not the 1 MiB root) / 4.
        assert_eq!(z["stage3_prefetch_bucket_size"], 2 * 8192 / 4);
        assert!(z.get("allgather_bucket_size").is_none());
        assert!(z.get("mics_shard_size").is_none());
        assert!(has(&e, "deepspeed.zero.Init"));
        let (c, e) = config(&sharded(3, 2));
        assert_eq!(c["zero_optimization"]["mics_shard_size"], 4);
        assert!(has(&e, "MiCS_Init"));
        let py = file(&e, "trainplan_deepspeed.py");
        assert!(py.contains("\nMICS_SHARD_SIZE = 4\n"), "{py}");
        // Offload: the optimizer on the CPU.
        let mut p = sharded(3, 1);
        p.config.sharding.as_mut().unwrap().offload = true;
        let (c, e) = config(&p);
        assert_eq!(c["zero_optimization"]["offload_optimizer"]["device"], "cpu");
        assert!(has(&e, "DeepSpeedCPUAdam"));
    }

    #[test]
    fn what_deepspeed_cannot_shard_is_refused_naming_the_field() {
        let err = |p: &Plan| emit(p, Framework::Deepspeed).unwrap_err().to_string();
        let e = err(&sharded(2, 2));
        assert!(
            e.contains("config.sharding.replicas") && e.contains("MiCS"),
            "{e}"
        );
        let mut p = sharded(3, 1);
        p.config.sharding.as_mut().unwrap().reshard = false;
        let e = err(&p);
        assert!(e.contains("config.sharding.reshard"), "{e}");
    }

    #[test]
    fn default_baselines_write_deepspeeds_defaults_until_a_shard_decision() {
        let mut p = sharded(3, 1);
        p.decisions.insert(
            0,
            decision("baseline:zero3_default", &[("stage", "3")], "start"),
        );
        let (c, e) = config(&p);
        let z = &c["zero_optimization"];
        assert_eq!(z["reduce_bucket_size"], DEFAULT_BUCKET_ELEMS);
        assert_eq!(z["stage3_prefetch_bucket_size"], DEFAULT_PREFETCH_ELEMS);
        assert_eq!(
            z["stage3_param_persistence_threshold"],
            DEFAULT_PERSISTENCE_ELEMS
        );
        assert_eq!(z["overlap_comm"], true);
        assert!(has(&e, "starts from zero3_default"));
        let mut p2 = sharded(2, 1);
        p2.decisions.insert(
            0,
            decision("baseline:zero2_default", &[("stage", "2")], "start"),
        );
        let (c, _) = config(&p2);
        assert_eq!(c["zero_optimization"]["overlap_comm"], false);
        assert_eq!(
            c["zero_optimization"]["allgather_bucket_size"],
            DEFAULT_BUCKET_ELEMS
        );
        // A later shard decision plans the sizes.
        p.decisions
            .push(decision("shard", &[("stage", "3")], "tuned"));
        let (c, _) = config(&p);
        assert_eq!(c["zero_optimization"]["stage3_prefetch_bucket_size"], 4096);
    }

    #[test]
    fn an_unknown_batch_leaves_the_batch_keys_to_the_user() {
        let mut p = tiny_plan();
        p.workload.source = "trace".into();
        p.workload.names = "trace".into();
        p.workload.batch = None;
        let (c, e) = config(&p);
        assert_eq!(c["gradient_accumulation_steps"], 2);
        assert!(c.get("train_micro_batch_size_per_gpu").is_none());
        assert!(c.get("train_batch_size").is_none());
        assert!(has(&e, "does not know its batch"));
        assert!(file(&e, "trainplan_deepspeed.py").contains("\nMICRO_BATCH = None\n"));
        // A trace planned in half precision without AMP recorded half tensors: 2 bytes each.
        let mut p = sharded(2, 1);
        p.workload.source = "trace".into();
        p.workload.names = "trace".into();
        p.config.passes.retain(|x| x != "amp");
        p.decisions.retain(|d| d.pass != "amp");
        let (c, e) = config(&p);
        assert_eq!(c["zero_optimization"]["reduce_bucket_size"], 4196352 / 2);
        assert!(has(&e, "bytes / 2 (fp16 tensors"));
    }

    #[test]
    fn bf16_autocast_without_half_allreduce_reduces_in_fp32_and_fp32_sets_no_half() {
        let mut p = tiny_plan();
        p.config.dtype = "bf16".into();
        p.decisions.retain(|d| d.pass != "amp");
        p.decisions.push(decision(
            "amp",
            &[("dtype", "bf16"), ("style", "autocast")],
            "bf16",
        ));
        let (c, _) = config(&p);
        assert_eq!(c["bf16"]["enabled"], true);
        assert_eq!(c["fp16"]["enabled"], false);
        assert_eq!(c["communication_data_type"], "fp32");
        // DeepSpeed's own style (the knob absent or `framework`): the model in half, whose
        // half gradients the plan priced reduced in half.
        for style in [None, Some("framework"), Some("pure")] {
            let mut p = tiny_plan();
            p.workload.framework = crate::cost::framework::Framework::Deepspeed;
            p.config.dtype = "bf16".into();
            p.decisions.retain(|d| d.pass != "amp");
            let mut knobs = vec![("dtype", "bf16")];
            knobs.extend(style.map(|s| ("style", s)));
            p.decisions.push(decision("amp", &knobs, "bf16"));
            let (c, _) = config(&p);
            assert_eq!(c["communication_data_type"], "bf16", "{style:?}");
        }
        let mut p = tiny_plan();
        p.config.dtype = "fp32".into();
        p.config.passes.retain(|x| x != "amp" && x != "fused-adam");
        p.decisions.retain(|d| d.pass != "amp");
        let (c, e) = config(&p);
        assert_eq!(c["bf16"]["enabled"], false);
        assert_eq!(c["fp16"]["enabled"], false);
        assert!(c.get("communication_data_type").is_none());
        assert!(c.get("optimizer").is_none());
        assert!(has(&e, "pass your optimizer to deepspeed.initialize"));
    }
}
