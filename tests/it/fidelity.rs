//! `experiments/fidelity`: its committed results are the code's, and the README shows them.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The summary table of `experiments/results/fidelity.md` (its first table).
fn summary_table() -> String {
    let md = std::fs::read_to_string(root().join("experiments/results/fidelity.md"))
        .expect("experiments/results/fidelity.md is committed");
    md.lines()
        .skip_while(|l| !l.starts_with("| prediction |"))
        .take_while(|l| l.starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_readme_shows_the_fidelity_table_the_experiment_wrote() {
    let table = summary_table();
    assert!(
        table.lines().count() >= 6,
        "the summary table has a header, a rule and the four predictions:\n{table}"
    );
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    assert!(
        readme.contains(&table),
        "README.md's fidelity table differs from experiments/results/fidelity.md's; \
         copy it from there:\n{table}"
    );
}

/// The example binary `cargo test` built beside the test binaries (built here when only this
/// test binary was built).
fn fidelity_example() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_trainplan"));
    let dir = bin.parent().expect("the target folder");
    let exe = dir.join("examples").join("fidelity");
    // Always through cargo (a no-op when it is up to date): an example binary left from an
    // older build would check the committed results against older code.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // In the profile the tests were built with (`cargo test --release` looks in release/).
    let mut args = vec!["build", "--example", "fidelity"];
    if dir.ends_with("release") {
        args.push("--release");
    }
    let st = Command::new(cargo)
        .args(&args)
        .current_dir(root())
        .status()
        .expect("cargo runs");
    assert!(st.success(), "cargo build --example fidelity failed");
    exe
}

#[test]
fn the_committed_fidelity_results_are_what_the_code_predicts() {
    // Every 37th case (12 of them, every source) predicted again and compared with the
    // committed fidelity.csv: a change to the cost model must re-run the experiment.
    let out = Command::new(fidelity_example())
        .args(["--check", "37"])
        .current_dir(root())
        .output()
        .expect("the fidelity example runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "experiments/results/fidelity.csv is stale: re-run `cargo run --release --example \
         fidelity`:\n{err}"
    );
    let n: usize = err
        .lines()
        .find_map(|l| l.strip_prefix("checked "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .expect("the check says how many figures it compared");
    assert!(n >= 10, "only {n} figures compared:\n{err}");
}
