//! Megatron-LM: `megatron_args.sh`, the arguments the plan decides for Megatron-LM's
//! `pretrain_gpt.py`, as the bash array `TRAINPLAN_MEGATRON_ARGS` (`. megatron_args.sh;
//! torchrun … pretrain_gpt.py "${TRAINPLAN_MEGATRON_ARGS[@]}" <model, data and tokenizer
//! arguments>`). Written for Megatron-LM on megatron-core 0.16 (whose `TransformerConfig`,
//! `OptimizerConfig` and micro-batch calculator the real-library test holds the arguments
//! to). Only what the plan decides is written; every other argument keeps Megatron's default.
//!
//! | plan | `megatron_args.sh` |
//! |---|---|
//! | `tensor_parallel` degree t | `--tensor-model-parallel-size t`; `--sequence-parallel` with `sequence` |
//! | `pipeline` stages p | `--pipeline-model-parallel-size p` (the outermost dimension, as the plan replays it) |
//! | `pipeline` `first_stage_layers`, `last_stage_layers` (uneven stages) | `--decoder-first-pipeline-num-layers`, `--decoder-last-pipeline-num-layers` |
//! | `pipeline` `interleaved`, v chunks per rank | `--num-layers-per-virtual-pipeline-stage` = layers ÷ (p × v) |
//! | `pipeline` `gpipe` | refused ([`EmitError::Unsupported`]): Megatron-LM's schedules are 1F1B and interleaved 1F1B |
//! | micro-batches (the pipeline's m, or accumulation's k) | `--micro-batch-size` = replica batch ÷ m, `--global-batch-size` = replica batch × data-parallel ranks: Megatron runs global ÷ (micro × dp) = m micro-batches per step |
//! | `dtype` bf16 / fp16 | `--bf16` / `--fp16` (dynamic loss scaling, Megatron's default without `--loss-scale`); fp32: neither |
//! | `dtype` fp8, fp64 | refused (Megatron's FP8 is Transformer Engine's `--fp8-format`, not planned) |
//! | `recompute` `policy=full` over every layer | `--recompute-granularity full --recompute-method uniform --recompute-num-layers 1` |
//! | `recompute` `policy=selective` over every layer | `--recompute-granularity selective` (core attention: Korthikanti et al. §4.2) |
//! | `recompute` of chosen layers | refused, naming `config.recompute`: Megatron recomputes whole layers, uniformly or in blocks; leaving them out would keep activations the plan freed (a plan that does not fit) |
//! | `sharding` stage 1, one group | `--use-distributed-optimizer`; other stages, replica groups, offload: refused |
//! | `fused-adam` | `--optimizer adam` is written either way: Megatron's Adam is Transformer Engine's or apex's FusedAdam |
//! | gradient synchronisation | no `--overlap-grad-reduce`: the buffer is reduced once after the backward, as the plan prices Megatron's default |
//! | `fused_ops`, `tensor_groups`, `partitions` | — (notes) |
//! | `context_parallel` degree c | `--context-parallel-size c` (Megatron's ranks order tp, cp, dp, pp: the group next to the tensor-parallel ranks, as the plan prices it; the distributed optimizer shards over data × context ranks); 1 without |
//! | model shape | — the user's `--num-layers` (the plan's `layers`, also in `TRAINPLAN_MEGATRON_LAYERS`), `--hidden-size`, … |
//!
//! Plan text reaches the file only in `#` comments through [`comment_text`]; every argument is
//! the emitter's own flag or an integer.

use super::{EmitError, Emitted, Facts, comment_text, header, unmapped_passes};
use crate::plan::{Plan, replica_batch};

/// One argument: a flag and its value, if it takes one (an integer or the emitter's own
/// word, never plan text).
struct Arg {
    flag: &'static str,
    value: Option<String>,
}

fn flag(flag: &'static str) -> Arg {
    Arg { flag, value: None }
}

fn int(flag: &'static str, v: u64) -> Arg {
    Arg {
        flag,
        value: Some(v.to_string()),
    }
}

fn word(flag: &'static str, v: &'static str) -> Arg {
    Arg {
        flag,
        value: Some(v.to_string()),
    }
}

