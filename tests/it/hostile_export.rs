//! Exported files cannot be injected (issue 14, class 1): plans whose every name is hostile —
//! quotes, triple quotes, backslashes, newlines, `\r`, NUL, `$(…)`, backquotes, ANSI escapes,
//! encoding declarations, Unicode line separators, arbitrary Unicode — are exported for every
//! framework; then, in a scratch folder, every Python file is compiled and imported
//! (`python3`), every env file is sourced the README's way (`set -a; . FILE; set +a`, with
//! bash and with /bin/sh), and the test checks that nothing ran (no `PWNED` file appeared) and
//! that the planned values came back exactly: tensor groups, names, recomputed modules, the
//! TF's untargeted layer names (no cluster file), BytePS' per-tensor records, every env value,
//! and the FSDP2 units of a sharded plan (stage 3 over the plan's 8 ranks, hostile unit names,
//! the root `""` among them; the worst case runs sharded and unsharded, the proptest plans draw
//! either), and torchtitan.toml's description (read back by the `toml` crate), DeepSpeed's ds_config.json numbers.
//!
//! Slots with a closed set of values (`workload.source`, `workload.names`, `config.dtype`,
//! `amp`'s dtype knob) are not escaped but refused: a hostile value there fails the plan check
//! at its field, in the reader and in every emitter (issue 20, class 5).
//!
//! Three levels: a fixed worst-case plan (every fragment in every slot; always run), proptest
//! plans through the real interpreters (`TRAINPLAN_FUZZ_CASES`, default 12: each case starts
//! python3 and 10 shells), and an in-process property over many more plans checking the
//! textual invariants (no control character in any file, every record field parses back, the
//! first two lines of each module fixed) — the emitters' fuzz target. The end-to-end half
//! (`hostile_cluster_and_trace_names_end_to_end`) goes through the binary: a cluster file and
//! a trace file name (non-UTF-8 bytes included) with injections, `plan`, then `export`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use proptest::prelude::*;
use serde_json::Value;

use trainplan::plan::emit::escape::{env_line, parse_record_field};
use trainplan::plan::emit::{Framework, emit};
use trainplan::plan::{
    FinalConfig, Plan, Point, Predicted, SCHEMA_VERSION, SearchStats, ShardConfig, Workload,
};
use trainplan::search::{Decision, StopReason, Strategy as SearchStrategy};

use crate::support::{TINY_TRACE, scratch};

/// Pieces of hostile names. Each would run `touch PWNED` (or corrupt a file) if it reached a
/// Python file, a comment or a shell line unescaped.
const FRAGMENTS: [&str; 22] = [
    "\"\"\"\nimport os; os.system('touch PWNED')\n\"\"\"",
    "'''\nimport os; os.system('touch PWNED')\n'''",
    "\nimport os; os.system('touch PWNED')\n",
    "\rimport os; os.system('touch PWNED')\r",
    "\r\n__import__('os').system('touch PWNED')#",
    "\u{2028}__import__('os').system('touch PWNED')",
    "\"; __import__('os').system('touch PWNED'); \"",
    "\\",
    "\\\"",
    "\0",
    "$(touch PWNED)",
    "`touch PWNED`",
    "'; touch PWNED; '",
    "\ntouch PWNED\n",
    "\rtouch PWNED\r",
    "# -*- coding: utf-7 -*-",
    "+AAo-import os; os.system('touch PWNED')",
    "\u{1b}[2J\u{1b}]0;title\u{7}",
    "é\u{85}😀",
    " spaced name ",
    "#comment",
    "layer1.0.conv1",
];

