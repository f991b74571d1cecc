//! The integration-test binary: every module here exercises the public library API or the real
//! `trainplan` binary from the outside.
//!
//! * [`properties`]: proptest invariants of the replayer and the critical path on random DAGs, and
//!   the symmetric (quotient) ring against the full fine-grained ring.
//! * [`cli`]: the `trainplan` binary's output formats, exit codes and error messages.
//! * [`whatif`]: `trainplan passes` and `trainplan whatif`.
//! * [`plan`]: `trainplan plan`: fields, determinism, errors, Ctrl-C.
//! * [`export`]: `trainplan plan` → `trainplan export` for every framework.
//! * [`show`]: `trainplan show`: a plan's decisions per framework export, what is left to do.
//! * [`frameworks`]: exported modules run on real PyTorch, JAX/optax, TensorFlow/Keras and a
//!   stub of Horovod's documented API; `torchtitan.toml` loaded and applied by torchtitan's own
//!   config manager, parallel dims and llama3 parallelisation.
//! * [`hostile_input`]: FIFOs, devices and folders at every file input, amplifying traces,
//!   copies of one rank: exit 3 with one line, never a hang or an abort.
//! * [`messages`]: nothing echoed from a file of another format, control characters escaped,
//!   messages capped, output errors exit 5, one exit code per kind of mistake.
//! * [`safe_output`]: Ctrl-C during a write, a failed export, kept modes, symlinked devices.
//! * [`hostile_export`]: plans whose every name is hostile, exported for every framework, then
//!   compiled, imported and sourced: nothing runs, every value comes back.
//! * [`exec_traces`]: `trainplan replay` on Chakra execution traces.
//! * [`fidelity`]: the committed `experiments/fidelity` results are the code's and the README's.
//! * [`fuzz_inputs`]: proptest mutations of configs, pass files, plans (then every emitter), the
//!   performance database and nccl-tests tables: no panics, errors name the file, what is
//!   accepted is in range.
//! * [`fuzz_traces`]: proptest mutations of real and hand-made execution traces: no panics.
//! * [`pass_props`]: every pass's `propose` on random zoo jobs, full and lean: patches or "does
//!   not apply", never a panic; a lean evaluation is refused.
//! * [`memory`]: the three memory peaks in every report, the feasibility gate of `plan`, whole
//!   samples per micro-step in the search, `whatif` and every export (issue 21).
//! * [`lower_bound`]: the ONNX importer and `trainplan lower-bound`.
//! * [`trace_replay`]: `trainplan replay --trace` on small and real Kineto traces.
//! * [`trace_multi`]: several ranks: collective matching, clock alignment, mismatches.
//! * [`trace_bad_input`]: every kind of bad trace input, end to end: exit 3 and where, or a warning.
//! * [`trace_whatif`]: what-ifs and plans on real traces: shapes, memory events, facts, every
//!   rank, the steady-state period, host-bound steps.
//! * [`trace_fuzz`]: mutated real and fixture traces through import, graph and replay: no panic,
//!   and every error names the file; the inputs that once crashed, kept as regressions.
//!
//! [`support`] holds what they share: running the binary, scratch folders, the shared traces.

/// Say why a test is skipped on the process's real stderr: libtest captures `eprintln!` and
/// shows it only for a failing test, so a test that skipped (no `../shared`, no python3) looked
/// like one that passed (issue 27). `cargo test` prints these lines as they happen.
macro_rules! skip_note {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "SKIPPED: {}", format_args!($($t)*));
    }};
}
pub(crate) use skip_note;

mod cli;
mod code_shape;
mod context_parallel;
mod exec_traces;
mod export;
mod fidelity;
mod frameworks;
mod fuzz_inputs;
mod fuzz_traces;
mod gpu_truth;
mod hostile_export;
mod hostile_input;
mod lower_bound;
mod memory;
mod messages;
mod pass_props;
mod pipeline;
mod plan;
mod properties;
mod safe_output;
mod sharding;
mod show;
mod support;
mod tensor_parallel;
mod trace_bad_input;
mod trace_fuzz;
mod trace_multi;
mod trace_replay;
mod trace_whatif;
mod whatif;
