//! `trainplan export` end to end: plan → export for every framework, the files written where
//! asked (atomically, nothing left over), Python files compiling, env files parsing, and bad
//! input: an unknown `--to` (exit 2 listing the known ones), a plan of another schema version
//! and a malformed plan (exit 3 naming the file and line).

use std::path::PathBuf;

use crate::support::{check_bad_input, run, run_json, scratch};

const FRAMEWORKS: [&str; 5] = ["horovod", "xla", "byteps", "pytorch", "jax"];

/// A quick ResNet-50 plan (batch 2 on the dPRO TCP testbed, 20 s budget).
fn make_plan(dir: &std::path::Path) -> PathBuf {
    let p = dir.join("plan.yaml");
    let (code, _, err) = run(&[
        "plan",
        "--model",
        "resnet50",
        "--batch",
        "2",
        "--cluster",
        "dpro-16xv100-tcp",
        "--max-rounds",
        "100",
        "-o",
        p.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    p
}

fn py_compile(path: &std::path::Path) {
    match std::process::Command::new("python3")
        .args(["-m", "py_compile"])
        .arg(path)
        .output()
    {
        Err(_) => eprintln!(
            "python3 not found: skipping py_compile of {}",
            path.display()
        ),
        Ok(o) => assert!(
            o.status.success(),
            "{} does not compile: {}",
            path.display(),
            String::from_utf8_lossy(&o.stderr)
        ),
    }
}

#[test]
fn plan_then_export_for_every_framework() {
    let dir = scratch("all");
    let plan = make_plan(&dir);
    for fw in FRAMEWORKS {
        let v = run_json(&["export", plan.to_str().unwrap(), "--to", fw]);
        let out = dir.join(format!("trainplan-{fw}"));
        assert_eq!(
            v["dir"],
            out.display().to_string(),
            "default DIR next to the plan"
        );
        assert_eq!(v["framework"], fw);
        let files: Vec<PathBuf> = v["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| PathBuf::from(f.as_str().unwrap()))
            .collect();
        assert!(!files.is_empty());
        let notes = v["notes"].as_array().unwrap();
        assert!(
            notes[0].as_str().unwrap().contains("names are the zoo's"),
            "{notes:?}"
        );
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            let name = f.file_name().unwrap().to_str().unwrap();
            if name.ends_with(".py") {
                py_compile(f);
            }
            if name.ends_with(".env") {
                for l in text
                    .lines()
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                {
                    let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("{name}: {l}"));
                    assert!(!k.contains(' ') && !v.starts_with(' '), "{name}: {l}");
                }
            }
        }
        // Only the files listed (and python's __pycache__), no temporary leftovers.
        let names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "__pycache__")
            .collect();
        assert_eq!(names.len(), files.len(), "{names:?}");
    }
    // Horovod: the threshold holds the largest planned group; PyTorch: buckets by size.
    let env = std::fs::read_to_string(dir.join("trainplan-horovod/horovod.env")).unwrap();
    assert!(env.contains("\nHOROVOD_FUSION_THRESHOLD="), "{env}");
    assert!(env.contains("\nHOROVOD_DISABLE_GROUP_FUSION=1\n"));
    let py = std::fs::read_to_string(dir.join("trainplan-pytorch/trainplan_patch.py")).unwrap();
    assert!(py.contains("\"fc.weight\""));
    assert!(py.contains("def apply_plan(model"));
    // Deterministic: a second export writes the same bytes.
    let again = scratch("again");
    run_json(&[
        "export",
        plan.to_str().unwrap(),
        "--to",
        "pytorch",
        "-o",
        again.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read_to_string(again.join("trainplan_patch.py")).unwrap(),
        py
    );
    // Human output lists the files and the notes.
    let (code, out, _) = run(&["export", plan.to_str().unwrap(), "--to", "horovod"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("horovod.env") && out.contains("to do:"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&again);
}

#[test]
fn unknown_framework_is_a_usage_error_listing_the_known_ones() {
    let (code, out, err) = run(&["export", "plan.yaml", "--to", "megatron-lm"]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert!(
        err.contains("horovod, xla, byteps, pytorch, jax, deepspeed, torchtitan, megatron"),
        "{err}"
    );
}

#[test]
fn bad_plans_are_bad_input_naming_the_file() {
    let dir = scratch("bad");
    let plan = make_plan(&dir);
    let text = std::fs::read_to_string(&plan).unwrap();
    let v2 = dir.join("v2.yaml");
    std::fs::write(&v2, text.replacen("trainplan: 1", "trainplan: 7", 1)).unwrap();
    check_bad_input(
        &["export", v2.to_str().unwrap(), "--to", "pytorch"],
        "schema version 7; this trainplan reads version 1",
    );
    let broken = dir.join("broken.yaml");
    std::fs::write(&broken, text.replacen("  ranks: 16", "  ranks: sixteen", 1)).unwrap();
    let msg = check_bad_input(
        &["export", broken.to_str().unwrap(), "--to", "horovod"],
        "broken.yaml",
    );
    assert!(msg.contains("broken.yaml:4:"), "{msg}");
    check_bad_input(
        &[
            "export",
            dir.join("absent.yaml").to_str().unwrap(),
            "--to",
            "jax",
        ],
        "absent.yaml",
    );
    assert!(
        !dir.join("trainplan-horovod").exists(),
        "nothing written on error"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