/// Whether `cmd` runs. `--version`, which python3 and bash both answer: `-c "exit 0"` is a
/// syntax error to python3, so the import half was skipped on every machine until issue 23.
fn has(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The names one hostile plan uses, slot by slot.
#[derive(Clone, Debug)]
struct Names {
    workload: [String; 4],
    tensors: Vec<String>,
    layers: Vec<String>,
    dtype: String,
    pass: String,
    /// FSDP units of a sharded plan (`""`, the root, may be one), or None: not sharded.
    units: Option<Vec<String>>,
    /// Replica groups of a sharded plan (1, 2 or 4 of its 8 ranks).
    replicas: u32,
}

fn decision(pass: &str, knobs: &[(&str, &str)], why: &str) -> Decision {
    Decision {
        pass: pass.into(),
        tensors: Vec::new(),
        ops: Vec::new(),
        partitions: None,
        knobs: knobs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        why: why.into(),
        effect_ms: -1.0,
        mechanism: why.into(),
    }
}

/// A closed-set slot (`workload.source`, `workload.names`, `config.dtype`, `amp`'s dtype knob):
/// the plan reader refuses any value it does not list, naming the field
/// ([`check_closed_slots`]), so a hostile one never reaches an emitter (issue 20, class 5); the
/// plan carries the listed value the name picks, or the first.
fn closed(v: &str, listed: &[&str]) -> String {
    listed
        .iter()
        .find(|a| **a == v)
        .unwrap_or(&listed[0])
        .to_string()
}

/// Each closed-set slot of `plan_of(n)` given `n`'s raw name: refused at its field by the plan
/// check, by the reader (naming the file) and by every emitter — unless the name is a listed
/// value.
fn check_closed_slots(n: &Names) {
    type Edit = fn(&mut Plan, &str);
    let slots: [(&str, &str, &[&str], Edit); 4] = [
        (
            "workload.source",
            &n.workload[0],
            &["zoo", "trace"],
            |p, v| p.workload.source = v.into(),
        ),
        (
            "workload.names",
            &n.workload[3],
            &["zoo", "trace"],
            |p, v| p.workload.names = v.into(),
        ),
        (
            "config.dtype",
            &n.dtype,
            &["fp32", "fp16", "bf16", "fp8", "fp64"],
            |p, v| p.config.dtype = v.into(),
        ),
        ("decisions[1].knobs.dtype", &n.dtype, &[], |p, v| {
            p.decisions[1].knobs.insert("dtype".into(), v.into());
        }),
    ];
    for (field, raw, listed, edit) in slots {
        let mut p = plan_of(n);
        edit(&mut p, raw);
        if listed.contains(&raw)
            || (field.ends_with("knobs.dtype") && trainplan::passes::amp::half_dtype(raw).is_some())
        {
            p.check().unwrap();
            continue;
        }
        let e = p.check().expect_err(field);
        assert_eq!(e.field, field, "{e}");
        let e = Plan::from_yaml(&p.to_yaml(), "hostile.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&format!("hostile.yaml: {field}: ")), "{e}");
        for fw in Framework::ALL {
            assert!(emit(&p, fw).is_err(), "{fw} exported {field} = {raw:?}");
        }
    }
}

/// A plan with every name from `n`: tensors in groups of two (the first group partitioned in
/// 3), fused clusters of consecutive layers, every layer recomputed, AMP, k = 2, a Horovod
/// baseline's cycle, and when `n.units` is given stage-3 sharding of those units over its 8
/// ranks (`n.replicas` groups); closed-set slots hold a listed value ([`closed`]).
fn plan_of(n: &Names) -> Plan {
    let groups: Vec<Vec<String>> = n.tensors.chunks(2).map(|c| c.to_vec()).collect();
    let fused: Vec<Vec<String>> = n
        .layers
        .windows(2)
        .map(|w| vec![format!("{} FW", w[0]), format!("{} BW", w[1])])
        .collect();
    Plan {
        trainplan: SCHEMA_VERSION,
        workload: Workload {
            source: closed(&n.workload[0], &["zoo", "trace"]),
            ranks: 8,
            model: n.workload[1].clone(),
            batch: Some(4),
            cluster: n.workload[2].clone(),
            names: closed(&n.workload[3], &["zoo", "trace"]),
            framework: Default::default(),
        },
        predicted: Predicted {
            baseline_precision: String::new(),
            half_baseline: None,
            tokens_per_s_per_gpu: None,
            mfu: None,
            baseline_name: n.pass.clone(),
            baseline: Point {
                iteration_ms: 10.0,
                peak_memory_bytes: Some(1 << 30),
                reserved_peak_bytes: None,
                device_used_bytes: None,
            },
            planned: Point {
                iteration_ms: 8.0,
                peak_memory_bytes: Some(1 << 29),
                reserved_peak_bytes: None,
                device_used_bytes: None,
            },
            speedup: 1.25,
            lower_bound_ms: Some(7.0),
            gpu_memory_bytes: None,
            memory_budget_bytes: None,
        },
        baselines: BTreeMap::from([(n.pass.clone(), 10.0)]),
        decisions: vec![
            decision(
                "baseline:horovod_default",
                &[],
                &format!("{} cycle 5 ms", n.pass),
            ),
            decision(
                "amp",
                &[
                    ("dtype", &closed(&n.dtype, &["fp16", "bf16"])),
                    ("fp16_allreduce", "1"),
                ],
                &n.pass,
            ),
            decision(&n.pass, &[(&n.pass, &n.dtype)], &n.pass),
        ],
        advice: vec![trainplan::search::Advice {
            pass: n.pass.clone(),
            effect_ms: -1.0,
            why_not: n.pass.clone(),
        }],
        config: FinalConfig {
            dtype: closed(&n.dtype, &["fp32", "fp16", "bf16"]),
            partitions: BTreeMap::from([(groups[0][0].clone(), 3)]),
            tensor_bytes: n.tensors.iter().map(|t| (t.clone(), 1 << 20)).collect(),
            tensor_groups: groups,
            fused_ops: fused,
            passes: vec!["amp".into(), n.pass.clone(), "fused-adam".into()],
            grad_accumulation: 2,
            recompute: n.layers.clone(),
            sharding: n.units.as_ref().map(|units| ShardConfig {
                stage: 3,
                shard_size: 8 / n.replicas,
                replicas: n.replicas,
                reshard: true,
                prefetch: 2,
                offload: false,
                units: units.clone(),
                unit_bytes: vec![1 << 20; units.len()],
            }),
            tensor_parallel: None,
            context_parallel: None,
            pipeline: None,
        },
        search: SearchStats {
            strategy: SearchStrategy::CriticalPath,
            budget_s: 60.0,
            replays: 10,
            rounds: 2,
            stop: StopReason::Converged,
            seed: 0,
        },
    }
}

/// Distinct names: `i` is appended (a plan may not name a tensor twice).
fn distinct(v: Vec<String>) -> Vec<String> {
    v.into_iter()
        .enumerate()
        .map(|(i, s)| format!("{s}{i}"))
        .collect()
}

/// Every fragment in every slot.
fn worst_case() -> Names {
    let all: Vec<String> = FRAGMENTS.iter().map(|s| s.to_string()).collect();
    Names {
        workload: [
            FRAGMENTS[0].into(),
            FRAGMENTS[3].into(),
            FRAGMENTS.concat(),
            FRAGMENTS[10].into(),
        ],
        tensors: distinct(all.clone()),
        layers: distinct(all.clone()),
        dtype: FRAGMENTS[4].into(),
        pass: FRAGMENTS[11].into(),
        units: Some(
            std::iter::once(String::new())
                .chain(distinct(all))
                .collect(),
        ),
        replicas: 2,
    }
}

/// Text invariants of every emitted file: no control character but `\n`, no Unicode line
/// separator; the first two lines of a Python module are the emitter's own (the same as for a
/// benign plan), so no encoding declaration can come from the plan.
fn check_text(fw: Framework, files: &[(String, String)], sharded: bool) {
    let benign = emit(&exportable(&plan_of(&benign_names(sharded)), fw), fw).unwrap();
    for (name, text) in files {
        if let Some(c) = text
            .chars()
            .find(|&c| (c.is_control() && c != '\n') || matches!(c, '\u{2028}' | '\u{2029}'))
        {
            panic!("{fw}/{name} holds U+{:04X}:\n{text}", c as u32);
        }
        if name.ends_with(".py") {
            let fixed = &benign.files.iter().find(|(n, _)| n == name).unwrap().1;
            let head = |t: &str| t.lines().take(2).map(str::to_string).collect::<Vec<_>>();
            assert_eq!(head(text), head(fixed), "{fw}/{name}: first two lines");
        }
    }
}

/// `plan` as `fw`'s export takes it: Megatron-LM refuses recomputation of chosen modules and
/// sharding past stage 1 (its unit tests hold it to that, naming the fields), so its files
/// are checked on the same hostile plan without them.
fn exportable(plan: &Plan, fw: Framework) -> Plan {
    let mut p = plan.clone();
    if fw == Framework::Megatron {
        p.config.recompute.clear();
        if let Some(sh) = &mut p.config.sharding {
            sh.stage = 1;
            sh.replicas = 1;
            sh.shard_size = plan.workload.ranks;
        }
    }
    p
}

fn benign_names(sharded: bool) -> Names {
    let v = |p: &str| (0..4).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
    Names {
        workload: ["zoo".into(), "m".into(), "c".into(), "zoo".into()],
        tensors: v("t"),
        layers: v("l"),
        dtype: "fp16".into(),
        pass: "my-pass".into(),
        units: sharded.then(|| v("u")),
        replicas: 1,
    }
}

/// Records of a one-record-per-line file: the non-comment lines split on spaces, the first
/// field unescaped.
fn records(text: &str, fields: usize) -> Vec<(String, Vec<String>)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), fields, "record {l:?}");
            let name = parse_record_field(f[0]).unwrap_or_else(|| panic!("field {:?}", f[0]));
            (name, f[1..].iter().map(|s| s.to_string()).collect())
        })
        .collect()
}

