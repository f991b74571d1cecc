//! The command-line interface: flag definitions (their doc comments are the `--help` text),
//! dispatch, and the mapping from errors to the documented exit codes.
//!
//! Exit codes: 0 success; 1 internal error (a bug); 2 usage error (the command line: an unknown
//! flag, a missing or conflicting argument, a flag value that is not of its type or outside its
//! range: `--budget`, `--memory-budget`, `--max-memory`, `--to`); 3 bad input (what is to be
//! modelled: an unknown model, cluster, GPU or pass, an impossible model option such as
//! `--batch 0`, any file that cannot be read or is malformed, the memory ceiling; the message
//! names the file and where); 4 infeasible; 5 output error (a file or stdout could not be
//! written); 130 interrupted. A closed stdout (`trainplan … | head`) exits 0. Each kind of
//! mistake has one code in every command.

pub mod atomic;
mod calibrate;
mod chakra;
pub(crate) mod distinct;
mod export;
mod layouts;
mod lower_bound;
mod memory;
pub(crate) mod output;
mod pass_plan;
pub(crate) mod plan;
mod ranks;
mod replay;
mod report;
mod show;
mod source;
mod traceinfo;
mod whatif;

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

pub use atomic::write_atomic;

/// Exit codes of the binary.
pub mod exit {
    pub const OK: u8 = 0;
    pub const INTERNAL: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const BAD_INPUT: u8 = 3;
    pub const INFEASIBLE: u8 = 4;
    /// Output could not be written: a file (plan, timeline, export, database, profile) or
    /// stdout (other than a closed pipe, which is a normal end: exit 0).
    pub const OUTPUT: u8 = 5;
    pub const INTERRUPTED: u8 = 130;
}

/// An error on its way to the user: a one-line message and an exit code.
#[derive(Debug)]
pub struct CliError {
    pub code: u8,
    pub message: String,
}

impl CliError {
    pub fn bad_input(e: impl std::fmt::Display) -> Self {
        CliError {
            code: exit::BAD_INPUT,
            message: e.to_string(),
        }
    }
    pub fn usage(e: impl std::fmt::Display) -> Self {
        CliError {
            code: exit::USAGE,
            message: e.to_string(),
        }
    }
    /// A file trainplan writes could not be written.
    pub fn output(e: impl std::fmt::Display) -> Self {
        CliError {
            code: exit::OUTPUT,
            message: e.to_string(),
        }
    }
    pub fn internal(e: impl std::fmt::Display) -> Self {
        CliError {
            code: exit::INTERNAL,
            message: e.to_string(),
        }
    }
    /// Writing to stdout failed: a closed pipe is a normal end, anything else is reported.
    pub fn stdout(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            CliError {
                code: exit::OK,
                message: String::new(),
            }
        } else {
            CliError {
                code: exit::OUTPUT,
                message: format!("failed to write to stdout: {e}"),
            }
        }
    }
}

/// trainplan: predict a training iteration's time, memory and critical path from traces or a
/// built-in model, and plan how to make it faster.
#[derive(Debug, Parser)]
#[command(name = "trainplan", version, about, long_about = None, after_help = EXAMPLES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Memory ceiling for trainplan itself (16GiB, 8GB, 512MiB, bytes): an input or a job that
    /// would need more stops with exit 3 and the amount it would need. Default: 75 % of the
    /// machine's RAM (or of its cgroup limit, or the address-space limit of `ulimit -v`, when
    /// lower); a `ulimit -v` is enforced on the mapped size whatever this says.
    #[arg(long, global = true, value_name = "SIZE")]
    pub max_memory: Option<String>,
}

const EXAMPLES: &str = "\
Examples:
  trainplan replay --model bert-base --cluster dpro-16xv100-rdma
  trainplan replay --model gpt --layers 24 --hidden 1024 --heads 16 --cluster 64xh100-ib --json
  trainplan replay --model resnet50 --cluster 128xv100-rdma --timeline resnet.json
  trainplan models
  trainplan clusters

Logs go to stderr; set RUST_LOG=debug for more.";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the built-in models (the zoo).
    Models(ListArgs),
    /// List the built-in clusters with their GPUs and networks.
    Clusters(ListArgs),
    /// Replay one training iteration: predicted iteration time, compute/communication overlap,
    /// critical path and peak memory.
    #[command(after_help = "\
