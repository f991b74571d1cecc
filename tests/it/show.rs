//! `trainplan show PLAN [--json]` (issue 13, finding 8: a way to look at a plan other than its
//! YAML): what the plan changes, what each framework's export does with each decision — the
//! planner's own table (`search::framework`), so for the framework the plan was made for every
//! counted decision is applied — and what is left to the user (the export's notes); errors;
//! hand-edited plans out of the planner's ranges, refused by `show` and `export` alike naming the
//! file and the field (issue 20, class 5).

use std::path::PathBuf;

use serde_json::Value;

use crate::support::{check_bad_input, run, run_json, scratch};

/// A plan for ResNet-50 (batch 4) on one H200 server with `--framework fw`.
fn plan(dir: &std::path::Path, fw: &str) -> (PathBuf, trainplan::plan::Plan) {
    let out = dir.join(format!("{fw}.yaml"));
    let (code, _, err) = run(&[
        "plan",
        "--model",
        "resnet50",
        "--batch",
        "4",
        "--cluster",
        "8xh200",
        "--framework",
        fw,
        "--max-rounds",
        "100",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    let p = trainplan::plan::Plan::from_yaml(&text, "p.yaml").unwrap();
    (out, p)
}

fn passes_of(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x["pass"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn show_json_says_what_every_export_does_with_each_decision() {
    let d = scratch("json");
    for fw in ["pytorch", "horovod"] {
        let (path, plan) = plan(&d, fw);
        let v = run_json(&["show", path.to_str().unwrap()]);
        assert_eq!(v["plan"], path.to_str().unwrap());
        assert_eq!(v["workload"]["framework"], fw);
        assert_eq!(
            v["predicted"]["planned"]["iteration_ms"].as_f64().unwrap(),
            plan.predicted.planned.iteration_ms
        );
        assert_eq!(
            v["decisions"].as_array().unwrap().len(),
            plan.decisions.len()
        );
        let exports = v["exports"].as_object().unwrap();
        let mut names: Vec<&str> = exports.keys().map(String::as_str).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "byteps",
                "deepspeed",
                "horovod",
                "jax",
                "megatron",
                "pytorch",
                "tf",
                "torchtitan"
            ]
        );
        // Each framework splits the plan's decisions into applied and not, with a reason.
        let mut decided: Vec<String> = plan.decisions.iter().map(|d| d.pass.clone()).collect();
        decided.dedup();
        for (name, e) in exports {
            let mut all = passes_of(&e["applies"]);
            all.extend(passes_of(&e["does_not_apply"]));
            all.sort();
            let mut want = decided.clone();
            want.sort();
            want.dedup();
            assert_eq!(all, want, "{name}");
            for x in e["applies"].as_array().unwrap() {
                assert!(!x["mechanism"].as_str().unwrap().is_empty(), "{name}: {x}");
            }
            for x in e["does_not_apply"].as_array().unwrap() {
                assert!(!x["why"].as_str().unwrap().is_empty(), "{name}: {x}");
            }
        }
        // The framework the plan was made for applies every counted decision (finding 1), with
        // the mechanism the plan recorded.
        let own = &exports[fw];
        assert_eq!(own["does_not_apply"], serde_json::json!([]), "{own}");
        for x in own["applies"].as_array().unwrap() {
            let d = plan
                .decisions
                .iter()
                .find(|d| x["pass"] == d.pass.as_str())
                .unwrap();
            assert_eq!(x["mechanism"], d.mechanism.as_str(), "{x}");
        }
        // A start point of this framework is another framework's "setting of another framework".
        let start = plan
            .decisions
            .iter()
            .find(|d| d.pass.starts_with("baseline:"))
            .expect("a start point");
        let other = if fw == "pytorch" { "jax" } else { "pytorch" };
        let why = exports[other]["does_not_apply"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["pass"] == start.pass.as_str())
            .unwrap_or_else(|| panic!("{other} applies {}", start.pass));
        assert_eq!(why["why"], "a setting of another framework");
        // What is left to the user: the export's notes, which name its module.
        let left: Vec<&str> = v["left_to_the_user"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        assert!(!left.is_empty());
        let module = if fw == "pytorch" {
            "apply_plan"
        } else {
            "trainplan_horovod"
        };
        assert!(left.iter().any(|n| n.contains(module)), "{left:?}");
    }
}

#[test]
fn show_text_marks_the_planned_framework_and_lists_what_is_left() {
    let d = scratch("text");
    let (path, plan) = plan(&d, "pytorch");
    let (code, text, err) = run(&["show", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("--framework pytorch"), "{text}");
    let table = text
        .split("what each framework's export does")
        .nth(1)
        .expect("the export table");
    let pytorch = table
        .lines()
        .find(|l| l.trim_start().starts_with("pytorch"))
        .unwrap();
    assert!(pytorch.contains("(planned for)"), "{pytorch}");
    assert!(!pytorch.contains('✗'), "{pytorch}");
    for d in &plan.decisions {
        assert!(pytorch.contains(&format!("{} ✓", d.pass)), "{pytorch}");
    }
    assert!(
        text.contains("how the pytorch export applies them:"),
        "{text}"
    );
    assert!(
        text.contains(&format!("trainplan export {} --to pytorch", path.display())),
        "{text}"
    );
}

#[test]
fn show_refuses_what_is_not_a_plan() {
    let d = scratch("bad");
    let missing = d.join("missing.yaml");
    let msg = check_bad_input(&["show", missing.to_str().unwrap()], "missing.yaml");
    assert!(msg.contains("failed to read"), "{msg}");
    let other = d.join("other.yaml");
    std::fs::write(&other, "a: 1\n").unwrap();
    let msg = check_bad_input(&["show", other.to_str().unwrap()], "other.yaml");
    assert!(msg.contains("not a trainplan plan"), "{msg}");
    // Through the guarded reader: a folder is refused before anything is read.
    let msg = check_bad_input(&["show", d.to_str().unwrap()], "failed to read the plan");
    assert!(msg.contains(d.to_str().unwrap()), "{msg}");
}

/// Issue 20, class 5: a plan edited out of the planner's ranges — a tensor of u64::MAX bytes, a
/// negative or NaN time, a speed-up that is not baseline ÷ planned, zero ranks, an accumulation
/// k of 2^32−1 or one that does not divide the batch, zero partitions, a dtype outside the set,
/// an `amp` dtype knob of float64, a 309-digit cycle time — is refused by `show` and by
/// `export` (exit 3, nothing written), naming the plan file and the field.
#[test]
fn show_and_export_refuse_a_plan_out_of_the_planners_ranges() {
    let d = scratch("ranges");
    let (path, _) = plan(&d, "horovod");
    let text = std::fs::read_to_string(&path).unwrap();
    // The plan as made passes both.
    let (code, _, err) = run(&["show", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let nines = format!("1{}", "0".repeat(308));
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "bn1.bias: 256",
            "bn1.bias: 18446744073709551615".into(),
            "config.tensor_bytes[\"bn1.bias\"]",
        ),
        (
            "planned:\n    iteration_ms:",
            "planned:\n    iteration_ms: -5.0 #".into(),
            "predicted.planned.iteration_ms",
        ),
        (
            "baseline:\n    iteration_ms:",
            "baseline:\n    iteration_ms: .nan #".into(),
            "predicted.baseline.iteration_ms",
        ),
        ("speedup:", "speedup: 1000.0 #".into(), "predicted.speedup"),
        ("ranks: 8", "ranks: 0".into(), "workload.ranks"),
        (
            "grad_accumulation: 1",
            "grad_accumulation: 4294967295".into(),
            "config.grad_accumulation",
        ),
        (
            "grad_accumulation: 1",
            "grad_accumulation: 3".into(),
            "config.grad_accumulation",
        ),
        (
            "partitions: {}",
            "partitions: {conv1.weight: 0}".into(),
            "config.partitions[\"conv1.weight\"]",
        ),
        ("dtype: fp32", "dtype: float64".into(), "config.dtype"),
        (
            "decisions:\n",
            "decisions:\n- pass: amp\n  knobs:\n    dtype: float64\n  why: x\n  effect_ms: -1.0\n"
                .into(),
            "decisions[0].knobs.dtype",
        ),
        (
            "cycle_ms: \"1\"",
            format!("cycle_ms: \"{nines}\""),
            "decisions[0].knobs.cycle_ms",
        ),
    ];
    for (from, to, field) in cases {
        assert!(text.contains(from), "the plan has no {from:?}");
        let bad = d.join("bad.yaml");
        std::fs::write(&bad, text.replacen(from, &to, 1)).unwrap();
        let want = format!("{}: {field}: ", bad.display());
        let msg = check_bad_input(&["show", bad.to_str().unwrap()], &want);
        assert!(msg.starts_with(&want), "{msg}");
        let out = d.join("out");
        for fw in ["horovod", "pytorch", "byteps", "xla", "jax"] {
            let args = [
                "export",
                bad.to_str().unwrap(),
                "--to",
                fw,
                "-o",
                out.to_str().unwrap(),
            ];
            check_bad_input(&args, &want);
        }
        assert!(!out.exists(), "{field}: an export was written");
    }
}
