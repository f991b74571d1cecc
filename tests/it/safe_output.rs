//! Safe output end to end (issue 14, class 7): Ctrl-C while a timeline is being written leaves
//! no temporary file; a write that fails part way (here the file-size limit stands for a full
//! disk) leaves every old exported file as it was; a 0600 plan stays 0600 when rewritten; a
//! symlink to a device (`out.json -> /dev/null`, like `/dev/stdout`) is written through and
//! stays a symlink. Issue 20, class 6: no output replaces an input of the same command or another
//! of its outputs (exit 2 naming both, whatever the name: a symlink, `./`), a picture that cannot
//! be written exits 5 like every output, and `export -o .` writes into the current folder.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::scratch;

fn trainplan(dir: &Path) -> Command {
    let mut c = crate::support::trainplan();
    c.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn entries(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

const ZOO: [&str; 7] = [
    "--model",
    "resnet50",
    "--batch",
    "2",
    "--cluster",
    "8xh200",
    "--json",
];

#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "the write hook it holds the binary with is in debug builds only (`cargo test`)"
)]
fn ctrl_c_while_writing_a_timeline_leaves_no_temporary_file() {
    let d = scratch("ctrlc");
    let hold = d.join("holding");
    let mut args = vec!["replay", "--timeline", "out.json"];
    args.extend(ZOO);
    // The debug build's test hook holds the write once the temporary file exists.
    let child = trainplan(&d)
        .args(&args)
        .env("TRAINPLAN_TEST_HOLD_TEMP", &hold)
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !hold.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the write never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        entries(&d).iter().any(|n| n.starts_with(".out.json.tmp-")),
        "{:?}",
        entries(&d)
    );
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        entries(&d),
        ["holding"],
        "temporary file removed, no output"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Run with a file-size limit of `bytes` (writes past it fail with EFBIG, like a full disk).