/// Export `plan` for every framework into `root/<fw>/`, run the interpreters there and check
/// that nothing ran and the values came back. Skips (with a message) without python3 or bash.
fn check_inert(plan: &Plan, root: &Path) {
    assert_eq!(
        Plan::from_yaml(&plan.to_yaml(), "hostile.yaml").unwrap(),
        *plan,
        "the plan file round-trips"
    );
    let mut py_files = Vec::new();
    let mut env_files = Vec::new();
    let mut texts: BTreeMap<(Framework, String), String> = BTreeMap::new();
    for fw in Framework::ALL {
        let e = emit(&exportable(plan, fw), fw).unwrap_or_else(|e| panic!("{fw}: {e}"));
        check_text(fw, &e.files, plan.config.sharding.is_some());
        let dir = root.join(fw.name());
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in &e.files {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            if name.ends_with(".py") {
                py_files.push((fw, p.clone()));
            } else if name.ends_with(".env") {
                env_files.push(p.clone());
            }
            texts.insert((fw, name.clone()), text.clone());
        }
    }
    let text = |fw: Framework, name: &str| texts[&(fw, name.to_string())].as_str();

    // Text files: every record's name parses back, in plan order.
    let flat: Vec<&String> = plan.config.tensor_groups.iter().flatten().collect();
    let bps = records(text(Framework::Byteps, "byteps_partitions.txt"), 3);
    assert_eq!(bps.iter().map(|r| &r.0).collect::<Vec<_>>(), flat);
    assert_eq!(bps[0].1, ["3", "0"]);
    // TF: a zoo plan's names are not a Keras model's nodes, so no cluster file is written.
    assert!(!texts.contains_key(&(Framework::Xla, "xla_clusters.txt".to_string())));
    // torchtitan.toml: a TOML reader gets the plan's text back exactly, and the degrees and
    // batch sizes as planned (8 ranks: replicated, or shard groups x replicas when sharded;
    // batch 4 in k = 2 micro-batches).
    let titan: toml::Table = text(Framework::Torchtitan, "torchtitan.toml")
        .parse()
        .unwrap_or_else(|e| panic!("torchtitan.toml: {e}"));
    let w = &plan.workload;
    let want = format!(
        "trainplan plan: {} on {} ({} ranks)",
        w.model, w.cluster, w.ranks
    );
    assert_eq!(titan["job"]["description"].as_str(), Some(want.as_str()));
    let (replicate, shard) = match &plan.config.sharding {
        Some(sh) => (i64::from(sh.replicas), i64::from(sh.shard_size)),
        None => (8, 1),
    };
    assert_eq!(
        titan["parallelism"]["data_parallel_replicate_degree"].as_integer(),
        Some(replicate)
    );
    assert_eq!(
        titan["parallelism"]["data_parallel_shard_degree"].as_integer(),
        Some(shard)
    );
    assert_eq!(titan["training"]["local_batch_size"].as_integer(), Some(2));
    assert_eq!(
        titan["training"]["global_batch_size"].as_integer(),
        Some(32)
    );
    // DeepSpeed: the JSON parses and holds the plan's numbers (batch 4 per GPU, k = 2, 8 ranks).
    let ds: Value = serde_json::from_str(text(Framework::Deepspeed, "ds_config.json")).unwrap();
    assert_eq!(ds["gradient_accumulation_steps"], 2);
    assert_eq!(ds["train_micro_batch_size_per_gpu"], 2);
    assert_eq!(ds["train_batch_size"], 32);

    if !has("python3") || !has("bash") {
        crate::skip_note!("python3 or bash not found: skipping the import and source half");
        return;
    }
    // Megatron-LM's file sourced by bash in an empty environment as a launch script would:
    // nothing else runs (no file appears), and the array is the export's own flags with
    // integers and fixed words — the plan's numbers (batch 4 per GPU in k = 2 micro-batches
    // of 2 on 8 ranks: a global batch of 32).
    let mega = root.join(Framework::Megatron.name());
    let before = std::fs::read_dir(&mega).unwrap().count();
    let o = Command::new("env")
        .args(["-i", "PATH=/usr/bin:/bin", "bash", "-c"])
        .arg(r#". ./megatron_args.sh && printf '%s\n' "${TRAINPLAN_MEGATRON_ARGS[@]}""#)
        .current_dir(&mega)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_dir(&mega).unwrap().count(), before);
    let args: Vec<String> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        args.iter().all(|a| a.starts_with("--")
            && a[2..]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            || a.chars().all(|c| c.is_ascii_alphanumeric())),
        "{args:?}"
    );
    let after = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .map(|i| args[i + 1].as_str())
    };
    assert_eq!(after("--micro-batch-size"), Some("2"));
    assert_eq!(after("--global-batch-size"), Some("32"));
    let got = import_all(root, py_files.iter().map(|(_, p)| p.as_path()));
    let module = |fw: Framework| -> &Value {
        let p = &py_files.iter().find(|(f, _)| *f == fw).unwrap().1;
        &got[p.to_str().unwrap()]
    };
    let groups = serde_json::to_value(&plan.config.tensor_groups).unwrap();
    let names = Value::from(plan.workload.names.clone());
    let hvd = module(Framework::Horovod);
    assert_eq!(hvd["GROUPS"], groups);
    assert_eq!(hvd["NAMES"], names);
    assert_eq!(hvd["BACKWARD_PASSES_PER_STEP"], 2);
    let ds = module(Framework::Deepspeed);
    assert_eq!(ds["NAMES"], names);
    assert_eq!(ds["GRADIENT_ACCUMULATION_STEPS"], 2);
    let pt = module(Framework::Pytorch);
    assert_eq!(pt["TENSOR_GROUPS"], groups);
    assert_eq!(pt["NAMES"], names);
    let half = match plan.config.dtype.as_str() {
        "fp16" | "bf16" => plan.config.dtype.clone(),
        _ => plan.decisions[1].knobs["dtype"].clone(),
    };
    assert_eq!(pt["DTYPE"], Value::from(half));
    // FSDP2: the unit names come back exactly, and the mesh is the plan's.
    let sh = plan.config.sharding.as_ref();
    assert_eq!(pt["SHARDED"], Value::from(sh.is_some()));
    if let Some(sh) = sh {
        assert_eq!(pt["FSDP_UNITS"], serde_json::to_value(&sh.units).unwrap());
        assert_eq!(pt["FSDP_REPLICAS"], sh.replicas);
        assert_eq!(pt["FSDP_SHARD_SIZE"], sh.shard_size);
    }
    let xla = module(Framework::Xla);
    let jax = module(Framework::Jax);
    assert_eq!(pt["RECOMPUTE_MODULES"], jax["RECOMPUTE_MODULES"]);
    for m in pt["RECOMPUTE_MODULES"].as_array().unwrap() {
        let m = m.as_str().unwrap();
        assert!(
            plan.config
                .recompute
                .iter()
                .any(|l| l == m || l.starts_with(&format!("{m}."))),
            "recomputed module {m:?} is not a planned layer or a parent of one"
        );
    }
    // The layers the TF export says it cannot target come back as they were planned.
    let untargeted: std::collections::BTreeSet<String> = xla["UNTARGETED_LAYERS"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let planned: std::collections::BTreeSet<String> =
        plan.config.recompute.iter().cloned().collect();
    assert!(planned.is_subset(&untargeted), "{untargeted:?}");
    assert_eq!(xla["NAMES"], names);

    for env in &env_files {
        source_all(root, env);
    }
    let horovod_env = text_env(text(Framework::Horovod, "horovod.env"));
    assert_eq!(horovod_env["HOROVOD_DISABLE_GROUP_FUSION"], "1");
    assert_eq!(horovod_env["HOROVOD_CYCLE_TIME"], "5");

    assert!(
        !root.join("PWNED").exists(),
        "an injected command ran (PWNED in {})",
        root.display()
    );
}