Examples:
  trainplan replay --model bert-base --cluster dpro-16xv100-rdma
  trainplan replay --model resnet50 --batch 64 --cluster my-cluster.yaml --json
  trainplan replay --model vgg16 --cluster dpro-16xv100-tcp --timeline vgg.json   (open in ui.perfetto.dev)
  trainplan replay --model bert-large --cluster 128xv100-rdma --symmetric
  trainplan replay --trace resnet50_rank0.json.gz --step 5 --json
  trainplan replay --trace traces/dlrm/rank*.kineto.json.gz      (all ranks: one global graph)
  trainplan replay --trace traces/dlrm/ --timeline dlrm.json     (a folder: every Kineto file in it)")]
    Replay(ReplayArgs),
    /// List the optimization passes (built-in and declarative) with their knobs.
    Passes(PassesArgs),
    /// Apply passes and compare: iteration time, peak memory, ops that left or joined the
    /// critical path.
    #[command(after_help = "\
Examples:
  trainplan whatif --model bert-base --cluster dpro-16xv100-rdma --pass amp
  trainplan whatif --model bert-base --batch 64 --cluster dpro-16xv100-rdma --pass recompute --json
  trainplan whatif --model resnet50 --cluster dpro-16xv100-tcp --pass tensor-fusion --pass tensor-partition:k=4
  trainplan whatif --model gpt --cluster 8xh200 --pass grad-accumulation:k=4
  trainplan whatif --model resnet50 --cluster 8xh200 --pass-file my_pass.yaml --pass my-pass")]
    Whatif(WhatifArgs),
    /// Search for the fastest configuration within a budget and write it as a plan (YAML).
    #[command(after_help = "\
Examples:
  trainplan plan --model bert-base --cluster dpro-16xv100-rdma
  trainplan plan --model resnet50 --cluster dpro-16xv100-tcp --budget 90s -o resnet.yaml
  trainplan plan --model bert-base --batch 64 --cluster dpro-16xv100-rdma --memory-budget 8GB
  trainplan plan --model gpt --cluster 64xh100-ib --passes tensor-fusion,op-fusion,amp --json
  trainplan plan --model vgg16 --cluster dpro-16xv100-rdma --strategy mcmc --seed 7
  trainplan plan --model llama3-70b --cluster 512xh100-ib --framework torchtitan --top 5

Then: trainplan export plan.yaml --to pytorch. Ctrl-C writes the best plan so far (exit 130).")]
    Plan(PlanArgs),
    /// Turn a plan into config patches for a framework: env files and small Python modules to
    /// import (see the README's "Applying a plan").
    #[command(after_help = "\
Examples:
  trainplan export plan.yaml --to pytorch          (writes trainplan-pytorch/ next to the plan)
  trainplan export plan.yaml --to horovod -o patches/
  trainplan export resnet.yaml --to xla --json
  trainplan export bert.yaml --to jax

Frameworks: horovod, xla, byteps, pytorch, jax. An unknown one is a usage error (exit 2); a
malformed plan or one of another schema version is bad input (exit 3).")]
    Export(ExportArgs),
    /// Show a plan: what it changes, the predicted effect, what each framework's export does
    /// with each decision, and what is left to you.
    #[command(after_help = "\
Examples:
  trainplan show plan.yaml
  trainplan show plan.yaml --json")]
    Show(ShowArgs),
    /// Lower-bound latency of an ONNX model on a GPU (Benanza): sequential and parallel, fused and
    /// on tensor cores, the slowest layers, and how far a measured run or trace is from it.
    #[command(after_help = "\
Examples:
  trainplan lower-bound tests/fixtures/onnx/resnet50.onnx --gpu v100-32gb --batch 32
  trainplan lower-bound model.onnx --gpu h200 --batch 8 --dim sequence=128 --json
  trainplan lower-bound model.onnx --batch 1 --measured-ms 6.1
  trainplan lower-bound model.onnx --batch 32 --trace run.json.gz --db perf.json

Bad input (unreadable or malformed ONNX, unsupported operator, dynamic dims without a size,
unknown GPU, corrupt database) exits 3 with the file and the place named.")]
    LowerBound(lower_bound::LowerBoundArgs),
    /// Measure this machine's GPU (GEMM per dtype, memory bandwidth, launch overhead, fused vs
    /// unfused element-wise) and write a GPU profile for the cost models. Needs a build with
    /// `--features gpu`; exits 3 without it or without a GPU.
    Calibrate(calibrate::CalibrateArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The plan (YAML) `trainplan plan` wrote.
    #[arg(value_name = "PLAN.yaml")]
    pub plan: std::path::PathBuf,
    /// Print one JSON object on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PassesArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Register a declarative pass from a YAML file and list it with the others (checks the
    /// file: a mistake is reported as file:line:column, exit 3). Repeatable.
    #[arg(long = "pass-file", value_name = "F.yaml")]
    pub pass_file: Vec<std::path::PathBuf>,
}

