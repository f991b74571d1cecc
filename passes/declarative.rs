//! Declarative passes: YAML files built from Daydream's what-if primitives (Daydream ATC'20 §4,
//! Appendix A), loaded at run time (`--pass-file F.yaml`) or shipped in `passes/*.yaml`.
//!
//! **When it applies:** whenever a rule's `select` matches ops of the job. A rule that matches
//! nothing is skipped with a warning (unless it says `optional: true`).
//!
//! **Before → after** (FusedAdam, `merge` of every UPDATE kernel):
//!
//! ```text
//! In(t0) → UPDATE(t0)          In(t0) ─┐
//! In(t1) → UPDATE(t1)    ⇒     In(t1) ─┼→ UPDATE(t0..t2)   (one kernel, Σ durations − 2 launches)
//! In(t2) → UPDATE(t2)          In(t2) ─┘
//! ```
//!
//! # File format
//!
//! ```yaml
//! name: my-pass              # registry name: `--pass my-pass:knob=value`
//! doc: one line for `trainplan passes`
//! applies_to:                # optional: only jobs stepping with one of these optimizers
//!   {optimizers: [Adam, AdamW], unfused: true}   # (`unfused`: not already fused)
//! knobs:                     # optional; numbers; integer knobs when default, min, max are all integers
//!   - {name: ratio, default: 0.001, min: 0.00001, max: 1, doc: what it means}
//! rules:                     # applied in order, as one edit
//!   - select: {phase: update, kind: compute}
//!     merge: {duration: sum_minus_launch}
//! ```
//!
//! A value written as a number may instead name a knob: `scale: $ratio`. A rule is `select:`
//! plus exactly one action (and optionally `optional: true`).
//!
//! **Select** (every filter optional, all ANDed; `kind`, `phase`, `device` and the globs take one
//! value or a list, any of which may match):
//! `kind` (compute | launch | cpu | gap | memcpy | send | recv | aggregate | collective | in |
//! out), `phase` (fw | bw | update | comm | other), `device` (gpu | cpu | comm | virtual),
//! `layer` (glob on the layer name, `*` and `?`), `name` (glob on the op label, e.g.
//! `layer1.0.conv1 FW w0.gpu.s0`), `tensor` (glob on the tensor name), `math` (matrix | vector,
//! for ops whose work is known), `min_bytes` / `max_bytes` (the op's tensor bytes, or for an op
//! without a tensor the bytes it allocates or frees; sync actions also check the sync's bytes),
//! `critical: true` (only ops on the critical path). Selection looks at the job as the pass found
//! it, minus ops an earlier rule removed or merged away; ops an earlier rule inserted are not
//! selectable. Ops are taken in id order.
//!
//! **Actions** (Daydream's primitives). Every number has a physical range, checked at load for
//! literals and for the declared range of a knob: factors (`scale`, `memory`, `sync_bytes`) at
//! most 10⁴ (`sync_bytes` at least 10⁻⁶), durations at most one hour, bandwidths 10⁻³–10⁶ GB/s;
//! and a job the pass would push past `graph::bounds` (an op over ~13 days, a tensor over
//! 16 TiB, a worker's memory over 64 PiB) is refused naming the pass — never saturated.
//! * `scale: f` — durations × f (Daydream's shrink/scale).
//! * `set_duration_us: d`.
//! * `remove: true` — remove the ops, keeping the order they imposed.
//! * `insert: {where: after|before, device: gpu|cpu|copy, kind, phase, duration_us, gbps,
//!   memory_passes, kernels, launch_us}` — one new op per selected op `s`, Daydream's
//!   `G.Insert(s, new, t)`: `after` puts it between `s` and `s`'s successors, `before` between
//!   `s`'s predecessors and `s`. Duration = `duration_us` + bytes(s)/`gbps` + `memory_passes` ×
//!   bytes(s) through the GPU's DRAM (roofline, with its efficiency) + `kernels` × the GPU's
//!   launch overhead. `kind` defaults to compute (gpu), cpu (cpu) or memcpy (copy); `phase` to
//!   `s`'s. `device: copy` is a second GPU stream (a copy engine), added if the job has none. A
//!   GPU task brings a CPU launch of `launch_us` only when the job already has a CPU thread (zoo
//!   jobs have none: their launch cost is inside the kernel durations).
//! * `merge: {duration: sum | sum_minus_launch | max | <µs>}` — merge ALL selected ops into the
//!   first; `sum_minus_launch` keeps one launch of all the merged kernels. A merge that would
//!   create a cycle is an error naming the rule.
//! * `add_edge: {to: <select>}` — every selected op precedes every op `to` selects.
//! * `priority: by_layer_order | by_reverse_layer_order | <int>` — scheduling priority (lower
//!   runs first among ready ops of a device): by layer order, earlier layers first (P3).
//! * `sync_bytes: f | hierarchical` — multiply the bytes of the syncs of the selected ops
//!   (their tensors' syncs). `hierarchical` is BlueConnect's decomposition of a flat ring into
//!   intra-node reduce-scatter, inter-node all-reduce and intra-node all-gather, expressed as
//!   the factor on the flat ring's bandwidth term: `(2(N−1)/N / B_inter + 2(m−1)/m / B_intra) /
//!   (2(n−1)/n / B_inter)` for m GPUs per node, N nodes, n = mN (α terms unchanged).
//! * `partition: {pieces: k}` or `{slice_bytes: b}` — cut the selected syncs into k pieces (or
//!   pieces of at most b bytes; P3's slices).
//! * `memory: f` — multiply the selected ops' memory effects (allocations and frees; select both
//!   the op that allocates and the op that frees, or peak memory goes wrong).
//! * `offload: {gbps, device: copy|gpu}` — vDNN: for each selected FW op that allocates B bytes
//!   of activations, and the BW op of its layer that frees them, insert a D2H copy after the FW
//!   op (the activation is freed when it ends) and an H2D copy before the BW op (re-allocated
//!   when it starts), each B/gbps long. The prefetch starts when the backward of the layer
//!   after it starts (vDNN's prefetch one layer ahead). `copy` puts D2H and H2D on two copy
//!   streams (one engine per direction), added to the job; `gpu` on the compute stream.
//!
//! **Errors** (exit 3): malformed YAML, an unknown field or value, a wrong type, a knob referenced
//! but not declared, a literal out of range — at load, as `file:line:column: message`; a rule that
//! would remove every compute op or create a cycle — when the pass is applied, naming the file,
//! the rule and its line.
//!
//! **Cost model:** none of its own: each action states how it sets durations and bytes; the
//! replay of the edited job gives the effect.
//!
//! **Framework knobs:** a declarative pass models an optimization; which framework setting turns
//! it on is in the YAML's comment (FusedAdam: `apex.optimizers.FusedAdam` / `torch.optim.Adam(
//! fused=True)`; P3: BytePS `BYTEPS_PARTITION_BYTES` + `BYTEPS_SCHEDULING_CREDIT`; DGC: Horovod
//! compression hook; vDNN: offload hooks such as `torch.autograd.graph.save_on_cpu`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, IntoDeserializer, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use super::{Edit, Evaluated, KnobSpec, KnobValue, Knobs, Pass, PassError, Patch, apply};
use crate::cost::compute::{Roofline, ns};
use crate::graph::job::{Job, OpWork};
use crate::graph::{DeviceKind, MemEffect, MemWhen, NONE, OpId, OpKind, OpSpec, Phase};
use crate::zoo::MathClass;

/// The passes shipped in `passes/`: (file name, text).
const BUILTIN: &[(&str, &str)] = &[
    ("passes/blueconnect.yaml", include_str!("blueconnect.yaml")),
    ("passes/dgc.yaml", include_str!("dgc.yaml")),
    ("passes/fused-adam.yaml", include_str!("fused-adam.yaml")),
    ("passes/p3.yaml", include_str!("p3.yaml")),
    (
        "passes/reconstruct-batchnorm.yaml",
        include_str!("reconstruct-batchnorm.yaml"),
    ),
    ("passes/vdnn.yaml", include_str!("vdnn.yaml")),
];

/// Load a declarative pass from a YAML file.
pub fn load_file(path: &Path) -> Result<Box<dyn Pass>, PassError> {
    let file = path.display().to_string();
    let text = crate::input::read_to_string(path, crate::input::InputKind::PassFile)
        .map_err(|e| PassError::File(format!("{file}: failed to read the pass file: {e}")))?;
    Ok(Box::new(parse(&text, &file)?))
}