pub(super) fn emit(plan: &Plan, f: &Facts) -> Result<Emitted, EmitError> {
    let c = &plan.config;
    let ranks = plan.workload.ranks.max(1);
    let tp = c.tensor_parallel.as_ref().map_or(1, |t| t.degree.max(1));
    let pp = c.pipeline.as_ref().map_or(1, |p| p.stages.max(1));
    let cp = crate::plan::cp_degree(c);
    let dp = ranks / (tp * pp * cp).max(1);
    let mut args = vec![int("--tensor-model-parallel-size", tp.into())];
    if c.tensor_parallel.as_ref().is_some_and(|t| t.sequence) {
        args.push(flag("--sequence-parallel"));
    }
    args.push(int("--pipeline-model-parallel-size", pp.into()));
    if let Some(p) = &c.pipeline {
        if let Some(n) = p.first_stage_layers {
            args.push(int("--decoder-first-pipeline-num-layers", n.into()));
        }
        if let Some(n) = p.last_stage_layers {
            args.push(int("--decoder-last-pipeline-num-layers", n.into()));
        }
        match p.schedule.as_str() {
            "1f1b" => {}
            "interleaved" => args.push(int(
                "--num-layers-per-virtual-pipeline-stage",
                (p.layers / (p.stages * p.chunks_per_rank).max(1)).into(),
            )),
            other => {
                return Err(EmitError::Unsupported {
                    field: "config.pipeline.schedule".into(),
                    why: format!(
                        "{}: {}",
                        comment_text(other),
                        crate::search::framework::pipeline_supported(
                            crate::cost::framework::Framework::Megatron,
                            other
                        )
                        .err()
                        .unwrap_or("not a schedule Megatron-LM runs")
                    ),
                });
            }
        }
    }
    args.push(int("--context-parallel-size", cp.into()));
    let steps = c.micro_steps();
    if let (Some(batch), Some(micro)) = (plan.workload.batch(), f.micro_batch) {
        args.push(int("--micro-batch-size", micro.into()));
        args.push(int(
            "--global-batch-size",
            u64::from(replica_batch(c, batch)) * u64::from(dp),
        ));
    }
    match (f.half.as_deref(), c.dtype.as_str()) {
        (Some("bf16"), _) => args.push(flag("--bf16")),
        (Some(_), _) => args.push(flag("--fp16")),
        (None, "fp32") => {}
        (None, other) => {
            return Err(EmitError::Unsupported {
                field: "config.dtype".into(),
                why: format!(
                    "{}: Megatron-LM trains in fp32, --fp16 or --bf16 (its FP8 is Transformer Engine's --fp8-format, which the plan did not price)",
                    comment_text(other)
                ),
            });
        }
    }
    if !c.recompute.is_empty() && super::torchtitan::whole_model_policy(plan, "selective") {
        args.push(word("--recompute-granularity", "selective"));
    } else if !c.recompute.is_empty() {
        if !super::torchtitan::full_checkpointing(plan) {
            return Err(EmitError::Unsupported {
                field: "config.recompute".into(),
                why: format!(
                    "the plan recomputes {} chosen module(s); Megatron-LM recomputes whole transformer layers (--recompute-granularity full, uniformly or in blocks) or its own selective core attention, not chosen modules, and running without them would keep activations the plan freed (plan with --framework megatron: its recomputation is policy=full)",
                    f.recompute.len()
                ),
            });
        }
        args.extend([
            word("--recompute-granularity", "full"),
            word("--recompute-method", "uniform"),
            int("--recompute-num-layers", 1),
        ]);
    }
    if let Some(sh) = &c.sharding {
        if let Err(why) = crate::search::framework::shard_supported(
            crate::cost::framework::Framework::Megatron,
            sh.stage,
            sh.replicas,
            sh.reshard,
        ) {
            return Err(EmitError::Unsupported {
                field: "config.sharding.stage".into(),
                why: format!("stage {}: {why}", sh.stage),
            });
        }
        if sh.offload {
            return Err(EmitError::Unsupported {
                field: "config.sharding.offload".into(),
                why: "Megatron-LM's optimizer CPU offload (--optimizer-cpu-offload) runs the update on the CPU by Transformer Engine's hybrid optimizer, which the plan did not price".into(),
            });
        }
        args.push(flag("--use-distributed-optimizer"));
    }
    args.push(word("--optimizer", "adam"));
    let layers = c.pipeline.as_ref().map(|p| p.layers);
    let mut text = header(plan, "Megatron-LM arguments (megatron-core 0.16)");
    text.push_str(&format!(
        "# use: . megatron_args.sh; torchrun (nodes x processes = {ranks} ranks) pretrain_gpt.py \"${{TRAINPLAN_MEGATRON_ARGS[@]}}\" <model, data and tokenizer arguments>\n# layout: {tp} (tensor) x {cp} (context) x {pp} (pipeline) x {dp} (data) = {ranks} ranks; {steps} micro-batch(es) per step\n"
    ));
    if let Some(l) = layers {
        text.push_str(&format!(
            "# the pipeline cuts {l} transformer layers: pass --num-layers {l}\nTRAINPLAN_MEGATRON_LAYERS={l}\n"
        ));
    }
    text.push_str("TRAINPLAN_MEGATRON_ARGS=(\n");
    for a in &args {
        match &a.value {
            Some(v) => text.push_str(&format!("  {} {v}\n", a.flag)),
            None => text.push_str(&format!("  {}\n", a.flag)),
        }
    }
    text.push_str(")\n");
    Ok(Emitted {
        files: vec![("megatron_args.sh".into(), text)],
        notes: notes(plan, f, tp * cp, pp, dp),
    })
}