fn with_file_limit(c: &mut Command, bytes: u64) {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        c.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn a_failed_export_leaves_the_old_files_and_modes_are_kept() {
    let d = scratch("export");
    let mut plan = vec!["plan", "-o", "p.yaml", "--max-rounds", "100"];
    plan.extend(ZOO);
    let o = trainplan(&d).args(&plan).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A 0600 plan stays 0600 when it is rewritten.
    std::fs::set_permissions(d.join("p.yaml"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = trainplan(&d).args(&plan).output().unwrap();
    assert!(o.status.success());
    assert_eq!(
        std::fs::metadata(d.join("p.yaml")).unwrap().mode() & 0o777,
        0o600
    );

    let export = ["export", "p.yaml", "--to", "horovod", "-o", "out"];
    let o = trainplan(&d).args(export).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = d.join("out");
    let before: Vec<(String, Vec<u8>)> = entries(&out)
        .into_iter()
        .map(|n| (n.clone(), std::fs::read(out.join(&n)).unwrap()))
        .collect();
    assert_eq!(before.len(), 2, "{before:?}");
    std::fs::set_permissions(
        out.join("horovod.env"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    // Another plan (batch 4), exported where files can hold at most 1,000 bytes: the small env
    // file would fit, the module does not.
    let text = std::fs::read_to_string(d.join("p.yaml")).unwrap();
    std::fs::write(d.join("p.yaml"), text.replace("batch: 2", "batch: 4")).unwrap();
    let mut c = trainplan(&d);
    c.args(export);
    with_file_limit(&mut c, 1000);
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "an output error: {err}");
    for (n, bytes) in &before {
        assert_eq!(&std::fs::read(out.join(n)).unwrap(), bytes, "{n} changed");
    }
    assert_eq!(entries(&out), ["horovod.env", "trainplan_horovod.py"]);
    assert_eq!(
        entries(&d),
        ["out", "p.svg", "p.yaml"],
        "no temporary folder left (the plan's picture sits beside it)"
    );
    // Without the limit the new plan replaces both, the env file keeping its mode.
    let o = trainplan(&d).args(export).output().unwrap();
    assert!(o.status.success());
    assert!(
        std::fs::read_to_string(out.join("horovod.env"))
            .unwrap()
            .contains("batch 4/GPU")
    );
    assert_eq!(
        std::fs::metadata(out.join("horovod.env")).unwrap().mode() & 0o777,
        0o600
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_symlink_to_a_device_is_written_through_and_stays_a_symlink() {
    let d = scratch("devlink");
    std::os::unix::fs::symlink("/dev/null", d.join("out.json")).unwrap();
    let mut args = vec!["replay", "--timeline", "out.json"];
    args.extend(ZOO);
    let o = trainplan(&d).args(&args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        std::fs::symlink_metadata(d.join("out.json"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(!std::fs::metadata("/dev/null").unwrap().is_file());
    assert_eq!(entries(&d), ["out.json"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// (exit code, stderr) of `trainplan ARGS` in `dir`.
fn code_and_err(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let o = trainplan(dir).args(args).output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn an_output_never_replaces_an_input_or_another_output() {
    let d = scratch("clash");
    let fixtures = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kineto/tiny_step.json"
    );
    std::fs::copy(fixtures, d.join("t.json")).unwrap();
    std::os::unix::fs::symlink("t.json", d.join("link.json")).unwrap();
    let cluster = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/clusters/8xh200.yaml");
    std::fs::copy(cluster, d.join("mine.yaml")).unwrap();
    let pass = concat!(env!("CARGO_MANIFEST_DIR"), "/passes/fused-adam.yaml");
    let text = std::fs::read_to_string(pass).unwrap();
    std::fs::write(
        d.join("fa.yaml"),
        text.replacen("name: fused-adam", "name: my-adam", 1),
    )
    .unwrap();
    let zoo = |cmd: &'static str, cluster: &'static str, rest: &[&'static str]| {
        let mut v = vec![
            cmd,
            "--model",
            "resnet50",
            "--batch",
            "2",
            "--cluster",
            cluster,
        ];
        v.extend(rest);
        v
    };
    let snapshot = |d: &Path| -> Vec<(String, Vec<u8>)> {
        entries(d)
            .into_iter()
            .map(|n| (n.clone(), std::fs::read(d.join(&n)).unwrap_or_default()))
            .collect()
    };
    let before = snapshot(&d);
    // (arguments, the two paths the message names)
    let cases: Vec<(Vec<&str>, [&str; 2])> = vec![
        (
            vec!["replay", "--trace", "t.json", "--timeline", "t.json"],
            ["--timeline t.json", "Kineto trace t.json"],
        ),
        (
            vec!["replay", "--trace", "t.json", "--timeline", "link.json"],
            ["link.json", "t.json"],
        ),
        (
            vec!["replay", "--trace", "./t.json", "--timeline", "t.json"],
            ["t.json", "./t.json"],
        ),
        (
            zoo("replay", "mine.yaml", &["--timeline", "mine.yaml"]),
            ["--timeline mine.yaml", "config file mine.yaml"],
        ),
        (
            zoo("plan", "mine.yaml", &["-o", "mine.yaml"]),
            ["-o mine.yaml", "config file mine.yaml"],
        ),
        (
            zoo(
                "plan",
                "8xh200",
                &["--pass-file", "fa.yaml", "-o", "fa.yaml"],
            ),
            ["-o fa.yaml", "pass file fa.yaml"],
        ),
        (
            zoo("plan", "8xh200", &["-o", "p.svg"]),
            ["-o p.svg", "picture (-o with .svg) p.svg"],
        ),
    ];
    for (args, names) in cases {
        let (code, err) = code_and_err(&d, &args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        for n in names {
            assert!(err.contains(n), "{args:?}: {err}");
        }
        assert_eq!(snapshot(&d), before, "{args:?} changed the folder");
    }
    // A plan's export may not be written over the plan.
    let (code, err) = code_and_err(&d, &zoo("plan", "8xh200", &["-o", "p.yaml"]));
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = code_and_err(&d, &["export", "p.yaml", "--to", "horovod", "-o", "p.yaml"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("-o p.yaml is the plan p.yaml"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_picture_that_cannot_be_written_is_an_output_error() {
    let d = scratch("svg");
    // The picture's path is a folder: the plan is written, the picture is not (exit 5).
    std::fs::create_dir(d.join("p.svg")).unwrap();
    let mut args = vec!["plan", "-o", "p.yaml"];
    args.extend(ZOO);
    let (code, err) = code_and_err(&d, &args);
    assert_eq!(code, Some(5), "{err}");
    assert!(
        err.contains("failed to write the plan's picture to p.svg"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn export_into_the_current_folder_keeps_it_and_its_other_files() {
    let d = scratch("dot");
    let mut args = vec!["plan", "-o", "p.yaml"];
    args.extend(ZOO);
    let (code, err) = code_and_err(&d, &args);
    assert_eq!(code, Some(0), "{err}");
    let inode = std::fs::metadata(&d).unwrap().ino();
    for _ in 0..2 {
        let (code, err) = code_and_err(&d, &["export", "p.yaml", "--to", "horovod", "-o", "."]);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(
            entries(&d),
            ["horovod.env", "p.svg", "p.yaml", "trainplan_horovod.py"]
        );
        assert_eq!(
            std::fs::metadata(&d).unwrap().ino(),
            inode,
            "the same folder"
        );
    }
    // And the parent folder, from a sub-folder.
    std::fs::create_dir(d.join("sub")).unwrap();
    let (code, err) = code_and_err(
        &d.join("sub"),
        &["export", "../p.yaml", "--to", "jax", "-o", ".."],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(d.join("jax.env").is_file());
    let _ = std::fs::remove_dir_all(&d);
}
