//! Peak memory of `trainplan plan` against `trainplan replay` on the same job (DESIGN.md: plan
//! needs at most 1.5× replay's memory; BERT-base on 65,536 GPUs plans in < 8 GiB).
//!
//! Each case runs the release binary twice as a child process — `replay` (with `--symmetric`
//! where the full graph is over the op limit, as a user would) and `plan` — and reads each
//! child's peak resident memory from `wait4`'s `ru_maxrss`. Cases: BERT-base on the dPRO
//! testbed (16 GPUs, 215 k ops, candidates evaluated in parallel), BERT-base on 1,024 and 8,192 GPUs
//! (symmetric form), VGG-16 on 1,024 GPUs (a full graph the report replays when it fits), and
//! BERT-base on 128 GPUs with `--no-symmetry` (every candidate a full 13.5 M-op graph). With
//! `PLAN_MEMORY_BIG=1`, also BERT-base on 65,536 GPUs (about half an hour on two cores).
//! Plans run with `--budget` `PLAN_MEMORY_BUDGET` (default 120s).
//!
//! Run: `cargo build --release && cargo run --release --example plan_memory`; writes
//! `experiments/results/plan_memory.md`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The release `trainplan` next to this example (`target/release/examples/..` → `target/release`).
fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the example's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/release/examples");
    let b = dir.join("trainplan");
    assert!(
        b.exists(),
        "{} is missing: run `cargo build --release` first",
        b.display()
    );
    b
}

/// Run `trainplan ARGS`: (peak resident memory in bytes, wall seconds, exit code).
fn run(args: &[String]) -> (u64, f64, i32) {
    let t = Instant::now();
    let child = Command::new(binary())
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("trainplan starts");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4");
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    // ru_maxrss is in KiB on Linux.
    (
        usage.ru_maxrss as u64 * 1024,
        t.elapsed().as_secs_f64(),
        code,
    )
}

fn cluster_file(dir: &Path, gpus: u32) -> String {
    let p = dir.join(format!("h100x{gpus}.yaml"));
    std::fs::write(
        &p,
        format!(
            "name: h100x{gpus}\ngpu: h100-sxm\nnodes: {}\ngpus_per_node: 8\nintra: nvlink-h100\ninter: ib-400g\nnics_per_node: 8\n",
            gpus / 8
        ),
    )
    .unwrap();
    p.display().to_string()
}

struct Case {
    name: String,
    /// `replay` with the framework's default synchronisation (what `trainplan replay` does).
    replay: Vec<String>,
    /// `replay --sync per-tensor`: the unoptimised job the plan's baselines and search start
    /// from (one collective per gradient tensor), the job `plan` works on.
    replay_per_tensor: Vec<String>,
    plan: Vec<String>,
}

fn case(name: &str, model: &str, cluster: &str, symmetric_replay: bool, extra: &[&str]) -> Case {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut replay = s(&["replay", "--model", model, "--cluster", cluster, "--json"]);
    if symmetric_replay {
        replay.push("--symmetric".into());
    }
    replay.extend(s(extra).into_iter().filter(|a| a != "--no-symmetry"));
    let mut replay_per_tensor = replay.clone();
    replay_per_tensor.extend(s(&["--sync", "per-tensor"]));
    let budget = std::env::var("PLAN_MEMORY_BUDGET").unwrap_or_else(|_| "120s".into());
    let out = std::env::temp_dir().join(format!("plan-memory-{}.yaml", std::process::id()));
    let mut plan = s(&[
        "plan",
        "--model",
        model,
        "--cluster",
        cluster,
        "--json",
        "--budget",
    ]);
    plan.push(budget);
    plan.push("-o".into());
    plan.push(out.display().to_string());
    plan.extend(s(extra));
    Case {
        name: name.into(),
        replay,
        replay_per_tensor,
        plan,
    }
}

fn main() {
    let dir = std::env::temp_dir().join(format!("plan-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c1024 = cluster_file(&dir, 1024);
    let c8192 = cluster_file(&dir, 8192);
    let mut cases = vec![
        case(
            "bert-base, dpro-16xv100-rdma",
            "bert-base",
            "dpro-16xv100-rdma",
            false,
            &[],
        ),
        case(
            "bert-base, 1,024 x H100 (symmetric)",
            "bert-base",
            &c1024,
            true,
            &[],
        ),
        case(
            "bert-base, 8,192 x H100 (symmetric)",
            "bert-base",
            &c8192,
            true,
            &[],
        ),
        case(
            "vgg16, 1,024 x H100 (full graph)",
            "vgg16",
            &c1024,
            false,
            &[],
        ),
        case(
            "bert-base, 128xv100-rdma, --no-symmetry",
            "bert-base",
            "128xv100-rdma",
            false,
            &["--no-symmetry"],
        ),
    ];
    if std::env::var("PLAN_MEMORY_BIG").is_ok_and(|v| v == "1") {
        let c65536 = cluster_file(&dir, 65536);
        cases.push(case(
            "bert-base, 65,536 x H100 (symmetric)",
            "bert-base",
            &c65536,
            true,
            &[],
        ));
    }
    let mut md = String::from(
        "# Peak memory: `plan` against `replay` on the same job\n\n\
         `cargo build --release && cargo run --release --example plan_memory` (peak resident memory of \
         each child process, `wait4` `ru_maxrss`; 2-core development machine). Target: plan ≤ 1.5× \
         replay; BERT-base on 65,536 GPUs plans in < 8 GiB.\n\n\
         `replay` is the command as a user runs it (the framework's default synchronisation: DDP \
         buckets); `replay --sync per-tensor` replays the unoptimised job `plan` starts from (one \
         collective per gradient tensor, the largest graph of the baselines); the ratio is plan \
         against the latter.\n\n\
         | job | replay | replay --sync per-tensor | plan | plan / per-tensor replay | plan wall | exit codes |\n|---|---|---|---|---|---|---|\n",
    );
    for c in &cases {
        let (r_mem, r_s, r_code) = run(&c.replay);
        let (t_mem, t_s, t_code) = run(&c.replay_per_tensor);
        let (p_mem, p_s, p_code) = run(&c.plan);
        let line = format!(
            "| {} | {:.2} GB ({r_s:.1} s) | {:.2} GB ({t_s:.1} s) | {:.2} GB | {:.2}x | {p_s:.1} s | {r_code}, {t_code}, {p_code} |",
            c.name,
            r_mem as f64 / 1e9,
            t_mem as f64 / 1e9,
            p_mem as f64 / 1e9,
            p_mem as f64 / t_mem as f64,
        );
        println!("{line}");
        writeln!(md, "{line}").unwrap();
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/results/plan_memory.md");
    std::fs::write(&out, md).unwrap();
    println!("written to {}", out.display());
    let _ = std::fs::remove_dir_all(&dir);
}
