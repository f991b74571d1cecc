//! Every pass's `propose` on random zoo jobs, full and lean (issue 20: `tensor-fusion` indexed
//! the empty replay of a lean evaluation and the search panicked on everyday jobs).
//!
//! A random job is a built-in model at a small batch on 1–4 GPUs of a built-in cluster, rewritten
//! with a framework's default synchronisation (what `replay`, `whatif` and `plan` start from),
//! evaluated in the full or the symmetric form. For each registered pass and each knob variant
//! the search or a user can give it:
//!
//! * on the full evaluation, `propose` returns patches or says the pass does not apply, the
//!   patches apply or are refused as a whole, and the result evaluates or is refused — never a
//!   panic;
//! * on the same evaluation made lean, `propose` is refused with `PassError::Lean`, for every
//!   pass, whatever its knobs.

use proptest::prelude::*;
use trainplan::cost::config::{Cluster, load_cluster};
use trainplan::cost::framework::Framework;
use trainplan::passes::{self, PassError};
use trainplan::search;
use trainplan::zoo::{self, ModelOptions};

#[derive(Clone, Debug)]
struct RandJob {
    model: &'static str,
    batch: u32,
    gpus: u32,
    framework: Framework,
    symmetric: bool,
    /// One collective per gradient tensor (what the search's baselines start from) instead of
    /// the framework's default buckets.
    per_tensor: bool,
}

fn rand_job() -> impl Strategy<Value = RandJob> {
    (
        prop::sample::select(vec!["resnet50", "bert-base", "gpt", "inception-v3"]),
        1u32..5,
        prop::sample::select(vec![1u32, 2, 4]),
        prop::sample::select(vec![Framework::Pytorch, Framework::Horovod, Framework::Tf]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(model, batch, gpus, framework, symmetric, per_tensor)| RandJob {
                model,
                batch,
                gpus,
                framework,
                symmetric,
                per_tensor,
            },
        )
}

/// The job as `plan` starts from it: the framework's default synchronisation, or one collective
/// per tensor.
fn job_of(r: &RandJob) -> trainplan::graph::job::Job {
    let mut opts = ModelOptions {
        batch: Some(r.batch),
        ..Default::default()
    };
    if r.model == "gpt" {
        // A small GPT keeps the debug-build replay short; its shape is still a real decoder.
        (opts.layers, opts.hidden, opts.heads, opts.seq) = (Some(2), Some(256), Some(4), Some(128));
    }
    if r.model.starts_with("bert") {
        (opts.layers, opts.seq) = (Some(2), Some(128));
    }
    let model = zoo::model(r.model, &opts).unwrap();
    let base = load_cluster("8xh200").unwrap();
    let cluster = Cluster {
        gpus_per_node: r.gpus,
        nodes: 1,
        ..base
    };
    let (job, flat, _) = search::baselines::zoo_baseline(
        &model,
        &cluster,
        r.framework,
        None,
        None,
        false,
        false,
        None,
        None,
    )
    .unwrap();
    if r.per_tensor { flat } else { job }
}

/// The knob variants of a pass: its defaults, every 0/1 speed-up switch it declares turned off,
/// and `scope=all` where it has a scope.
fn variants(p: &dyn passes::Pass) -> Vec<Vec<(String, String)>> {
    let specs = p.knobs();
    let mut v = vec![Vec::new()];
    let switches: Vec<(String, String)> = specs
        .iter()
        .filter(|k| ["coarsen", "partial", "twins"].contains(&k.name.as_str()))
        .map(|k| (k.name.clone(), "0".to_string()))
        .collect();
    if !switches.is_empty() {
        v.push(switches);
    }
    if specs.iter().any(|k| k.name == "scope") {
        v.push(vec![("scope".into(), "all".into())]);
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 12,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_pass_proposes_on_full_and_refuses_lean_evaluations(r in rand_job()) {
        let all = passes::registry();
        let eval = search::evaluator(r.symmetric);
        let full = eval(job_of(&r)).unwrap();
        let lean = {
            let mut l = full.clone();
            search::lean_from(&mut l, 0);
            l
        };
        prop_assert!(lean.is_lean() && !full.is_lean());
        for p in &all {
            for given in variants(p.as_ref()) {
                let knobs = passes::resolve_knobs(p.as_ref(), &given).unwrap();
                match passes::propose(p.as_ref(), &full, &knobs) {
                    Ok(patches) => {
                        if let Ok(job) = passes::apply_all(&full.job, &patches) {
                            // Evaluates or is refused with an error; a panic fails the test.
                            let _ = eval(job);
                        }
                    }
                    Err(PassError::NotApplicable { .. }) => {}
                    Err(e) => prop_assert!(false, "{} {given:?} on {r:?}: {e}", p.name()),
                }
                let refused = passes::propose(p.as_ref(), &lean, &knobs);
                prop_assert!(
                    matches!(refused, Err(PassError::Lean { .. })),
                    "{} {given:?} on a lean {r:?}: {:?}",
                    p.name(),
                    refused.map(|v| v.len())
                );
            }
        }
    }
}