/// Compile and import every module (python3, cwd `root`) and return each one's upper-case
/// constants, by path.
fn import_all<'a>(root: &Path, files: impl Iterator<Item = &'a Path>) -> Value {
    let script = r#"
import importlib.util, json, os, py_compile, sys
out = {}
for path in sys.argv[1:]:
    py_compile.compile(path, doraise=True)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    out[path] = {k: v for k, v in vars(m).items() if k.isupper() and isinstance(v, (str, int, list, dict))}
json.dump(out, sys.stdout)
"#;
    let o = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(files)
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Source `env` the README's way with bash and with /bin/sh (cwd `root`, a clean environment)
/// and check that every variable has the value the file's quoting says.
fn source_all(root: &Path, env: &Path) {
    let expect: BTreeMap<String, String> = text_env(&std::fs::read_to_string(env).unwrap());
    for shell in ["bash", "/bin/sh"] {
        let o = Command::new("env")
            .args(["-i", "PATH=/usr/bin:/bin", shell, "-c"])
            .arg("set -a; . \"$1\"; set +a; env -0")
            .arg("sh")
            .arg(env)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{shell} {}: {}",
            env.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        let seen: BTreeMap<String, String> = String::from_utf8(o.stdout)
            .unwrap()
            .split('\0')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (k, v) in &expect {
            assert_eq!(seen.get(k), Some(v), "{shell} {}: {k}", env.display());
        }
    }
}

/// `KEY=value` lines of an env file, values unquoted as `env_value` quotes them.
fn text_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not KEY=value: {l}"));
            let v = match v.strip_prefix('\'') {
                None => v.to_string(),
                Some(q) => q
                    .strip_suffix('\'')
                    .unwrap_or_else(|| panic!("{l}"))
                    .replace("'\\''", "'"),
            };
            (k.to_string(), v)
        })
        .collect()
}