/// Where the iteration comes from: a zoo model on a cluster, or a recorded trace.
#[derive(Debug, Args, Clone)]
pub struct InputArgs {
    /// PyTorch profiler (Kineto) traces, `.json` or `.json.gz`, or a Chakra execution trace,
    /// instead of --model/--cluster: replays one recorded iteration and compares it with the
    /// measured time; `whatif` and `plan` re-cost its kernels from their recorded shapes. Several
    /// files (or a folder of them) are the ranks of one job: they are matched collective by
    /// collective, their clocks aligned, and replayed as one global graph; `whatif` and `plan`
    /// apply their passes to every rank.
    #[arg(long, value_name = "PATH", num_args = 1.., conflicts_with = "model")]
    pub trace: Vec<std::path::PathBuf>,
    /// With several ranks: trust the recorded clocks instead of aligning them (dPRO §4.2 QP over
    /// the matched collectives).
    #[arg(long, requires = "trace")]
    pub no_align: bool,
    /// The trace's iteration: N of ProfilerStep#N, or the N-th iteration between Optimizer.step
    /// annotations when the trace has no ProfilerStep spans (default: the last complete one).
    #[arg(long, value_name = "N", requires = "trace")]
    pub step: Option<u64>,
    /// Zoo model name (see `trainplan models`).
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Built-in cluster name (see `trainplan clusters`) or a cluster YAML file.
    #[arg(long, value_name = "NAME|FILE")]
    pub cluster: Option<String>,
    /// Per-GPU batch size (default: the model's, see `trainplan models`).
    #[arg(long, value_name = "N")]
    pub batch: Option<u32>,
    /// Transformer hidden size (bert-*, gpt); sets the feed-forward width to 4x.
    #[arg(long, value_name = "N")]
    pub hidden: Option<u32>,
    /// Transformer attention heads.
    #[arg(long, value_name = "N")]
    pub heads: Option<u32>,
    /// Transformer layers.
    #[arg(long, value_name = "N")]
    pub layers: Option<u32>,
    /// Transformer sequence length.
    #[arg(long, value_name = "N")]
    pub seq: Option<u32>,
    /// Transformer vocabulary size.
    #[arg(long, value_name = "N")]
    pub vocab: Option<u32>,
    /// BERT's task head: pretraining (Hugging Face, MLM logits at every position; default),
    /// masked-lm (MLM on the 15 % masked positions only, as NVIDIA's BERT), squad, classify.
    #[arg(long, value_enum, value_name = "HEAD")]
    pub head: Option<crate::zoo::Head>,
    /// Attention implementation: eager (separate kernels, the softmax in FP32 under autocast;
    /// BERT's default), fused-softmax (Megatron-LM; GPT's default) or flash
    /// (FlashAttention / `scaled_dot_product_attention`: no scores in memory).
    #[arg(long, value_enum, value_name = "IMPL")]
    pub attention: Option<crate::zoo::Attention>,
    /// Feed-forward GELU: fused (one kernel each way, keeps its input; default) or composite
    /// (the tanh approximation as eight element-wise ops: Hugging Face GPT-2's `gelu_new`).
    #[arg(long, value_enum, value_name = "IMPL")]
    pub gelu: Option<crate::zoo::Gelu>,
    /// The loss and the training loop around it: held (`F.cross_entropy`, the loop holding the
    /// logits through the backward, as Hugging Face scripts do; BERT's default), freed (the
    /// logits deleted before the backward, as torchtitan and Hugging Face's Trainer do; the
    /// llama models' default and torchtitan's) or fused (one kernel writing the gradient in
    /// place, Megatron-LM's; GPT's default, and what tf and jax compile).
    #[arg(long, value_enum, value_name = "IMPL")]
    pub loss: Option<crate::zoo::Loss>,
    /// Key/value heads of grouped-query attention (llama models; must divide --heads).
    #[arg(long, value_name = "N")]
    pub kv_heads: Option<u32>,
    /// Feed-forward width (default: 4 × --hidden; llama models keep their preset's ratio).
    #[arg(long, value_name = "N")]
    pub ffn: Option<u32>,
    /// Activations in channels-last (NHWC) layout (`model.to(memory_format=torch.channels_last)`):
    /// no transposes around tensor-core convolutions (the default for tf and jax).
    #[arg(long)]
    pub channels_last: bool,
    /// The job runs with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`: the caching
    /// allocator grows one segment per pool instead of caching fixed segments, so the reserved
    /// and device-used peaks lose most of their fragmentation (PyTorch jobs; TensorFlow's and
    /// XLA's allocators have no such mode).
    #[arg(long)]
    pub expandable_segments: bool,
    /// Replay the symmetric form: one worker plus the quotient ring chain, standing for all
    /// workers (ring all-reduce only; exact when the ring's links are alike, otherwise paced by
    /// the slowest link). Much faster for large clusters.
    #[arg(long)]
    pub symmetric: bool,
    /// The framework the job runs on: how its kernels are issued (PyTorch eager: one CPU
    /// dispatch per operator; tf, jax: compiled graphs), its default precision and its default
    /// gradient synchronisation, which is the baseline (pytorch: DDP buckets; horovod: tensor
    /// fusion; byteps: partitions; tf: one pack; jax: XLA's combiner).
    #[arg(long, value_enum, default_value = "pytorch", value_name = "FRAMEWORK")]
    pub framework: crate::cost::framework::Framework,
    /// Compute precision of the baseline (default: the framework's — FP32 with TF32
    /// convolutions for PyTorch on Ampere and newer, TF32 for every matrix class in tf and jax).
    /// fp16 / bf16 are mixed precision (FP32 master weights); fp8 needs a GPU with an FP8 peak.
    #[arg(long, value_enum, value_name = "PRECISION")]
    pub precision: Option<crate::cost::framework::Precision>,
    /// How mixed precision holds the model: autocast (an FP32 model with per-operator casts,
    /// `torch.autocast`; every framework's default but deepspeed's) or pure (the model itself
    /// in fp16/bf16 with FP32 master weights in the optimizer: DeepSpeed's default, Megatron-LM's
    /// --fp16/--bf16, apex O2). Applies to --precision fp16, bf16 and fp8.
    #[arg(long, value_enum, value_name = "STYLE")]
    pub amp_style: Option<crate::cost::framework::AmpStyle>,
    /// Gradient synchronisation of a --model job: the framework's default (DDP buckets for
    /// pytorch, …), or one collective per gradient tensor (what no framework does by default).
    #[arg(long, value_enum, default_value = "framework", value_name = "SYNC")]
    pub sync: SyncArg,
}