/// What the user must do, and what the file does not apply.
/// `model` is the ranks of one model replica in a stage: tensor x context parallel.
fn notes(plan: &Plan, f: &Facts, model: u32, pp: u32, dp: u32) -> Vec<String> {
    let w = &plan.workload;
    let mut notes = vec![format!(
        "add your model's arguments (--num-layers, --hidden-size, --num-attention-heads, --ffn-hidden-size, --seq-length, ...; the plan's model is {}) and your data and tokenizer arguments, then launch {} ranks: Megatron-LM derives the data-parallel size ({dp}) from the world size over tensor x context x pipeline ({model} x {pp})",
        comment_text(&w.model),
        w.ranks
    )];
    if w.framework != crate::cost::framework::Framework::Megatron {
        notes.push(format!(
            "the plan was made for --framework {}: Megatron-LM applies only its parallelism, precision, recomputation, distributed optimizer and batch sizes, so the predicted time may assume moves this file does not make (plan with --framework megatron)",
            w.framework
        ));
    }
    if plan.config.pipeline.is_some() {
        notes.push("Megatron-LM ties the output layer to the word embeddings unless --untie-embeddings-and-output-weights is given: with a pipeline the last stage then holds a copy and the two stages all-reduce its gradient every step. The plan priced the model as it was built (GPT and BERT tied: the copy and the exchange are priced; Llama untied): pass --untie-embeddings-and-output-weights for an untied model such as Llama".into());
    }
    if !f.passes.iter().any(|p| p == "fused-adam") {
        notes.push("the plan prices the unfused (foreach) Adam update; Megatron-LM's Adam is fused (Transformer Engine or apex), a little faster than predicted".into());
    }
    if !f.clusters.is_empty() {
        notes.push(format!(
            "the plan's {} fused region(s) are not applied: Megatron-LM fuses with its own kernels (Transformer Engine, --bias-swiglu-fusion, ...)",
            f.clusters.len()
        ));
    }
    if f.fuses_tensors() || !plan.config.partitions.is_empty() {
        notes.push("the plan's gradient groups and partitions are not applied: Megatron-LM reduces one contiguous gradient buffer".into());
    }
    if f.fp16_allreduce && f.half.as_deref() == Some("bf16") {
        notes.push("the plan's amp decision reduces bf16 gradients (fp16_allreduce=1): pass --grad-reduce-in-bf16, or Megatron-LM accumulates and reduces them in fp32 with --bf16 (twice the bytes the plan priced)".into());
    }
    notes.extend(unmapped_passes(f, &["amp", "fused-adam"], "Megatron-LM"));
    notes
}

#[cfg(test)]
mod tests {
    use super::super::tests::tiny_plan;
    use super::super::{Framework, emit as emit_plan};
    use super::*;
    use crate::plan::TensorParallelConfig;

    /// The arguments of the array, one per line, as bash would split them.
    fn args(p: &Plan) -> Vec<String> {
        let e = emit_plan(p, Framework::Megatron).expect("exports");
        let (name, text) = &e.files[0];
        assert_eq!(name, "megatron_args.sh");
        let body = text
            .split("TRAINPLAN_MEGATRON_ARGS=(\n")
            .nth(1)
            .expect("the array")
            .split("\n)")
            .next()
            .unwrap();
        body.split_whitespace().map(str::to_string).collect()
    }

    fn value(a: &[String], flag: &str) -> Option<String> {
        a.iter()
            .position(|x| x == flag)
            .and_then(|i| a.get(i + 1).cloned())
    }

    /// The tiny plan (8 ranks, batch 4, fp16 AMP, fused Adam) without accumulation, with
    /// tensor parallelism of 2 and 2 stages of 4 layers in `schedule`, 4 micro-batches.
    fn three_d(schedule: &str, chunks: u32) -> Plan {
        let mut p = tiny_plan();
        p.config.tensor_parallel = Some(TensorParallelConfig {
            degree: 2,
            sequence: true,
            global_batch: true,
        });
        super::super::tests::pipelined(p, 2, schedule, chunks)
    }