#[test]
fn worst_case_plan_exports_inert_files_for_every_framework() {
    let root = scratch("worst");
    check_inert(&plan_of(&worst_case()), &root);
    check_closed_slots(&worst_case());
    let _ = std::fs::remove_dir_all(&root);
    // The same names without sharding (the DDP path of the PyTorch export).
    let root = scratch("worst-ddp");
    let unsharded = Names {
        units: None,
        ..worst_case()
    };
    check_inert(&plan_of(&unsharded), &root);
    let _ = std::fs::remove_dir_all(&root);
}

fn hostile_name() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::sample::select(FRAGMENTS.to_vec()).prop_map(String::from),
            2 => any::<String>(),
            1 => "[a-z_.]{1,8}",
        ],
        1..4,
    )
    .prop_map(|v| v.concat())
}

fn hostile_names() -> impl Strategy<Value = Names> {
    (
        [
            hostile_name(),
            hostile_name(),
            hostile_name(),
            hostile_name(),
        ],
        prop::collection::vec(hostile_name(), 1..6),
        prop::collection::vec(hostile_name(), 1..5),
        hostile_name(),
        hostile_name(),
        prop::option::of((prop::collection::vec(hostile_name(), 1..4), any::<bool>())),
        prop::sample::select(vec![1u32, 2, 4]),
    )
        .prop_map(
            |(workload, tensors, layers, dtype, pass, units, replicas)| Names {
                workload,
                tensors: distinct(tensors),
                layers: distinct(layers),
                dtype,
                pass,
                // Distinct names, the root unit first when drawn.
                units: units.map(|(u, root)| {
                    let root = root.then(String::new);
                    root.into_iter().chain(distinct(u)).collect()
                }),
                replicas,
            },
        )
}