/// `--sync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SyncArg {
    /// The framework's default (see --framework).
    Framework,
    /// One collective per gradient tensor.
    PerTensor,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Write the replayed timeline as a Chrome trace (open in ui.perfetto.dev).
    #[arg(long, value_name = "OUT.json")]
    pub timeline: Option<std::path::PathBuf>,
    /// Print one JSON object on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct WhatifArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// A pass to apply, with knobs: NAME[:knob=value,...] (see `trainplan passes`), each knob
    /// once. Repeat to apply several, in order.
    #[arg(long = "pass", value_name = "NAME[:k=v,...]")]
    pub pass: Vec<String>,
    /// Register a declarative pass from a YAML file (see passes/*.yaml). Repeatable.
    #[arg(long = "pass-file", value_name = "F.yaml")]
    pub pass_file: Vec<std::path::PathBuf>,
    /// Print one JSON object on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Wall-clock budget for the search (1h, 90s, 2m30s, 1.5h). A plan cut by the budget is
    /// the best one so far, with the same report as a converged one.
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    pub budget: String,
    /// Stop the search after N rounds (critical-path rounds or MCMC batches): a cut by work, not
    /// time, so the same input gives the same plan on any machine (stop reason `round_limit`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rounds: Option<u32>,
    /// Show the K best layouts the memory step tried (tensor-parallel degree, sharding,
    /// micro-batch, accumulation, recomputation; step time, tokens/s per GPU, MFU and device
    /// memory each), and add them to --json as `top_layouts`. Layouts are searched when the
    /// job does not fit as it is.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub top: Option<u32>,
    /// Device memory per GPU the plan may use (16GiB, 80GB, 512MiB, bytes; default and at most
    /// the GPU's): over it the planner first tries AMP, recomputation, gradient accumulation and
    /// sharding; exit 4 when nothing fits. What TensorFlow or JAX keep out of their allocator's
    /// pool must fit the GPU besides.
    #[arg(long, value_name = "SIZE")]
    pub memory_budget: Option<String>,
    /// Passes the search may use, comma-separated (default: all but dgc, recompute,
    /// grad-accumulation and vdnn; see `trainplan passes`).
    #[arg(long, value_name = "a,b,...")]
    pub passes: Option<String>,
    /// Register a declarative pass from a YAML file. Repeatable.
    #[arg(long = "pass-file", value_name = "F.yaml")]
    pub pass_file: Vec<std::path::PathBuf>,
    /// Search strategy.
    #[arg(long, value_enum, default_value = "critical-path")]
    pub strategy: crate::search::Strategy,
    /// Seed (MCMC); the same input and seed give a byte-identical plan.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where to write the plan.
    #[arg(
        short = 'o',
        long,
        default_value = "plan.yaml",
        value_name = "PLAN.yaml"
    )]
    pub output: std::path::PathBuf,
    /// Print one JSON object on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Ablation: evaluate op-fusion candidates op by op instead of on the coarsened view.
    #[arg(long)]
    pub no_coarsen: bool,
    /// Ablation: price partition numbers by full replay instead of partial replay.
    #[arg(long)]
    pub no_partial_replay: bool,
    /// Ablation: evaluate candidates on the full graph instead of the symmetric form.
    #[arg(long)]
    pub no_symmetry: bool,
    /// Ablation: re-evaluate every candidate each round instead of in the order of their last
    /// gains, stopping once none left can beat the best (lazy rounds; the same plan when a
    /// move's gain only shrinks as others are taken).
    #[arg(long)]
    pub no_lazy: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The plan (YAML) `trainplan plan` wrote.
    #[arg(value_name = "PLAN.yaml")]
    pub plan: std::path::PathBuf,
    /// The framework to write patches for.
    #[arg(long, value_enum, value_name = "FRAMEWORK")]
    pub to: crate::plan::emit::Framework,
    /// Directory for the files (default: `trainplan-<framework>/` next to the plan; created if
    /// needed). Files are written atomically.
    #[arg(short = 'o', long, value_name = "DIR")]
    pub output: Option<std::path::PathBuf>,
    /// Print one JSON object on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    init_logging();
    atomic::install_interrupt_handler();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if !e.message.is_empty() {
                let _ = writeln!(std::io::stderr(), "error: {}", output::message(&e.message));
            }
            ExitCode::from(e.code)
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // No colours: log lines hold names from traces and configs, and every control character is
    // escaped on the way to the terminal (`output::Clean`), ours included. Lines are capped.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(|| output::Clean::with_line_cap(std::io::stderr(), 2000))
        .try_init();
}