    #[test]
    fn a_3d_layout_gives_megatrons_degrees_and_batches() {
        let a = args(&three_d("1f1b", 1));
        assert_eq!(value(&a, "--tensor-model-parallel-size").unwrap(), "2");
        assert_eq!(value(&a, "--pipeline-model-parallel-size").unwrap(), "2");
        assert!(a.contains(&"--sequence-parallel".to_string()));
        // A replica of 2 x 2 ranks trains 4 x 4 = 16 samples in 4 micro-batches of 4; two
        // replicas: a global batch of 32 (8 ranks x 4 per GPU, kept).
        assert_eq!(value(&a, "--micro-batch-size").unwrap(), "4");
        assert_eq!(value(&a, "--global-batch-size").unwrap(), "32");
        assert!(a.contains(&"--fp16".to_string()));
        assert!(!a.contains(&"--num-layers-per-virtual-pipeline-stage".to_string()));
        let i = three_d("interleaved", 2);
        let a = args(&i);
        // 4 layers over 2 stages x 2 chunks: one layer per virtual stage.
        assert_eq!(
            value(&a, "--num-layers-per-virtual-pipeline-stage").unwrap(),
            "1"
        );
    }

    #[test]
    fn uneven_stages_give_megatrons_first_and_last_layer_counts() {
        let mut p = three_d("1f1b", 1);
        let pp = p.config.pipeline.as_mut().unwrap();
        // 7 layers on 2 stages: 4 and 3.
        pp.layers = 7;
        pp.last_stage_layers = Some(3);
        let a = args(&p);
        assert_eq!(
            value(&a, "--decoder-last-pipeline-num-layers").unwrap(),
            "3"
        );
        assert!(!a.contains(&"--decoder-first-pipeline-num-layers".to_string()));
        // A split Megatron cannot express (no layer left for the first stage) is refused by
        // the plan's check, naming the field.
        p.config.pipeline.as_mut().unwrap().last_stage_layers = Some(7);
        let err = emit_plan(&p, Framework::Megatron).unwrap_err().to_string();
        assert!(err.contains("config.pipeline.first_stage_layers"), "{err}");
    }

    #[test]
    fn gpipe_chosen_recomputation_and_zero3_are_refused_naming_the_field() {
        let err = emit_plan(&three_d("gpipe", 1), Framework::Megatron).unwrap_err();
        assert!(
            err.to_string().contains("config.pipeline.schedule"),
            "{err}"
        );
        let mut p = three_d("1f1b", 1);
        p.config.recompute = vec!["net.1".into()];
        let err = emit_plan(&p, Framework::Megatron).unwrap_err();
        assert!(err.to_string().contains("config.recompute"), "{err}");
        let mut p = tiny_plan();
        p.config.sharding = Some(crate::plan::ShardConfig {
            stage: 3,
            shard_size: 8,
            replicas: 1,
            reshard: true,
            prefetch: 1,
            offload: false,
            units: vec!["net.0".into(), String::new()],
            unit_bytes: vec![1 << 20, 1 << 10],
        });
        let err = emit_plan(&p, Framework::Megatron).unwrap_err();
        assert!(err.to_string().contains("config.sharding.stage"), "{err}");
        p.config.sharding.as_mut().unwrap().stage = 1;
        let a = args(&p);
        assert!(a.contains(&"--use-distributed-optimizer".to_string()));
    }

    #[test]
    fn accumulation_without_a_pipeline_is_megatrons_micro_batches() {
        // The tiny plan: batch 4 per GPU, k = 2, 8 ranks of data parallelism.
        let a = args(&tiny_plan());
        assert_eq!(value(&a, "--micro-batch-size").unwrap(), "2");
        assert_eq!(value(&a, "--global-batch-size").unwrap(), "32");
        assert_eq!(value(&a, "--pipeline-model-parallel-size").unwrap(), "1");
        assert_eq!(value(&a, "--tensor-model-parallel-size").unwrap(), "1");
    }

    #[test]
    fn other_exports_refuse_a_pipeline_naming_it() {
        let p = three_d("1f1b", 1);
        for fw in Framework::ALL {
            if fw == Framework::Megatron {
                continue;
            }
            let err = emit_plan(&p, fw).unwrap_err().to_string();
            assert!(
                err.contains("config.tensor_parallel") || err.contains("config.pipeline"),
                "{fw}: {err}"
            );
        }
        // torchtitan runs a pipeline, but beside FSDP2 only where there are data-parallel ranks.
        let mut p = p;
        p.config.tensor_parallel = None;
        let err = emit_plan(&p, Framework::Torchtitan)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("config.sharding") && err.contains("beside a pipeline"),
            "{err}"
        );
    }
}