fn cases(default: u32) -> u32 {
    std::env::var("TRAINPLAN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    // Each case runs python3 once and 10 shells: 12 cases by default, TRAINPLAN_FUZZ_CASES=N.
    #![proptest_config(ProptestConfig { cases: cases(12), ..ProptestConfig::default() })]

    #[test]
    fn hostile_plans_export_inert_files(n in hostile_names()) {
        let root = scratch("prop");
        check_inert(&plan_of(&n), &root);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Any value without control characters, sourced by bash and /bin/sh, comes back exactly.
    #[test]
    fn env_values_round_trip_through_the_shells(
        values in prop::collection::vec("[^\\p{Cc}]{0,24}|[ -~]{0,24}", 1..8)
    ) {
        if !has("bash") {
            return Ok(());
        }
        let root = scratch("envrt");
        let mut file = String::new();
        for (i, v) in values.iter().enumerate() {
            file.push_str(&env_line(&format!("V{i}"), v).unwrap());
        }
        let p = root.join("v.env");
        std::fs::write(&p, &file).unwrap();
        for shell in ["bash", "/bin/sh"] {
            let script = format!(
                "set -a; . \"$1\"; set +a; {}",
                (0..values.len()).map(|i| format!("printf '%s\\0' \"$V{i}\"")).collect::<Vec<_>>().join("; ")
            );
            let o = Command::new("env")
                .args(["-i", "PATH=/usr/bin:/bin", shell, "-c"])
                .arg(script)
                .arg("sh")
                .arg(&p)
                .current_dir(&root)
                .output()
                .unwrap();
            prop_assert!(o.status.success(), "{}: {}", shell, String::from_utf8_lossy(&o.stderr));
            let out = String::from_utf8(o.stdout).unwrap();
            let back: Vec<&str> = out.split('\0').take(values.len()).collect();
            prop_assert_eq!(back, values.iter().map(String::as_str).collect::<Vec<_>>(), "{}:\n{}", shell, file);
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}

proptest! {
    // In-process only (no interpreter): many more plans. The emitters' fuzz target.
    #![proptest_config(ProptestConfig { cases: cases(12) * 16, ..ProptestConfig::default() })]

    #[test]
    fn emitters_keep_every_file_printable_and_parsable(n in hostile_names()) {
        check_closed_slots(&n);
        let plan = plan_of(&n);
        for fw in Framework::ALL {
            let e = emit(&exportable(&plan, fw), fw).unwrap();
            check_text(fw, &e.files, plan.config.sharding.is_some());
            if let Some((_, t)) = e.files.iter().find(|(n, _)| n.ends_with(".txt")) {
                let fields = if fw == Framework::Byteps { 3 } else { 2 };
                let _ = records(t, fields);
            }
        }
    }
}

/// `trainplan ARGS` in `dir`: (exit code, stderr).
fn trainplan(dir: &Path, args: &[&std::ffi::OsStr]) -> (i32, String) {
    let o = crate::support::trainplan()
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        o.status.code().unwrap(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `plan` then `export` for every framework, the files imported and sourced: nothing runs.
fn plan_and_export_inert(dir: &Path, input: &[&std::ffi::OsStr]) {
    let mut args: Vec<&std::ffi::OsStr> = vec!["plan".as_ref()];
    args.extend_from_slice(input);
    args.extend(["--max-rounds", "100", "-o", "p.yaml", "--json"].map(std::ffi::OsStr::new));
    let (code, err) = trainplan(dir, &args);
    assert_eq!(code, 0, "{err}");
    let plan = Plan::from_yaml(&std::fs::read_to_string(dir.join("p.yaml")).unwrap(), "p").unwrap();
    let mut py = Vec::new();
    for fw in Framework::ALL {
        let out = dir.join(fw.name());
        let (code, err) = trainplan(
            dir,
            &[
                "export".as_ref(),
                "p.yaml".as_ref(),
                "--to".as_ref(),
                fw.name().as_ref(),
                "-o".as_ref(),
                out.as_os_str(),
                "--json".as_ref(),
            ],
        );
        assert_eq!(code, 0, "{fw}: {err}");
        let mut files: Vec<(String, String)> = Vec::new();
        for e in std::fs::read_dir(&out).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            files.push((name.clone(), std::fs::read_to_string(&p).unwrap()));
            if name.ends_with(".py") {
                py.push((fw, p));
            } else if name.ends_with(".env") && has("bash") {
                source_all(dir, &p);
            }
        }
        assert_eq!(emit(&plan, fw).unwrap().files.len(), files.len());
        for (name, text) in &files {
            assert!(
                !text.chars().any(|c| c.is_control() && c != '\n'),
                "{fw}/{name}:\n{text}"
            );
        }
    }
    if has("python3") {
        let got = import_all(dir, py.iter().map(|(_, p)| p.as_path()));
        let hvd = &got[py[0].1.to_str().unwrap()];
        assert_eq!(
            hvd["GROUPS"],
            serde_json::to_value(&plan.config.tensor_groups).unwrap()
        );
    }
    assert!(!dir.join("PWNED").exists(), "an injected command ran");
}

#[test]
fn hostile_cluster_and_trace_names_end_to_end() {
    use std::os::unix::ffi::OsStrExt;
    let dir = scratch("e2e-cluster");
    // A cluster whose name closes a docstring, a comment line (\r too) and a shell line.
    std::fs::write(
        dir.join("evil.yaml"),
        "name: \"x\\\"\\\"\\\"\\nimport os; os.system('touch PWNED')\\n#\\r$(touch PWNED)\\r__import__('os').system('touch PWNED')\"\n\
         gpu: a100-80gb\nnodes: 1\ngpus_per_node: 2\nintra: nvlink-a100\nsync: ring\n",
    )
    .unwrap();
    plan_and_export_inert(
        &dir,
        &[
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            "evil.yaml",
        ]
        .map(std::ffi::OsStr::new),
    );
    let _ = std::fs::remove_dir_all(&dir);

    // A trace whose file name (the plan's model) holds non-UTF-8 bytes, newlines, `\r`, quotes
    // and command substitutions.
    let dir = scratch("e2e-trace");
    let name = std::ffi::OsStr::from_bytes(
        b"r\xff\xfe\"\"\"\nimport os; os.system('touch PWNED')\n$(touch PWNED)`touch PWNED`\r.json",
    );
    std::fs::write(dir.join(name), TINY_TRACE).unwrap();
    plan_and_export_inert(&dir, &["--trace".as_ref(), name]);
    let _ = std::fs::remove_dir_all(&dir);
}