/// The declarative passes shipped in `passes/*.yaml`.
pub fn builtins() -> Vec<Box<dyn Pass>> {
    BUILTIN
        .iter()
        .map(|(file, text)| {
            let p = parse(text, file).unwrap_or_else(|e| panic!("built-in pass file: {e}"));
            Box::new(p) as Box<dyn Pass>
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The file as written.

/// A scalar argument: a number, a `$knob`, or a word (`sum`, `by_layer_order`, …).
#[derive(Clone, Debug, PartialEq)]
enum Arg {
    Num { v: f64, int: bool },
    Knob(String),
    Word(String),
}

impl<'de> Deserialize<'de> for Arg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Arg;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number, a $knob or a word")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Arg, E> {
                Ok(Arg::Num {
                    v: v as f64,
                    int: true,
                })
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Arg, E> {
                Ok(Arg::Num {
                    v: v as f64,
                    int: true,
                })
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Arg, E> {
                Ok(Arg::Num { v, int: false })
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Arg, E> {
                match s.strip_prefix('$') {
                    Some(k) => Ok(Arg::Knob(k.to_string())),
                    None => Ok(Arg::Word(s.to_string())),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// One value or a list of them.
#[derive(Clone, Debug, PartialEq)]
struct OneOrMany<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = OneOrMany<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a value or a list of values")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                T::deserialize(s.into_deserializer()).map(|t| OneOrMany(vec![t]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(t) = a.next_element()? {
                    v.push(t);
                }
                Ok(OneOrMany(v))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindSel {
    Compute,
    Launch,
    Cpu,
    Gap,
    Memcpy,
    Send,
    Recv,
    Aggregate,
    Collective,
    In,
    Out,
}

impl KindSel {
    fn kind(self) -> OpKind {
        match self {
            KindSel::Compute => OpKind::Compute,
            KindSel::Launch => OpKind::Launch,
            KindSel::Cpu => OpKind::CpuOther,
            KindSel::Gap => OpKind::Gap,
            KindSel::Memcpy => OpKind::Memcpy,
            KindSel::Send => OpKind::Send,
            KindSel::Recv => OpKind::Recv,
            KindSel::Aggregate => OpKind::Aggregate,
            KindSel::Collective => OpKind::Collective,
            KindSel::In => OpKind::In,
            KindSel::Out => OpKind::Out,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum PhaseSel {
    Fw,
    Bw,
    Update,
    Comm,
    Other,
}

impl PhaseSel {
    fn phase(self) -> Phase {
        match self {
            PhaseSel::Fw => Phase::Fw,
            PhaseSel::Bw => Phase::Bw,
            PhaseSel::Update => Phase::Update,
            PhaseSel::Comm => Phase::Comm,
            PhaseSel::Other => Phase::Other,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum DeviceSel {
    Gpu,
    Cpu,
    Comm,
    Virtual,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum MathSel {
    Matrix,
    Vector,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Select {
    kind: Option<OneOrMany<KindSel>>,
    phase: Option<OneOrMany<PhaseSel>>,
    device: Option<OneOrMany<DeviceSel>>,
    layer: Option<OneOrMany<String>>,
    name: Option<OneOrMany<String>>,
    tensor: Option<OneOrMany<String>>,
    math: Option<MathSel>,
    min_bytes: Option<Spanned<Arg>>,
    max_bytes: Option<Spanned<Arg>>,
    critical: Option<bool>,
}

/// Where an inserted op goes relative to the selected op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Where {
    After,
    Before,
}

/// Device of an inserted op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum InsertDevice {
    Gpu,
    Cpu,
    Copy,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct InsertSpec {
    #[serde(rename = "where")]
    at: Where,
    device: InsertDevice,
    kind: Option<KindSel>,
    phase: Option<PhaseSel>,
    duration_us: Option<Spanned<Arg>>,
    gbps: Option<Spanned<Arg>>,
    memory_passes: Option<Spanned<Arg>>,
    kernels: Option<Spanned<Arg>>,
    launch_us: Option<Spanned<Arg>>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct MergeSpec {
    duration: Spanned<Arg>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddEdgeSpec {
    to: Select,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct PartitionSpec {
    pieces: Option<Spanned<Arg>>,
    slice_bytes: Option<Spanned<Arg>>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct OffloadSpec {
    gbps: Spanned<Arg>,
    #[serde(default = "copy_device")]
    device: InsertDevice,
}

fn copy_device() -> InsertDevice {
    InsertDevice::Copy
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    select: Select,
    #[serde(default)]
    optional: bool,
    scale: Option<Spanned<Arg>>,
    set_duration_us: Option<Spanned<Arg>>,
    remove: Option<bool>,
    insert: Option<InsertSpec>,
    merge: Option<MergeSpec>,
    add_edge: Option<AddEdgeSpec>,
    priority: Option<Spanned<Arg>>,
    sync_bytes: Option<Spanned<Arg>>,
    partition: Option<PartitionSpec>,
    memory: Option<Spanned<Arg>>,
    offload: Option<OffloadSpec>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct KnobDecl {
    name: String,
    default: Spanned<Arg>,
    min: Spanned<Arg>,
    max: Spanned<Arg>,
    #[serde(default)]
    doc: String,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct PassFile {
    name: String,
    doc: String,
    #[serde(default)]
    applies_to: Option<AppliesTo>,
    #[serde(default)]
    knobs: Vec<Spanned<KnobDecl>>,
    rules: Vec<Spanned<Rule>>,
}

/// Which jobs a pass exists for (`applies_to:`): the optimizers it replaces, matched without
/// case against what the job says it steps with ([`Job::optimizer`]); `unfused: true` refuses
/// a job whose optimizer is already fused. A job whose optimizer nothing says is refused too,
/// and so is one whose optimizer was offloaded to the host (`shard:offload=1`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppliesTo {
    #[serde(default)]
    optimizers: Vec<String>,
    #[serde(default)]
    unfused: bool,
}

impl AppliesTo {
    /// Why the pass does not apply to `job`, or `None` when it does.
    fn refuses(&self, job: &Job) -> Option<String> {
        if self.optimizers.is_empty() {
            return None;
        }
        let want = self.optimizers.join("/");
        if job.meta.offload {
            return Some(format!(
                "the job's optimizer steps on the host CPU (shard offload=1); the pass replaces the GPU's {want}"
            ));
        }
        match job.optimizer() {
            None => Some(format!(
                "the job's optimizer is not known (no Optimizer.step annotation in the trace); the pass replaces {want} only"
            )),
            Some((o, _)) if !self.optimizers.iter().any(|w| w.eq_ignore_ascii_case(o)) => Some(
                format!("the job steps with {o}, and the pass replaces {want} only"),
            ),
            Some((o, true)) if self.unfused => {
                Some(format!("the job's {o} optimizer is already fused"))
            }
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The loaded pass.

/// What a rule does, checked.
#[derive(Clone, Debug, PartialEq)]
enum Action {
    Scale(Spanned<Arg>),
    SetDuration(Spanned<Arg>),
    Remove,
    Insert(InsertSpec),
    Merge(Spanned<Arg>),
    AddEdge(Select),
    Priority(Spanned<Arg>),
    SyncBytes(Spanned<Arg>),
    Partition(PartitionSpec),
    Memory(Spanned<Arg>),
    Offload(OffloadSpec),
}

impl Action {
    fn name(&self) -> &'static str {
        match self {
            Action::Scale(_) => "scale",
            Action::SetDuration(_) => "set_duration_us",
            Action::Remove => "remove",
            Action::Insert(_) => "insert",
            Action::Merge(_) => "merge",
            Action::AddEdge(_) => "add_edge",
            Action::Priority(_) => "priority",
            Action::SyncBytes(_) => "sync_bytes",
            Action::Partition(_) => "partition",
            Action::Memory(_) => "memory",
            Action::Offload(_) => "offload",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct CheckedRule {
    /// 1-based, as a user counts.
    index: usize,
    line: u64,
    select: Select,
    optional: bool,
    action: Action,
}

/// A pass read from a YAML file.
#[derive(Clone, Debug, PartialEq)]
pub struct DeclarativePass {
    name: String,
    doc: String,
    applies_to: AppliesTo,
    file: String,
    knobs: Vec<KnobSpec>,
    rules: Vec<CheckedRule>,
}

fn at(file: &str, loc: &serde_saphyr::Location, msg: impl fmt::Display) -> PassError {
    PassError::File(format!("{file}:{}:{}: {msg}", loc.line(), loc.column()))
}

/// Parse and check a pass file's text; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<DeclarativePass, PassError> {
    let f: PassFile =
        crate::cost::config::parse_yaml_as(text, file, crate::limits::InputKind::PassFile)
            .map_err(|e| PassError::File(e.to_string()))?;
    let top = |msg: String| PassError::File(format!("{file}: {msg}"));
    if !valid_name(&f.name) {
        return Err(top(format!(
            "field name: `{}` must be lowercase letters, digits, `-` or `_`",
            f.name
        )));
    }
    let (knobs, declared) = check_knobs(&f.knobs, file)?;
    if f.rules.is_empty() {
        return Err(top("field rules: a pass needs at least one rule".into()));
    }
    if let Some(r) = f.rules.get(crate::limits::MAX_PASS_RULES) {
        return Err(at(
            file,
            &r.referenced,
            format!(
                "field rules: {} rules, more than the limit of {} rules in a pass file (README, Limits)",
                crate::units::thousands(f.rules.len() as u64),
                crate::units::thousands(crate::limits::MAX_PASS_RULES as u64)
            ),
        ));
    }
    let mut rules = Vec::new();
    for (i, r) in f.rules.iter().enumerate() {
        let loc = &r.referenced;
        let rule = CheckedRule {
            index: i + 1,
            line: loc.line(),
            select: r.value.select.clone(),
            optional: r.value.optional,
            action: rule_action(&r.value, i + 1, loc, file)?,
        };
        check_rule(&rule, file, &declared)?;
        rules.push(rule);
    }
    Ok(DeclarativePass {
        name: f.name,
        doc: f.doc.trim().to_string(),
        applies_to: f.applies_to.unwrap_or_default(),
        file: file.to_string(),
        knobs,
        rules,
    })
}

/// A pass or knob name: lowercase ASCII letters, digits, `-` and `_`, not empty.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// Each declared knob's `(min, max)` by name, for checking the rules' knob arguments.
type KnobRanges = BTreeMap<String, (f64, f64)>;

/// The declared knobs as specs (integer when default, min and max all are), and their ranges.
fn check_knobs(
    decls: &[Spanned<KnobDecl>],
    file: &str,
) -> Result<(Vec<KnobSpec>, KnobRanges), PassError> {
    let mut knobs = Vec::new();
    let mut declared = KnobRanges::new();
    for k in decls {
        let d = &k.value;
        let loc = &k.referenced;
        if !valid_name(&d.name) {
            return Err(at(
                file,
                loc,
                format!("knob name `{}` is not a valid name", d.name),
            ));
        }
        if declared.contains_key(&d.name) {
            return Err(at(
                file,
                loc,
                format!("knob `{}` is declared twice", d.name),
            ));
        }
        let num = |a: &Spanned<Arg>, field: &str| match a.value {
            Arg::Num { v, int } if v.is_finite() => Ok((v, int)),
            _ => Err(at(
                file,
                &a.referenced,
                format!("field {field} of knob `{}`: must be a number", d.name),
            )),
        };
        let (def, i1) = num(&d.default, "default")?;
        let (min, i2) = num(&d.min, "min")?;
        let (max, i3) = num(&d.max, "max")?;
        if !(min <= def && def <= max) {
            return Err(at(
                file,
                loc,
                format!(
                    "knob `{}`: needs min ≤ default ≤ max, got {min}, {def}, {max}",
                    d.name
                ),
            ));
        }
        knobs.push(if i1 && i2 && i3 {
            KnobSpec::int(&d.name, &d.doc, def as i64, min as i64, max as i64)
        } else {
            KnobSpec::float(&d.name, &d.doc, def, min, max)
        });
        declared.insert(d.name.clone(), (min, max));
    }
    Ok((knobs, declared))
}

/// Rule number `index`'s one action; none or several is an error at `loc`, and so are
/// `remove: false` and a partition with both or neither of pieces and slice_bytes.
fn rule_action(
    r: &Rule,
    index: usize,
    loc: &serde_saphyr::Location,
    file: &str,
) -> Result<Action, PassError> {
    let mut actions = Vec::new();
    if let Some(a) = &r.scale {
        actions.push(Action::Scale(a.clone()));
    }
    if let Some(a) = &r.set_duration_us {
        actions.push(Action::SetDuration(a.clone()));
    }
    if let Some(rm) = r.remove {
        if !rm {
            return Err(at(
                file,
                loc,
                "field remove: only `remove: true` means anything",
            ));
        }
        actions.push(Action::Remove);
    }
    if let Some(a) = &r.insert {
        actions.push(Action::Insert(a.clone()));
    }
    if let Some(a) = &r.merge {
        actions.push(Action::Merge(a.duration.clone()));
    }
    if let Some(a) = &r.add_edge {
        actions.push(Action::AddEdge(a.to.clone()));
    }
    if let Some(a) = &r.priority {
        actions.push(Action::Priority(a.clone()));
    }
    if let Some(a) = &r.sync_bytes {
        actions.push(Action::SyncBytes(a.clone()));
    }
    if let Some(a) = &r.partition {
        if a.pieces.is_some() == a.slice_bytes.is_some() {
            return Err(at(
                file,
                loc,
                "field partition: give exactly one of pieces or slice_bytes",
            ));
        }
        actions.push(Action::Partition(a.clone()));
    }
    if let Some(a) = &r.memory {
        actions.push(Action::Memory(a.clone()));
    }
    if let Some(a) = &r.offload {
        actions.push(Action::Offload(a.clone()));
    }
    match actions.len() {
        1 => Ok(actions.pop().expect("one")),
        0 => Err(at(
            file,
            loc,
            format!(
                "rule {index}: no action (scale, set_duration_us, remove, insert, merge, add_edge, priority, sync_bytes, partition, memory, offload)"
            ),
        )),
        _ => Err(at(
            file,
            loc,
            format!(
                "rule {index}: one action per rule, found {}",
                actions
                    .iter()
                    .map(Action::name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// A literal's or knob's allowed range for one field.
struct Range {
    field: &'static str,
    min: f64,
    /// The minimum itself is excluded.
    open_min: bool,
    max: f64,
    int: bool,
    words: &'static [&'static str],
}

const ANY_NONNEG: Range = Range {
    field: "",
    min: 0.0,
    open_min: false,
    max: f64::MAX,
    int: false,
    words: &[],
};

fn range(field: &'static str) -> Range {
    Range {
        field,
        ..ANY_NONNEG
    }
}

fn check_arg(
    a: &Spanned<Arg>,
    r: &Range,
    file: &str,
    declared: &BTreeMap<String, (f64, f64)>,
) -> Result<(), PassError> {
    let bad = |msg: String| at(file, &a.referenced, format!("field {}: {msg}", r.field));
    let ok = |v: f64| v.is_finite() && (v > r.min || (!r.open_min && v == r.min)) && v <= r.max;
    let want = || {
        let lo = if r.open_min { ">" } else { "≥" };
        let show = crate::limits::show;
        let mut s = format!("a number {lo} {}", show(r.min));
        if r.max < f64::MAX {
            s += &format!(" and ≤ {}", show(r.max));
        }
        if r.int {
            s = format!("an integer{}", &s[8..]);
        }
        if !r.words.is_empty() {
            s += &format!(", or one of {}", r.words.join(", "));
        }
        s
    };
    match &a.value {
        Arg::Num { v, int } => {
            if !ok(*v) || (r.int && !int) {
                return Err(bad(format!(
                    "must be {}, got {}",
                    want(),
                    crate::limits::show(*v)
                )));
            }
        }
        Arg::Knob(k) => {
            let Some(&(min, max)) = declared.get(k) else {
                return Err(bad(format!(
                    "knob `${k}` is not declared (declare it under knobs:)"
                )));
            };
            if !ok(min) || !ok(max) {
                return Err(bad(format!(
                    "knob `${k}` ranges over [{}, {}], but this field must be {}",
                    crate::limits::show(min),
                    crate::limits::show(max),
                    want()
                )));
            }
        }
        Arg::Word(w) => {
            if !r.words.contains(&w.as_str()) {
                return Err(bad(format!("`{w}` is not valid; must be {}", want())));
            }
        }
    }
    Ok(())
}

fn check_select(
    s: &Select,
    file: &str,
    declared: &BTreeMap<String, (f64, f64)>,
) -> Result<(), PassError> {
    for (a, f) in [(&s.min_bytes, "min_bytes"), (&s.max_bytes, "max_bytes")] {
        if let Some(a) = a {
            check_arg(a, &range(f), file, declared)?;
        }
    }
    Ok(())
}

/// Largest factor `scale`, `memory` and `sync_bytes` may apply (and smallest `sync_bytes`):
/// physical ranges, so that a pass cannot saturate a duration or a size into a wrong answer.
pub const MAX_FACTOR: f64 = 1e4;
pub const MIN_SYNC_FACTOR: f64 = 1e-6;
/// Longest duration a pass may set or insert, µs (one hour).
pub const MAX_OP_US: f64 = 3.6e9;
/// Bandwidths a pass may give (`gbps`, `offload.gbps`), GB/s.
pub const MIN_GBPS: f64 = 1e-3;
pub const MAX_GBPS: f64 = 1e6;

fn bounded(field: &'static str, max: f64) -> Range {
    Range {
        max,
        ..range(field)
    }
}

fn bandwidth(field: &'static str) -> Range {
    Range {
        min: MIN_GBPS,
        max: MAX_GBPS,
        ..range(field)
    }
}

fn check_rule(
    r: &CheckedRule,
    file: &str,
    declared: &BTreeMap<String, (f64, f64)>,
) -> Result<(), PassError> {
    check_select(&r.select, file, declared)?;
    let c = |a: &Spanned<Arg>, rg: Range| check_arg(a, &rg, file, declared);
    match &r.action {
        Action::Scale(a) => c(a, bounded("scale", MAX_FACTOR)),
        Action::SetDuration(a) => c(a, bounded("set_duration_us", MAX_OP_US)),
        Action::Remove => Ok(()),
        Action::Insert(s) => {
            for (a, f, max) in [
                (&s.duration_us, "duration_us", MAX_OP_US),
                (&s.memory_passes, "memory_passes", 1e3),
                (&s.launch_us, "launch_us", 1e6),
            ] {
                if let Some(a) = a {
                    c(a, bounded(f, max))?;
                }
            }
            if let Some(a) = &s.gbps {
                c(a, bandwidth("gbps"))?;
            }
            if let Some(a) = &s.kernels {
                c(
                    a,
                    Range {
                        int: true,
                        max: 1e6,
                        ..range("kernels")
                    },
                )?;
            }
            Ok(())
        }
        Action::Merge(a) => c(
            a,
            Range {
                words: &["sum", "sum_minus_launch", "max"],
                ..bounded("merge.duration", MAX_OP_US)
            },
        ),
        Action::AddEdge(s) => check_select(s, file, declared),
        Action::Priority(a) => c(
            a,
            Range {
                min: i32::MIN as f64,
                max: i32::MAX as f64,
                int: true,
                words: &["by_layer_order", "by_reverse_layer_order"],
                ..range("priority")
            },
        ),
        Action::SyncBytes(a) => c(
            a,
            Range {
                min: MIN_SYNC_FACTOR,
                words: &["hierarchical"],
                ..bounded("sync_bytes", MAX_FACTOR)
            },
        ),
        Action::Partition(p) => {
            if let Some(a) = &p.pieces {
                c(
                    a,
                    Range {
                        min: 1.0,
                        max: 1e6,
                        int: true,
                        ..range("partition.pieces")
                    },
                )?;
            }
            if let Some(a) = &p.slice_bytes {
                c(
                    a,
                    Range {
                        min: 1.0,
                        ..bounded(
                            "partition.slice_bytes",
                            crate::graph::bounds::MAX_TENSOR_BYTES as f64,
                        )
                    },
                )?;
            }
            Ok(())
        }
        Action::Memory(a) => c(a, bounded("memory", MAX_FACTOR)),
        Action::Offload(o) => {
            if o.device == InsertDevice::Cpu {
                return Err(at(
                    file,
                    &o.gbps.referenced,
                    "field offload.device: must be copy or gpu",
                ));
            }
            c(&o.gbps, bandwidth("offload.gbps"))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Proposing.

/// `*` matches any run of characters, `?` one character.
fn glob(pat: &str, s: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pat.chars().collect(), s.chars().collect());
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < t.len() {
        if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// Bytes of an op for `min_bytes`/`max_bytes` and `gbps`: its tensor's, or what it allocates or
/// frees (the larger).
fn op_bytes(job: &Job, op: OpId) -> u64 {
    let spec = &job.local.ops[op as usize].spec;
    if spec.tensor != NONE
        && let Some(t) = job.local.tensors.get(spec.tensor as usize)
    {
        return t.bytes;
    }
    let (mut alloc, mut free) = (0u64, 0u64);
    for m in job.local.mem.iter().filter(|m| m.op == op) {
        match m.when {
            MemWhen::AllocAtStart | MemWhen::During => alloc += m.bytes,
            MemWhen::FreeAtEnd => free += m.bytes,
        }
    }
    alloc.max(free)
}

fn device_class(d: DeviceKind) -> DeviceSel {
    match d {
        DeviceKind::GpuStream { .. } => DeviceSel::Gpu,
        DeviceKind::CpuThread { .. } => DeviceSel::Cpu,
        DeviceKind::Virtual => DeviceSel::Virtual,
        _ => DeviceSel::Comm,
    }
}

/// The pass's state while it turns rules into edits.
struct Ctx<'a> {
    cx: &'a Evaluated,
    pass: &'a DeclarativePass,
    knobs: &'a Knobs,
    /// Ops removed or merged away by earlier rules.
    gone: BTreeSet<OpId>,
    /// Devices of the job plus the ones this pass adds.
    devices: Vec<DeviceKind>,
    /// Id the next inserted op gets.
    next_id: OpId,
    preds: Vec<Vec<OpId>>,
    succs: Vec<Vec<OpId>>,
    /// Edges the pass's `add_edge` rules have added so far (at most
    /// [`crate::limits::MAX_PASS_EDGES`]).
    edges_added: u64,
}

impl<'a> Ctx<'a> {
    fn job(&self) -> &'a Job {
        &self.cx.job
    }

    /// `v` if finite and ≥ `lo`, else an error naming the rule.
    fn chk(&self, r: &CheckedRule, v: f64, what: &str, lo: f64) -> Result<f64, PassError> {
        if v.is_finite() && v >= lo {
            Ok(v)
        } else {
            Err(self.err(r, format!("{what} = {v} is out of range")))
        }
    }

    fn err(&self, r: &CheckedRule, msg: impl fmt::Display) -> PassError {
        PassError::File(format!(
            "{}:{}: rule {} ({}): {msg}",
            self.pass.file,
            r.line,
            r.index,
            r.action.name()
        ))
    }

    /// A numeric argument with knobs substituted.
    fn num(&self, a: &Spanned<Arg>) -> f64 {
        match &a.value {
            Arg::Num { v, .. } => *v,
            Arg::Knob(k) => match self.knobs.0.get(k) {
                Some(KnobValue::Int(v)) => *v as f64,
                Some(KnobValue::Float(v)) => *v,
                _ => self
                    .pass
                    .knobs
                    .iter()
                    .find(|s| &s.name == k)
                    .and_then(|s| s.default.parse().ok())
                    .unwrap_or(f64::NAN),
            },
            Arg::Word(_) => f64::NAN,
        }
    }

    fn select(&self, s: &Select) -> Vec<OpId> {
        let job = self.job();
        let min = s.min_bytes.as_ref().map(|a| self.num(a));
        let max = s.max_bytes.as_ref().map(|a| self.num(a));
        let crit: BTreeSet<OpId> = if s.critical == Some(true) {
            self.cx.critical_local.iter().copied().collect()
        } else {
            BTreeSet::new()
        };
        let any = |list: &Option<OneOrMany<String>>, name: Option<&str>| match list {
            None => true,
            Some(OneOrMany(pats)) => name.is_some_and(|n| pats.iter().any(|p| glob(p, n))),
        };
        let mut out = Vec::new();
        for (i, op) in job.local.ops.iter().enumerate() {
            let id = i as OpId;
            if self.gone.contains(&id) {
                continue;
            }
            let spec = &op.spec;
            if let Some(OneOrMany(k)) = &s.kind
                && !k.iter().any(|k| k.kind() == spec.kind)
            {
                continue;
            }
            if let Some(OneOrMany(p)) = &s.phase
                && !p.iter().any(|p| p.phase() == spec.phase)
            {
                continue;
            }
            if let Some(OneOrMany(d)) = &s.device {
                let Some(&dev) = job.local.devices.get(spec.device as usize) else {
                    continue;
                };
                if !d.contains(&device_class(dev)) {
                    continue;
                }
            }
            if let Some(m) = s.math {
                let want = match m {
                    MathSel::Matrix => MathClass::Matrix,
                    MathSel::Vector => MathClass::Vector,
                };
                if op.work.map(|w| w.math) != Some(want) {
                    continue;
                }
            }
            let layer = (spec.layer != NONE)
                .then(|| {
                    job.local
                        .layers
                        .get(spec.layer as usize)
                        .map(String::as_str)
                })
                .flatten();
            if !any(&s.layer, layer) {
                continue;
            }
            let tensor = (spec.tensor != NONE)
                .then(|| job.local.tensors.get(spec.tensor as usize))
                .flatten()
                .map(|t| t.name.as_str());
            if !any(&s.tensor, tensor) {
                continue;
            }
            if s.name.is_some() {
                // Worker 0's ops come first in the expanded graph, in local order.
                let label = self.cx.graph.op_label(id);
                if !any(&s.name, Some(&label)) {
                    continue;
                }
            }
            if min.is_some() || max.is_some() {
                let b = op_bytes(job, id) as f64;
                if min.is_some_and(|m| b < m) || max.is_some_and(|m| b > m) {
                    continue;
                }
            }
            if s.critical == Some(true) && !crit.contains(&id) {
                continue;
            }
            out.push(id);
        }
        out
    }

    /// Syncs carrying the selected ops' tensors or made ready / done by them, filtered by the
    /// select's byte bounds on the sync.
    fn syncs_of(&self, ops: &[OpId], s: &Select) -> Vec<usize> {
        let job = self.job();
        let set: BTreeSet<OpId> = ops.iter().copied().collect();
        let tensors: BTreeSet<u32> = ops
            .iter()
            .map(|&o| job.local.ops[o as usize].spec.tensor)
            .filter(|&t| t != NONE)
            .collect();
        let min = s.min_bytes.as_ref().map(|a| self.num(a));
        let max = s.max_bytes.as_ref().map(|a| self.num(a));
        job.syncs
            .iter()
            .enumerate()
            .filter(|(_, y)| {
                y.tensors.iter().any(|t| tensors.contains(t))
                    || y.ready.iter().chain(&y.done).any(|o| set.contains(o))
            })
            .filter(|(_, y)| {
                let b = y.bytes as f64;
                !(min.is_some_and(|m| b < m) || max.is_some_and(|m| b > m))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// The device an insert goes to, adding it when needed; `stream` for copy streams.
    fn device(&mut self, d: InsertDevice, stream: u32) -> u32 {
        let want = match d {
            InsertDevice::Gpu => {
                if let Some(i) = self
                    .devices
                    .iter()
                    .position(|d| matches!(d, DeviceKind::GpuStream { .. }))
                {
                    return i as u32;
                }
                DeviceKind::GpuStream {
                    worker: 0,
                    stream: 0,
                }
            }
            InsertDevice::Cpu => {
                if let Some(i) = self
                    .devices
                    .iter()
                    .position(|d| matches!(d, DeviceKind::CpuThread { .. }))
                {
                    return i as u32;
                }
                DeviceKind::CpuThread {
                    worker: 0,
                    thread: 0,
                }
            }
            InsertDevice::Copy => {
                // Copy streams take the stream numbers after the job's highest.
                let top = self.cx.job.local.top_stream();
                DeviceKind::GpuStream {
                    worker: 0,
                    stream: top + stream,
                }
            }
        };
        if let Some(i) = self.devices.iter().position(|d| *d == want) {
            return i as u32;
        }
        self.devices.push(want);
        (self.devices.len() - 1) as u32
    }

    fn has_cpu_thread(&self) -> bool {
        self.cx
            .job
            .local
            .devices
            .iter()
            .any(|d| matches!(d, DeviceKind::CpuThread { .. }))
    }

    fn launch_ns(&self) -> f64 {
        self.job().gpu.launch_overhead_us * 1e3
    }

    /// Turn one rule into edits: select its ops, then apply its primitive to them. A rule
    /// that selects nothing (or whose primitive finds nothing to change) makes no edits.
    fn rule(&mut self, r: &CheckedRule) -> Result<Made, PassError> {
        let ops = self.select(&r.select);
        if ops.is_empty() {
            return Ok(nothing());
        }
        match &r.action {
            Action::Scale(a) => self.scale(r, a, ops),
            Action::SetDuration(a) => self.set_duration(r, a, ops),
            Action::Remove => Ok(self.remove(ops)),
            Action::Merge(a) => self.merge(r, a, ops),
            Action::AddEdge(to) => self.add_edge(r, to, ops),
            Action::Priority(a) => self.priority(r, a, ops),
            Action::SyncBytes(a) => self.sync_bytes(r, a, &ops),
            Action::Partition(p) => self.partition(r, p, &ops),
            Action::Memory(a) => self.memory(r, a, &ops),
            Action::Insert(s) => self.insert(r, s, &ops),
            Action::Offload(o) => self.offload(r, o, &ops),
        }
    }

    /// `scale`: every selected op's duration × the factor.
    fn scale(&self, r: &CheckedRule, a: &Spanned<Arg>, ops: Vec<OpId>) -> Result<Made, PassError> {
        let f = self.chk(r, self.num(a), "scale", 0.0)?;
        let why = format!("scale {} ops × {f}", ops.len());
        Ok((vec![Edit::Scale { ops, factor: f }], why))
    }

    /// `set_duration_us`: every selected op takes that long.
    fn set_duration(
        &self,
        r: &CheckedRule,
        a: &Spanned<Arg>,
        ops: Vec<OpId>,
    ) -> Result<Made, PassError> {
        let d = ns(self.chk(r, self.num(a), "set_duration_us", 0.0)? * 1e3);
        let why = format!("set {} ops to {} µs", ops.len(), d as f64 / 1e3);
        let edits = ops
            .iter()
            .map(|&op| Edit::SetDuration { op, dur_ns: d })
            .collect();
        Ok((edits, why))
    }

    /// `remove: true`: the selected ops go (later rules no longer see them).
    fn remove(&mut self, ops: Vec<OpId>) -> Made {
        let why = format!("remove {} ops", ops.len());
        self.gone.extend(ops.iter().copied());
        (vec![Edit::Remove { ops }], why)
    }

    /// `merge`: the selected ops (at least two) become the first of them, lasting the sum, the
    /// max, the sum less the launches saved (`sum_minus_launch`, which also merges their work
    /// into one kernel) or a literal time.
    fn merge(
        &mut self,
        r: &CheckedRule,
        a: &Spanned<Arg>,
        ops: Vec<OpId>,
    ) -> Result<Made, PassError> {
        let n = ops.len();
        if n < 2 {
            return Ok(nothing());
        }
        let job = self.job();
        let durs: Vec<u64> = ops
            .iter()
            .map(|&o| job.local.ops[o as usize].spec.dur_ns)
            .collect();
        let sum: u64 = durs.iter().sum();
        let max = durs.iter().copied().max().unwrap_or(0);
        let works: Vec<OpWork> = ops
            .iter()
            .filter_map(|&o| job.local.ops[o as usize].work)
            .collect();
        let dur_ns = match &a.value {
            Arg::Word(w) if w == "sum" => sum,
            Arg::Word(w) if w == "max" => max,
            Arg::Word(_) => {
                // sum_minus_launch: one launch for all the merged kernels.
                let kernels: u64 = ops
                    .iter()
                    .map(|&o| {
                        job.local.ops[o as usize]
                            .work
                            .map_or(1, |w| w.kernels.max(1) as u64)
                    })
                    .sum();
                let saved = ns(self.launch_ns() * kernels.saturating_sub(1) as f64);
                sum.saturating_sub(saved).max(max)
            }
            _ => ns(self.chk(r, self.num(a), "merge.duration", 0.0)? * 1e3),
        };
        let why = format!(
            "merge {n} ops into one of {:.1} µs (were {:.1} µs in all)",
            dur_ns as f64 / 1e3,
            sum as f64 / 1e3
        );
        self.gone.extend(ops[1..].iter().copied());
        let first = ops[0];
        let mut edits = vec![Edit::Merge { ops, dur_ns }];
        if matches!(&a.value, Arg::Word(w) if w == "sum_minus_launch") && works.len() == n {
            let w = works
                .iter()
                .copied()
                .reduce(|a, b| a.merged(&b))
                .map(|w| OpWork { kernels: 1, ..w });
            edits.push(Edit::SetWork { op: first, work: w });
        }
        Ok((edits, why))
    }

    /// `add_edge`: an edge from every selected op to every op of the `to` selection, refused
    /// beyond [`crate::limits::MAX_PASS_EDGES`] in the pass (counted before an edge is made).
    fn add_edge(
        &mut self,
        r: &CheckedRule,
        to: &Select,
        ops: Vec<OpId>,
    ) -> Result<Made, PassError> {
        let n = ops.len();
        let targets = self.select(to);
        // Counted before a single edge is made: n × m edges from two lines of YAML.
        let max = crate::limits::MAX_PASS_EDGES;
        let total = (n as u64)
            .saturating_mul(targets.len() as u64)
            .saturating_add(self.edges_added);
        if total > max {
            return Err(self.err(
                r,
                format!(
                    "joins {} ops to {} ops: {} edges in this pass, more than the limit of {} \
                     edges a pass may add (README, Limits); select fewer ops",
                    crate::units::thousands(n as u64),
                    crate::units::thousands(targets.len() as u64),
                    crate::units::thousands(total),
                    crate::units::thousands(max)
                ),
            ));
        }
        self.edges_added = total;
        let mut edits = Vec::new();
        for &a in &ops {
            for &b in &targets {
                if a != b {
                    edits.push(Edit::AddEdge { from: a, to: b });
                }
            }
        }
        let why = format!("{} edges from {n} ops", edits.len());
        Ok((edits, why))
    }

    /// `priority`: a literal i32, or the layer order (`by_layer_order`, else reversed); ops
    /// without a layer keep theirs under the layer orders.
    fn priority(
        &self,
        r: &CheckedRule,
        a: &Spanned<Arg>,
        ops: Vec<OpId>,
    ) -> Result<Made, PassError> {
        let job = self.job();
        let mut by: BTreeMap<i32, Vec<OpId>> = BTreeMap::new();
        for &o in &ops {
            let layer = job.local.ops[o as usize].spec.layer;
            let p = match &a.value {
                Arg::Word(w) if w == "by_layer_order" => {
                    if layer == NONE {
                        continue;
                    }
                    layer.min(i32::MAX as u32) as i32
                }
                Arg::Word(_) => {
                    if layer == NONE {
                        continue;
                    }
                    -(layer.min(i32::MAX as u32) as i32)
                }
                _ => {
                    let v = self.num(a);
                    if !(v.is_finite() && v.fract() == 0.0 && v.abs() <= i32::MAX as f64) {
                        return Err(self.err(r, format!("priority {v} is not an i32")));
                    }
                    v as i32
                }
            };
            by.entry(p).or_default().push(o);
        }
        let why = format!("priorities of {} ops", ops.len());
        let edits = by
            .into_iter()
            .map(|(priority, ops)| Edit::Priority { ops, priority })
            .collect();
        Ok((edits, why))
    }

    /// `sync_bytes`: the bytes of the selected ops' syncs × a factor (`hierarchical`: BlueConnect's,
    /// [`hierarchical_factor`]).
    fn sync_bytes(
        &self,
        r: &CheckedRule,
        a: &Spanned<Arg>,
        ops: &[OpId],
    ) -> Result<Made, PassError> {
        let syncs = self.syncs_of(ops, &r.select);
        let f = match &a.value {
            Arg::Word(_) => hierarchical_factor(self.job()),
            _ => self.num(a),
        };
        if !(f.is_finite() && f > 0.0) {
            return Err(self.err(r, format!("sync bytes factor {f} must be > 0")));
        }
        if syncs.is_empty() {
            return Ok(nothing());
        }
        let why = format!("bytes of {} syncs × {f:.4}", syncs.len());
        Ok((vec![Edit::ScaleSyncBytes { syncs, factor: f }], why))
    }

    /// `partition`: each of the selected ops' syncs cut into `pieces`, or into slices of
    /// `slice_bytes` (at most 10⁶ pieces); a sync left whole makes no edit.
    fn partition(
        &self,
        r: &CheckedRule,
        p: &PartitionSpec,
        ops: &[OpId],
    ) -> Result<Made, PassError> {
        let job = self.job();
        let syncs = self.syncs_of(ops, &r.select);
        let mut edits = Vec::new();
        let mut cut = 0;
        for s in syncs {
            let k = match (&p.pieces, &p.slice_bytes) {
                (Some(a), _) => self.chk(r, self.num(a), "partition.pieces", 1.0)?,
                (_, Some(a)) => {
                    let b = self.chk(r, self.num(a), "partition.slice_bytes", 1.0)?;
                    (job.syncs[s].bytes as f64 / b).ceil().max(1.0)
                }
                _ => 1.0,
            };
            let k = k.min(1e6) as u32;
            if k > 1 {
                cut += 1;
                edits.push(Edit::PartitionSync { sync: s, k });
            }
        }
        Ok((edits, format!("partition {cut} syncs")))
    }

    /// `memory`: the bytes of every selected op's memory effects × a factor.
    fn memory(&self, r: &CheckedRule, a: &Spanned<Arg>, ops: &[OpId]) -> Result<Made, PassError> {
        let job = self.job();
        let f = self.chk(r, self.num(a), "memory", 0.0)?;
        let mut edits = Vec::new();
        for &o in ops {
            let effects: Vec<MemEffect> = job
                .local
                .mem
                .iter()
                .filter(|m| m.op == o)
                .map(|m| MemEffect {
                    bytes: (m.bytes as f64 * f).round() as u64,
                    ..*m
                })
                .collect();
            if !effects.is_empty() {
                edits.push(Edit::SetMem { op: o, effects });
            }
        }
        let why = format!("memory of {} ops × {f}", edits.len());
        Ok((edits, why))
    }

    /// `insert`: one new op before or after each selected op (see [`InsertCost`] for its
    /// duration), on the GPU, a CPU thread or a copy stream, with a CPU launch when
    /// `launch_us` is given and the job has a CPU thread.
    fn insert(&mut self, r: &CheckedRule, s: &InsertSpec, ops: &[OpId]) -> Result<Made, PassError> {
        let dev = self.device(s.device, 1);
        let launch = match (s.device, &s.launch_us) {
            (InsertDevice::Gpu, Some(l)) if self.has_cpu_thread() => {
                Some(ns(self.chk(r, self.num(l), "launch_us", 0.0)? * 1e3))
            }
            _ => None,
        };
        let kind = s.kind.map(KindSel::kind).unwrap_or(match s.device {
            InsertDevice::Gpu => OpKind::Compute,
            InsertDevice::Cpu => OpKind::CpuOther,
            InsertDevice::Copy => OpKind::Memcpy,
        });
        if kind.is_virtual() {
            return Err(self.err(r, "cannot insert a virtual op (in/out)"));
        }
        let cost = self.insert_cost(r, s)?;
        let job = self.job();
        let mut edits = Vec::new();
        let mut total = 0u64;
        for &o in ops {
            let src = &job.local.ops[o as usize].spec;
            let dur = cost.dur_ns(op_bytes(job, o) as f64);
            total += dur;
            let (after, before) = self.neighbours(o, s.at);
            let spec = OpSpec {
                layer: src.layer,
                tensor: src.tensor,
                ..OpSpec::new(kind, s.phase.map_or(src.phase, PhaseSel::phase), dev, dur)
            };
            edits.push(Edit::Insert {
                spec,
                work: None,
                after,
                before,
                launch_ns: launch,
            });
            self.next_id += if launch.is_some() { 2 } else { 1 };
        }
        let why = format!(
            "insert {} ops ({:.1} µs in all)",
            ops.len(),
            total as f64 / 1e3
        );
        Ok((edits, why))
    }

    /// An insert's duration terms, each checked (in this order: duration_us, gbps,
    /// memory_passes, kernels).
    fn insert_cost(&self, r: &CheckedRule, s: &InsertSpec) -> Result<InsertCost, PassError> {
        let job = self.job();
        let roof = job.roofline(job.dtype);
        let fixed_ns = s
            .duration_us
            .as_ref()
            .map_or(Ok(0.0), |a| self.chk(r, self.num(a), "duration_us", 0.0))?
            * 1e3;
        let gbps = s
            .gbps
            .as_ref()
            .map(|a| self.chk(r, self.num(a), "gbps", 1e-9))
            .transpose()?;
        let passes = s
            .memory_passes
            .as_ref()
            .map_or(Ok(0.0), |a| self.chk(r, self.num(a), "memory_passes", 0.0))?;
        let kernels = s
            .kernels
            .as_ref()
            .map_or(Ok(0.0), |a| self.chk(r, self.num(a), "kernels", 0.0))?;
        Ok(InsertCost {
            fixed_ns,
            gbps,
            passes,
            kernels,
            roof,
            launch_ns: self.launch_ns(),
        })
    }

    /// `(after, before)` of an op inserted at `at` of `o`: `o` and its live successors, or its
    /// live predecessors and `o`.
    fn neighbours(&self, o: OpId, at: Where) -> (Vec<OpId>, Vec<OpId>) {
        let live = |xs: &[OpId]| -> Vec<OpId> {
            xs.iter()
                .copied()
                .filter(|x| !self.gone.contains(x))
                .collect()
        };
        match at {
            Where::After => (vec![o], live(&self.succs[o as usize])),
            Where::Before => (live(&self.preds[o as usize]), vec![o]),
        }
    }

    /// `offload`: for each selected forward op holding an activation, a device-to-host copy
    /// after it and a host-to-device copy back before the backward op that frees it (see
    /// [`Ctx::offload_one`]), at `gbps`, on copy streams or the GPU's stream.
    fn offload(
        &mut self,
        r: &CheckedRule,
        o: &OffloadSpec,
        ops: &[OpId],
    ) -> Result<Made, PassError> {
        let g = self.chk(r, self.num(&o.gbps), "offload.gbps", 1e-9)?;
        let (d2h, h2d) = match o.device {
            InsertDevice::Copy => (self.device(o.device, 1), self.device(o.device, 2)),
            _ => {
                let d = self.device(InsertDevice::Gpu, 0);
                (d, d)
            }
        };
        let mut edits = Vec::new();
        let mut moved = 0u64;
        let mut count = 0;
        for &u in ops {
            if let Some(bytes) = self.offload_one(u, g, (d2h, h2d), &mut edits) {
                moved += bytes;
                count += 1;
            }
        }
        let why = format!(
            "offload the activations of {count} layers ({:.1} MB each way at {g} GB/s)",
            moved as f64 / 1e6
        );
        Ok((edits, why))
    }

    /// Offload forward op `u`'s activation (its alloc-at-start bytes) at `g` GB/s on the
    /// (device-to-host, host-to-device) devices: the two copies and their memory effects go to
    /// `edits`, and the bytes moved are returned; `None` when `u` is not a forward op of a layer
    /// holding memory or no live backward op of its layer frees memory.
    fn offload_one(
        &mut self,
        u: OpId,
        g: f64,
        (d2h, h2d): (u32, u32),
        edits: &mut Vec<Edit>,
    ) -> Option<u64> {
        let job = self.job();
        let spec = &job.local.ops[u as usize].spec;
        let bytes: u64 = job
            .local
            .mem
            .iter()
            .filter(|m| m.op == u && m.when == MemWhen::AllocAtStart)
            .map(|m| m.bytes)
            .sum();
        if spec.phase != Phase::Fw || bytes == 0 || spec.layer == NONE {
            return None;
        }
        let v = self.freeing_backward(spec.layer)?;
        let trigger = self.prefetch_trigger(v);
        let dur = ns(bytes as f64 / g);
        let out_id = self.next_id;
        let in_id = out_id + 1;
        self.next_id += 2;
        edits.push(Edit::Insert {
            spec: OpSpec {
                layer: spec.layer,
                ..OpSpec::new(OpKind::Memcpy, Phase::Fw, d2h, dur)
            },
            work: None,
            after: vec![u],
            before: vec![],
            launch_ns: None,
        });
        let mut after = vec![out_id];
        after.extend(trigger);
        edits.push(Edit::Insert {
            spec: OpSpec {
                layer: spec.layer,
                ..OpSpec::new(OpKind::Memcpy, Phase::Bw, h2d, dur)
            },
            work: None,
            after,
            before: vec![v],
            launch_ns: None,
        });
        let eff = |op, when| MemEffect {
            op,
            worker: 0,
            bytes,
            when,
        };
        edits.push(Edit::SetMem {
            op: out_id,
            effects: vec![eff(out_id, MemWhen::FreeAtEnd)],
        });
        edits.push(Edit::SetMem {
            op: in_id,
            effects: vec![eff(in_id, MemWhen::AllocAtStart)],
        });
        Some(bytes)
    }

    /// The first live backward op of `layer` that frees memory at its end: the one that frees
    /// the layer's activation.
    fn freeing_backward(&self, layer: u32) -> Option<OpId> {
        let job = self.job();
        job.local.ops.iter().enumerate().find_map(|(i, x)| {
            let i = i as OpId;
            (x.spec.phase == Phase::Bw
                && x.spec.layer == layer
                && !self.gone.contains(&i)
                && job
                    .local
                    .mem
                    .iter()
                    .any(|m| m.op == i && m.when == MemWhen::FreeAtEnd))
            .then_some(i)
        })
    }

    /// When to prefetch an activation freed by backward op `v`: when the backward of the layer
    /// after this one starts, i.e. after the BW compute ops two hops back from `v` (one hop
    /// when there is no second).
    fn prefetch_trigger(&self, v: OpId) -> Vec<OpId> {
        let job = self.job();
        let bw_compute = |x: OpId| {
            let s = &job.local.ops[x as usize].spec;
            s.kind == OpKind::Compute && s.phase == Phase::Bw
        };
        let hop = |xs: &[OpId]| -> Vec<OpId> {
            let mut s: BTreeSet<OpId> = BTreeSet::new();
            for &x in xs {
                s.extend(
                    self.preds[x as usize]
                        .iter()
                        .copied()
                        .filter(|&p| bw_compute(p) && !self.gone.contains(&p)),
                );
            }
            s.into_iter().collect()
        };
        let one = hop(&[v]);
        let two = hop(&one);
        if two.is_empty() { one } else { two }
    }
}

/// What one rule made: its edits and the `why` text.
type Made = (Vec<Edit>, String);

/// A rule that changes nothing.
fn nothing() -> Made {
    (Vec::new(), String::new())
}

/// An inserted op's duration: fixed + bytes / `gbps` + `passes` memory passes over the bytes
/// at the job's roofline + `kernels` launches.
struct InsertCost {
    fixed_ns: f64,
    gbps: Option<f64>,
    passes: f64,
    kernels: f64,
    roof: Roofline,
    launch_ns: f64,
}

impl InsertCost {
    /// The duration of an op inserted next to one of `bytes` bytes.
    fn dur_ns(&self, bytes: f64) -> u64 {
        ns(self.fixed_ns
            + self.gbps.map_or(0.0, |g| bytes / g)
            + self.passes * self.roof.mem_time_ns(bytes)
            + self.kernels * self.launch_ns)
    }
}

/// BlueConnect's hierarchical all-reduce as a factor on the flat ring's bandwidth term (see the
/// module docs); 1 on one node.
fn hierarchical_factor(job: &Job) -> f64 {
    let m = job.comm.gpus_per_node.max(1) as f64;
    let nodes = job.comm.nodes.max(1) as f64;
    let n = m * nodes;
    if nodes <= 1.0 || n <= 1.0 {
        return 1.0;
    }
    let (bi, bx) = (
        job.comm.cost.intra.bytes_per_ns,
        job.comm.cost.inter.bytes_per_ns,
    );
    let flat = 2.0 * (n - 1.0) / n / bx;
    let hier = 2.0 * (nodes - 1.0) / nodes / bx + 2.0 * (m - 1.0) / m / bi;
    (hier / flat).min(1.0)
}

impl Pass for DeclarativePass {
    fn name(&self) -> &str {
        &self.name
    }
    fn doc(&self) -> &str {
        &self.doc
    }
    fn knobs(&self) -> Vec<KnobSpec> {
        self.knobs.clone()
    }
    fn propose(&self, cx: &Evaluated, knobs: &Knobs) -> Result<Vec<Patch>, PassError> {
        let job = &cx.job;
        if let Some(why) = self.applies_to.refuses(job) {
            return Err(PassError::NotApplicable {
                pass: self.name.clone(),
                why,
            });
        }
        let mut preds = vec![Vec::new(); job.local.ops.len()];
        let mut succs = vec![Vec::new(); job.local.ops.len()];
        for &(a, b) in &job.local.edges {
            succs[a as usize].push(b);
            preds[b as usize].push(a);
        }
        let mut c = Ctx {
            cx,
            pass: self,
            knobs,
            gone: BTreeSet::new(),
            devices: job.local.devices.clone(),
            next_id: job.local.ops.len() as OpId,
            preds,
            succs,
            edges_added: 0,
        };
        let mut per_rule: Vec<(&CheckedRule, Vec<Edit>, String)> = Vec::new();
        for r in &self.rules {
            let (edits, why) = c.rule(r)?;
            if edits.is_empty() {
                if !r.optional {
                    // Debug, not warn: the planner asks every pass at every round.
                    tracing::debug!(
                        pass = %self.name,
                        "{}:{}: rule {} ({}) selects nothing to change",
                        self.file,
                        r.line,
                        r.index,
                        r.action.name()
                    );
                }
                continue;
            }
            per_rule.push((r, edits, why));
        }
        let mut patches: Vec<Patch> = per_rule
            .iter()
            .map(|(r, edits, why)| Patch {
                pass: self.name.clone(),
                why: format!("rule {}: {why}", r.index),
                edits: edits.clone(),
            })
            .collect();
        // New devices (copy streams, a CPU thread): the job with them added replaces the job
        // first; op ids do not change.
        if c.devices.len() > job.local.devices.len()
            && let Some(first) = patches.first_mut()
        {
            let mut j = job.clone();
            j.local_mut().devices = c.devices.clone();
            first.edits.insert(0, Edit::ReplaceJob(Box::new(j)));
        }
        // Check the whole edit now, so that an illegal one (a cycle, nothing left) names the
        // rule that broke it.
        if !patches.is_empty() {
            let all = Patch {
                pass: self.name.clone(),
                why: String::new(),
                edits: patches.iter().flat_map(|p| p.edits.clone()).collect(),
            };
            if apply(job, &all).is_err() {
                let mut prefix = Vec::new();
                for (p, (r, _, _)) in patches.iter().zip(&per_rule) {
                    prefix.extend(p.edits.iter().cloned());
                    let trial = Patch {
                        pass: self.name.clone(),
                        why: String::new(),
                        edits: prefix.clone(),
                    };
                    if let Err(e) = apply(job, &trial) {
                        let msg = match e {
                            PassError::Edit { source, .. } => source.to_string(),
                            other => other.to_string(),
                        };
                        return Err(c.err(r, msg));
                    }
                }
            }
        }
        Ok(patches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::comm::AlphaBeta;
    use crate::cost::config::{Dtype, SyncScheme, load_cluster, load_gpu};
    use crate::graph::comm::{CommCost, CommSpec};
    use crate::graph::job::{JobMeta, LocalGraph, LocalOp, Sync};
    use crate::graph::{Phase, Tensor};
    use crate::passes::{evaluate, resolve_knobs};
    use crate::zoo::build::{BuildOptions, job as zoo_job};
    use crate::zoo::{ModelOptions, model};

    fn spec(nodes: u32, intra: f64, inter: f64) -> CommSpec {
        let l = |b| AlphaBeta {
            alpha_ns: 1000.0,
            bytes_per_ns: b,
        };
        CommSpec {
            scheme: SyncScheme::Ring,
            gpus_per_node: 8,
            nodes,
            ps_servers: 2,
            cost: CommCost {
                intra: l(intra),
                inter: l(inter),
                aggregate_bytes_per_ns: 10.0,
            },
        }
    }

    /// One worker (so each sync is just an edge), on a V100:
    ///
    /// ```text
    /// 0 FW l0 10µs (alloc 100 B) → 1 FW l1 20µs (alloc 50 B) → 2 BW l1 40µs (free 50 B)
    ///   → 3 BW l0 20µs (free 100 B);  2 → 7 Out t1 → 8 In t1 → 9 UPDATE t1 7µs
    ///   3 → 4 Out t0 → 5 In t0 → 6 UPDATE t0 5µs;  3 → 6, 3 → 9;  also 0 → 3
    /// ```
    ///
    /// All GPU ops run one after the other: 10 + 20 + 40 + 20 + 5 + 7 = 102 µs.
    fn tiny() -> Job {
        let (v, g) = (0u32, 1u32);
        let c = |phase, layer, us: u64| OpSpec::compute(g, phase, layer, us * 1000);
        let upd = |t, layer, us: u64| OpSpec {
            tensor: t,
            ..OpSpec::compute(g, Phase::Update, layer, us * 1000)
        };
        let virt = |kind, t, layer| OpSpec {
            tensor: t,
            layer,
            ..OpSpec::new(kind, Phase::Comm, v, 0)
        };
        let work = OpWork::new(crate::cost::kernel::OpClass::Elementwise, 1e3, 0.0, 1e3, 1);
        let ops = vec![
            (c(Phase::Fw, 0, 10), None),
            (c(Phase::Fw, 1, 20), None),
            (c(Phase::Bw, 1, 40), None),
            (c(Phase::Bw, 0, 20), None),
            (virt(OpKind::Out, 0, 0), None),
            (virt(OpKind::In, 0, 0), None),
            (upd(0, 0, 5), Some(work)),
            (virt(OpKind::Out, 1, 1), None),
            (virt(OpKind::In, 1, 1), None),
            (upd(1, 1, 7), Some(work)),
        ];
        let mem = |op, bytes, when| MemEffect {
            op,
            worker: 0,
            bytes,
            when,
        };
        Job {
            local: std::sync::Arc::new(LocalGraph {
                ops: ops
                    .into_iter()
                    .map(|(spec, work)| LocalOp { spec, work })
                    .collect(),
                edges: vec![
                    (0, 1),
                    (1, 2),
                    (2, 3),
                    (0, 3),
                    (2, 7),
                    (3, 4),
                    (5, 6),
                    (8, 9),
                    (3, 6),
                    (3, 9),
                ],
                mem: vec![
                    mem(0, 100, MemWhen::AllocAtStart),
                    mem(1, 50, MemWhen::AllocAtStart),
                    mem(2, 50, MemWhen::FreeAtEnd),
                    mem(3, 100, MemWhen::FreeAtEnd),
                ],
                devices: vec![
                    DeviceKind::Virtual,
                    DeviceKind::GpuStream {
                        worker: 0,
                        stream: 0,
                    },
                ],
                layers: vec!["l0.conv".into(), "l1.bn".into()],
                tensors: vec![
                    Tensor {
                        name: "l0.weight".into(),
                        bytes: 4000,
                        layer: 0,
                    },
                    Tensor {
                        name: "l1.weight".into(),
                        bytes: 8000,
                        layer: 1,
                    },
                ],
                static_mem_bytes: 1000,
                fused: Default::default(),
                ties: Vec::new(),
                calls: Default::default(),
                fsdp: Default::default(),
            }),
            syncs: vec![
                Sync {
                    tensors: vec![1],
                    bytes: 8000,
                    partitions: 1,
                    kind: crate::graph::comm::CollectiveKind::AllReduce,
                    group: crate::graph::comm::Group::ALL,
                    ready: vec![7],
                    done: vec![8],
                },
                Sync {
                    tensors: vec![0],
                    bytes: 4000,
                    partitions: 1,
                    kind: crate::graph::comm::CollectiveKind::AllReduce,
                    group: crate::graph::comm::Group::ALL,
                    ready: vec![4],
                    done: vec![5],
                },
            ],
            comm: spec(1, 1.0, 1.0),
            workers: 1,
            symmetric: false,
            gpu: load_gpu("v100-32gb").unwrap(),
            dtype: Dtype::Fp32,
            math: Default::default(),
            framework: Default::default(),
            exec: Default::default(),
            host: Default::default(),
            memory: Default::default(),
            meta: JobMeta::default(),
        }
    }

    /// Parse `text` as `t.yaml`, run it with `knobs` on `job`; the applied job or the error text.
    fn run(text: &str, job: Job, knobs: &[(&str, &str)]) -> Result<(Evaluated, Job), String> {
        let p = parse(text, "t.yaml").map_err(|e| e.to_string())?;
        let kv: Vec<(String, String)> = knobs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let k = resolve_knobs(&p, &kv).map_err(|e| e.to_string())?;
        let cx = evaluate(job).unwrap();
        let patches = p.propose(&cx, &k).map_err(|e| e.to_string())?;
        let j = crate::passes::apply_all(&cx.job, &patches).map_err(|e| e.to_string())?;
        Ok((cx, j))
    }

    fn iter_us(j: Job) -> f64 {
        evaluate(j).unwrap().iteration_ns() as f64 / 1e3
    }

    fn err(text: &str) -> String {
        parse(text, "t.yaml").unwrap_err().to_string()
    }

    #[test]
    fn tiny_job_replays_as_computed() {
        assert_eq!(iter_us(tiny()), 102.0);
    }

    #[test]
    fn globs() {
        assert!(glob("*bn*", "layer1.0.bn2"));
        assert!(glob("*downsample.1", "layer1.0.downsample.1"));
        assert!(!glob("*downsample.1", "layer1.0.downsample.0"));
        assert!(glob("l?.conv", "l0.conv"));
        assert!(!glob("l?.conv", "l10.conv"));
        assert!(glob("*", ""));
        assert!(!glob("a*b", "ab c"));
    }

    #[test]
    fn scale_by_knob_shrinks_backward() {
        let text = "name: x\ndoc: d\nknobs:\n  - {name: f, default: 0.5, min: 0, max: 1}\nrules:\n  - select: {phase: bw}\n    scale: $f\n";
        // BW 40 + 20 µs → 20 + 10: 102 − 30 = 72 µs; with f = 0.25: 102 − 45 = 57 µs.
        let (_, j) = run(text, tiny(), &[]).unwrap();
        assert_eq!(iter_us(j), 72.0);
        let (_, j) = run(text, tiny(), &[("f", "0.25")]).unwrap();
        assert_eq!(iter_us(j), 57.0);
        // Out of the declared range: refused by resolve_knobs.
        let e = run(text, tiny(), &[("f", "2")]).unwrap_err();
        assert!(e.contains("must be between 0 and 1"), "{e}");
    }

    #[test]
    fn fused_adam_merges_updates_with_one_launch() {
        let p = parse(BUILTIN[2].1, BUILTIN[2].0).unwrap();
        assert_eq!(p.name(), "fused-adam");
        let mut job = tiny();
        job.meta.optimizer = Some("AdamW".into());
        let cx = evaluate(job).unwrap();
        let patches = p.propose(&cx, &Knobs::default()).unwrap();
        let j = crate::passes::apply_all(&cx.job, &patches).unwrap();
        let ups: Vec<_> = j
            .local
            .ops
            .iter()
            .filter(|o| o.spec.phase == Phase::Update)
            .collect();
        // 5 + 7 µs minus one of two 4 µs launches = 8 µs; one kernel left.
        assert_eq!(ups.len(), 1);
        assert_eq!(ups[0].spec.dur_ns, 8_000);
        assert_eq!(ups[0].work.unwrap().kernels, 1);
        assert_eq!(iter_us(j), 98.0);
    }

    #[test]
    fn insert_before_and_after_follow_daydream_insert() {
        // 3 µs kernel between BW l0 and Out t0 (so before UPDATE t0), 2 µs after In t1.
        let text = "name: x\ndoc: d\nrules:\n  - select: {kind: out, tensor: l0.*}\n    insert: {where: before, device: gpu, duration_us: 3}\n  - select: {kind: in, tensor: l1.*}\n    insert: {where: after, device: gpu, duration_us: 2}\n";
        let (cx, j) = run(text, tiny(), &[]).unwrap();
        assert_eq!(j.local.ops.len(), cx.job.local.ops.len() + 2);
        let new = &j.local.ops[10];
        assert_eq!(
            (new.spec.kind, new.spec.phase, new.spec.dur_ns),
            (OpKind::Compute, Phase::Comm, 3000)
        );
        // 10: preds of Out t0 (BW l0 = 3) → 10 → 4.
        assert!(j.local.edges.contains(&(3, 10)) && j.local.edges.contains(&(10, 4)));
        assert!(j.local.edges.contains(&(8, 11)) && j.local.edges.contains(&(11, 9)));
        assert_eq!(iter_us(j), 107.0);
    }

    #[test]
    fn insert_duration_from_bytes_and_memory_passes() {
        // Out t0 has 4000 B: 4000 / 2 GB/s = 2000 ns; 1 memory pass at 900 GB/s · 0.8 = 5.556 ns;
        // one 4 µs launch: 6005.6 → 6006 ns.
        let text = "name: x\ndoc: d\nrules:\n  - select: {kind: out, tensor: l0.*}\n    insert: {where: before, device: gpu, gbps: 2, memory_passes: 1, kernels: 1}\n";
        let (_, j) = run(text, tiny(), &[]).unwrap();
        assert_eq!(j.local.ops[10].spec.dur_ns, 6006);
    }

    #[test]
    fn offload_moves_memory_and_delays_the_backward() {
        // l0's 100 B at 0.01 B/ns: copies of 10 µs. D2H 10..20 µs on copy stream 1 frees at 20;
        // H2D waits for BW l1 (the BW before BW l0), 70..80 µs, then BW l0 80..100: +10 µs.
        let text = "name: x\ndoc: d\nrules:\n  - select: {phase: fw, layer: l0.*}\n    offload: {gbps: 0.01}\n";
        let (_, j) = run(text, tiny(), &[]).unwrap();
        assert_eq!(j.local.devices.len(), 4);
        assert_eq!(
            j.local.devices[2],
            DeviceKind::GpuStream {
                worker: 0,
                stream: 1
            }
        );
        let copies: Vec<_> = j
            .local
            .ops
            .iter()
            .filter(|o| o.spec.kind == OpKind::Memcpy)
            .collect();
        assert_eq!(copies.len(), 2);
        assert!(copies.iter().all(|o| o.spec.dur_ns == 10_000));
        assert!(j.local.mem.contains(&MemEffect {
            op: 10,
            worker: 0,
            bytes: 100,
            when: MemWhen::FreeAtEnd
        }));
        let e = evaluate(j).unwrap();
        assert_eq!(e.iteration_ns(), 112_000);
        // 1000 static + 100 + 50 while both FW activations live (the D2H runs during FW l1).
        assert_eq!(e.memory.peak_bytes, 1150);
    }

    #[test]
    fn memory_factor_scales_effects() {
        let text = "name: x\ndoc: d\nrules:\n  - select: {layer: l1.*}\n    memory: 0.5\n";
        let (_, j) = run(text, tiny(), &[]).unwrap();
        // 1000 static + 100 + 25.
        assert_eq!(evaluate(j).unwrap().memory.peak_bytes, 1125);
    }

    #[test]
    fn priority_sync_bytes_and_partition() {
        let text = "name: x\ndoc: d\nknobs:\n  - {name: k, default: 4, min: 1, max: 64}\nrules:\n  - select: {kind: compute}\n    priority: by_layer_order\n  - select: {kind: out, min_bytes: 5000}\n    partition: {pieces: $k}\n  - select: {phase: comm}\n    sync_bytes: 0.5\n";
        let (_, j) = run(text, tiny(), &[]).unwrap();
        let pr: Vec<i32> = j.local.ops.iter().map(|o| o.spec.priority).collect();
        assert_eq!(pr, vec![0, 1, 1, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(j.syncs[0].partitions, 4);
        assert_eq!(j.syncs[1].partitions, 1);
        assert_eq!((j.syncs[0].bytes, j.syncs[1].bytes), (4000, 2000));
        // k = 0 is refused by the declared range.
        let e = run(text, tiny(), &[("k", "0")]).unwrap_err();
        assert!(e.contains("must be between 1 and 64"), "{e}");
        // A literal 0 is refused at load, with its line.
        let e = err("name: x\ndoc: d\nrules:\n  - select: {}\n    partition: {pieces: 0}\n");
        assert!(
            e.starts_with("t.yaml:5:") && e.contains("partition.pieces"),
            "{e}"
        );
    }

    #[test]
    fn hierarchical_factor_by_hand() {
        // m = 8, N = 2, B_intra = 100, B_inter = 10: flat 2·15/16/10 = 0.1875;
        // hierarchical 2·1/2/10 + 2·7/8/100 = 0.1175 → 0.62667.
        let mut j = tiny();
        j.comm = spec(2, 100.0, 10.0);
        assert!((hierarchical_factor(&j) - 0.1175 / 0.1875).abs() < 1e-9);
        j.comm = spec(1, 100.0, 10.0);
        assert_eq!(hierarchical_factor(&j), 1.0);
    }

    #[test]
    fn merge_that_creates_a_cycle_names_the_rule() {
        // FW l0 → FW l1 → BW l1: merging FW l0 with BW l1 puts FW l1 on a cycle.
        let text = "name: x\ndoc: d\nrules:\n  - select: {phase: update}\n    scale: 1\n  - select: {name: [\"l0.conv FW*\", \"l1.bn BW*\"]}\n    merge: {duration: max}\n";
        let e = run(text, tiny(), &[]).unwrap_err();
        assert!(e.starts_with("t.yaml:6: rule 2 (merge):"), "{e}");
        assert!(e.contains("cycle"), "{e}");
    }

    #[test]
    fn removing_every_compute_op_is_an_error() {
        let text = "name: x\ndoc: d\nrules:\n  - select: {kind: compute}\n    remove: true\n";
        let e = run(text, tiny(), &[]).unwrap_err();
        assert!(e.starts_with("t.yaml:4: rule 1 (remove):"), "{e}");
        assert!(e.contains("no compute op"), "{e}");
    }

    #[test]
    fn load_errors_name_file_line_and_field() {
        let e = err("name: x\ndoc: [\n");
        assert!(e.starts_with("t.yaml:"), "{e}");
        let e = err("name: x\ndoc: d\nrules:\n  - select: {phase: bw}\n    scael: 2\n");
        assert!(e.starts_with("t.yaml:5:") && e.contains("scael"), "{e}");
        let e = err("name: x\ndoc: d\nrules:\n  - select: {phase: bww}\n    scale: 2\n");
        assert!(e.starts_with("t.yaml:4:") && e.contains("bww"), "{e}");
        let e = err("name: x\ndoc: d\nrules:\n  - select: {phase: bw}\n    scale: $nope\n");
        assert!(
            e.starts_with("t.yaml:5:") && e.contains("`$nope` is not declared"),
            "{e}"
        );
        let e = err("name: x\ndoc: d\nrules:\n  - select: {phase: bw}\n    scale: fast\n");
        assert!(e.contains("field scale") && e.contains("`fast`"), "{e}");
        let e = err(
            "name: x\ndoc: d\nrules:\n  - select: {phase: bw}\n    scale: 2\n    remove: true\n",
        );
        assert!(
            e.starts_with("t.yaml:4:") && e.contains("one action per rule"),
            "{e}"
        );
        let e = err(
            "name: x\ndoc: d\nrules:\n  - select: {phase: bw}\n    scale: \"x\"\n    priority: 1.5\n",
        );
        assert!(e.contains("one action"), "{e}");
        let e = err("name: x\ndoc: d\nrules:\n  - select: {}\n    merge: {duration: mean}\n");
        assert!(
            e.starts_with("t.yaml:5:") && e.contains("sum_minus_launch"),
            "{e}"
        );
        let e = err("name: X Y\ndoc: d\nrules: []\n");
        assert!(e.contains("field name"), "{e}");
    }

    #[test]
    fn rule_selecting_nothing_is_skipped() {
        let text = "name: x\ndoc: d\nrules:\n  - select: {layer: nothing*}\n    scale: 0\n";
        let (cx, j) = run(text, tiny(), &[]).unwrap();
        assert_eq!(j, cx.job);
    }

    #[test]
    fn load_file_reads_and_reports_missing_files() {
        let dir = std::env::temp_dir().join(format!("trainplan-decl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("p.yaml");
        std::fs::write(
            &f,
            "name: halve-bw\ndoc: d\nrules:\n  - select: {phase: bw}\n    scale: 0.5\n",
        )
        .unwrap();
        let p = load_file(&f).unwrap();
        assert_eq!(p.name(), "halve-bw");
        let e = load_file(&dir.join("missing.yaml"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("missing.yaml") && e.contains("failed to read"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn builtins_parse_with_unique_names() {
        let b = builtins();
        let names: Vec<&str> = b.iter().map(|p| p.name()).collect();
        assert_eq!(
            names,
            [
                "blueconnect",
                "dgc",
                "fused-adam",
                "p3",
                "reconstruct-batchnorm",
                "vdnn"
            ]
        );
        // Every shipped file is in the list.
        let mut files: Vec<String> =
            std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/passes"))
                .unwrap()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.ends_with(".yaml"))
                .collect();
        files.sort();
        let listed: Vec<&str> = BUILTIN.iter().map(|(f, _)| &f["passes/".len()..]).collect();
        assert_eq!(files, listed);
    }

    // ---- the shipped passes on zoo models ----

    fn zoo(name: &str, batch: u32, cluster: &str, symmetric: bool) -> Job {
        let m = model(
            name,
            &ModelOptions {
                batch: Some(batch),
                ..Default::default()
            },
        )
        .unwrap();
        let c = load_cluster(cluster).unwrap();
        zoo_job(
            &m,
            &c,
            &BuildOptions {
                symmetric,
                ..Default::default()
            },
        )
        .unwrap()
    }

    fn builtin(name: &str) -> DeclarativePass {
        let (f, t) = BUILTIN
            .iter()
            .find(|(f, _)| f.contains(&format!("/{name}.yaml")))
            .unwrap();
        parse(t, f).unwrap()
    }

    /// Apply a shipped pass; (before, after).
    fn shipped(name: &str, job: Job, knobs: &[(&str, &str)]) -> (Evaluated, Evaluated) {
        let p = builtin(name);
        let kv: Vec<(String, String)> = knobs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let k = resolve_knobs(&p, &kv).unwrap();
        let cx = evaluate(job).unwrap();
        let patches = p.propose(&cx, &k).unwrap();
        let j = crate::passes::apply_all(&cx.job, &patches).unwrap();
        (cx, evaluate(j).unwrap())
    }

    fn comm_ns(e: &Evaluated) -> u64 {
        (0..e.graph.op_count() as u32)
            .filter(|&o| e.graph.kind(o).is_comm())
            .map(|o| e.graph.dur_ns(o))
            .sum()
    }

    #[test]
    fn zoo_fused_adam() {
        let ups = |e: &Evaluated| {
            e.job
                .local
                .ops
                .iter()
                .filter(|o| o.spec.phase == Phase::Update && o.spec.kind == OpKind::Compute)
                .count()
        };
        // ResNet-50 steps with SGD: fused Adam does not apply (issue 27).
        let p = builtin("fused-adam");
        let cx = evaluate(zoo("resnet50", 32, "8xh200", true)).unwrap();
        let e = p.propose(&cx, &Knobs::default()).unwrap_err().to_string();
        assert!(e.contains("steps with SGD"), "{e}");
        // The same job on Adam: the update tail shrinks by at most the saved launches, on the
        // GPU (its per-kernel floor) and on the host (the update's launch ops, all but one).
        let mut adam = zoo("resnet50", 32, "8xh200", true);
        adam.meta.optimizer = Some("Adam".into());
        let (a, b) = shipped("fused-adam", adam, &[]);
        assert_eq!((ups(&a), ups(&b)), (161, 1));
        let saved = a.iteration_ns() - b.iteration_ns();
        let host: u64 = a
            .job
            .local
            .ops
            .iter()
            .filter(|o| o.spec.phase == Phase::Update && o.spec.kind == OpKind::Launch)
            .map(|o| o.spec.dur_ns)
            .sum();
        let launches = (160.0 * a.job.gpu.launch_overhead_us * 1e3) as u64 + host;
        assert!(saved > 0 && saved <= launches, "{saved} vs {launches}");
        // BERT on one H200 node: every update already waits for the last all-reduce
        // (`optimizer.step()` after the backward), so fusing them only saves launches.
        let (a, b) = shipped("fused-adam", zoo("bert-base", 2, "8xh200", true), &[]);
        assert_eq!(ups(&b), 1);
        let r = b.iteration_ns() as f64 / a.iteration_ns() as f64;
        assert!((0.8..=1.0).contains(&r), "{r}");
    }

    /// Issue 27: fused Adam only for Adam/AdamW jobs that are not fused already, and not when
    /// nothing says which optimizer the job uses.
    #[test]
    fn fused_adam_applies_only_to_unfused_adam() {
        let p = builtin("fused-adam");
        let why = |job: Job| {
            p.propose(&evaluate(job).unwrap(), &Knobs::default())
                .err()
                .map(|e| e.to_string())
        };
        let traced = |opt: Option<&str>, fused: bool| {
            let mut j = tiny();
            j.meta.trace = Some(Box::new(crate::graph::job::TraceFacts {
                optimizer: opt.map(str::to_string),
                optimizer_fused: fused,
                ..Default::default()
            }));
            j
        };
        assert!(why(traced(Some("Adam"), false)).is_none());
        assert!(why(traced(Some("adamw"), false)).is_none());
        let e = why(traced(Some("Adam"), true)).unwrap();
        assert!(e.contains("already fused"), "{e}");
        let e = why(traced(Some("Adagrad"), false)).unwrap();
        assert!(e.contains("steps with Adagrad"), "{e}");
        let e = why(traced(Some("SGD"), false)).unwrap();
        assert!(e.contains("steps with SGD"), "{e}");
        let e = why(traced(None, false)).unwrap();
        assert!(e.contains("not known"), "{e}");
        assert!(why(zoo("bert-base", 2, "8xh200", true)).is_none());
    }

    #[test]
    fn zoo_reconstruct_batchnorm_resnet() {
        let (a, b) = shipped(
            "reconstruct-batchnorm",
            zoo("resnet50", 32, "dpro-16xv100-rdma", true),
            &[],
        );
        // BN and ReLU are a large share of ResNet-50's memory-bound time (measured 1.21×).
        let speedup = a.iteration_ns() as f64 / b.iteration_ns() as f64;
        assert!(speedup > 1.1 && speedup < 1.4, "{speedup}");
        let fw = |e: &Evaluated, layer: &str| {
            let i = e.job.local.layers.iter().position(|l| l == layer).unwrap();
            e.job
                .local
                .ops
                .iter()
                .find(|o| o.spec.layer == i as u32 && o.spec.phase == Phase::Fw)
                .unwrap()
                .spec
                .dur_ns
        };
        assert_eq!(
            fw(&b, "layer1.0.bn1"),
            ns(fw(&a, "layer1.0.bn1") as f64 * 0.5)
        );
        assert_eq!(
            fw(&b, "layer1.0.downsample.1"),
            ns(fw(&a, "layer1.0.downsample.1") as f64 * 0.5)
        );
        assert_eq!(fw(&b, "layer1.0.relu1"), 0);
        assert_eq!(fw(&b, "layer1.0.conv1"), fw(&a, "layer1.0.conv1"));
    }

    #[test]
    fn zoo_p3_slices_large_tensors() {
        let (a, b) = shipped("p3", zoo("resnet50", 8, "dpro-16xv100-tcp", true), &[]);
        let big: Vec<_> = a.job.syncs.iter().filter(|s| s.bytes > 4 << 20).collect();
        assert!(!big.is_empty());
        for s in &b.job.syncs {
            assert_eq!(s.partitions as u64, s.bytes.div_ceil(4 << 20).max(1));
        }
        // Finer pieces pay α per piece: not a big change either way.
        let r = b.iteration_ns() as f64 / a.iteration_ns() as f64;
        assert!((0.8..1.2).contains(&r), "{r}");
    }

    #[test]
    fn zoo_blueconnect_helps_across_nodes_only() {
        let (a, b) = shipped(
            "blueconnect",
            zoo("resnet50", 8, "dpro-16xv100-tcp", true),
            &[],
        );
        // Only the bandwidth term shrinks (× 0.55 on TCP); 30 α per tensor stay.
        assert!(
            comm_ns(&b) < comm_ns(&a) * 9 / 10,
            "{} {}",
            comm_ns(&b),
            comm_ns(&a)
        );
        assert!(b.iteration_ns() < a.iteration_ns() * 95 / 100);
        let (a, b) = shipped("blueconnect", zoo("resnet50", 8, "8xh200", true), &[]);
        assert_eq!(a.iteration_ns(), b.iteration_ns());
    }

    #[test]
    fn zoo_dgc_cuts_communication_on_tcp() {
        let (a, b) = shipped("dgc", zoo("resnet50", 8, "dpro-16xv100-tcp", true), &[]);
        // Bytes × 0.001 leave the per-step latency: communication ≈ 30 α per tensor.
        assert!(
            comm_ns(&b) < comm_ns(&a) * 8 / 10,
            "{} {}",
            comm_ns(&b),
            comm_ns(&a)
        );
        assert!(b.iteration_ns() < a.iteration_ns() * 8 / 10);
        // One compression and one decompression kernel per tensor.
        let n = a.job.syncs.len();
        let gpu_ops = |e: &Evaluated| {
            e.job
                .local
                .ops
                .iter()
                .filter(|o| o.spec.kind == OpKind::Compute)
                .count()
        };
        assert_eq!(gpu_ops(&b), gpu_ops(&a) + 2 * n);
    }

    #[test]
    fn zoo_vdnn_lowers_peak_memory() {
        // PCIe copies lag the H200's forward (batch 64: more bytes to copy than the host's
        // dispatch time hides): some memory comes back late, time goes up.
        let (a, b) = shipped(
            "vdnn",
            zoo("resnet50", 64, "8xh200", true),
            &[("pcie_gbps", "50")],
        );
        let r = b.memory.peak_bytes as f64 / a.memory.peak_bytes as f64;
        assert!(r < 0.95, "{r}");
        assert!(b.iteration_ns() > a.iteration_ns());
        // With copies for free, the whole offloadable share (conv inputs) leaves the peak.
        let (a, b) = shipped(
            "vdnn",
            zoo("resnet50", 8, "8xh200", true),
            &[("pcie_gbps", "1000")],
        );
        let r = b.memory.peak_bytes as f64 / a.memory.peak_bytes as f64;
        assert!(r < 0.75, "{r}");
    }
}