/// Run a parsed command.
pub fn run(cli: Cli) -> Result<(), CliError> {
    let ceiling = match &cli.max_memory {
        Some(s) => {
            Some(plan::parse_bytes(s).map_err(|e| CliError::usage(format!("--max-memory: {e}")))?)
        }
        None => crate::limits::default_ceiling(),
    };
    crate::limits::set_ceiling(ceiling);
    // `ulimit -v` counts mappings, not residence: compare the mapped size with it, and keep the
    // allocator from reserving 64 MiB of it per thread. Without a limit, two arenas per core
    // (glibc's default is eight: the search's threads each filling arenas of their own held
    // `plan` at 2-3x the resident memory of its heap; two per core measured as fast as eight
    // on BERT-base plans, issue 28).
    let address_space = crate::limits::address_space_limit();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    crate::limits::limit_malloc_arenas(if address_space.is_some() {
        2
    } else {
        (2 * cores).clamp(2, 64) as i32
    });
    let ceiling_is_it =
        cli.max_memory.is_none() && address_space.is_some() && ceiling == address_space;
    crate::limits::set_address_space_limit(address_space, ceiling_is_it);
    match cli.command {
        Command::Models(a) => replay::models(&a),
        Command::Clusters(a) => replay::clusters(&a),
        Command::Replay(a) => replay::replay_cmd(&a),
        Command::Passes(a) => whatif::passes_cmd(&a),
        Command::Whatif(a) => whatif::whatif_cmd(&a),
        Command::Plan(a) => plan::plan_cmd(&a),
        Command::Export(a) => export::export_cmd(&a),
        Command::Show(a) => show::show_cmd(&a),
        Command::LowerBound(a) => lower_bound::lower_bound_cmd(&a),
        Command::Calibrate(a) => calibrate::calibrate_cmd(&a),
    }
}
