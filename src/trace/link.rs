//! Collective sizes for the NCCL/RCCL kernels of a Kineto trace, from the best source present:
//!
//! 1. **Kernel args** (`Collective name`, `In msg nelems` × `dtype`, `Group size`, `Process Group
//!    Name`, `Process Group Ranks`) — written by PyTorch ≥ 2.1 on the kernel itself.
//! 2. **The host execution trace of the same run**, through the operator: the kernel's launch
//!    (same `correlation`) sits inside a `record_param_comms` (or `c10d::…`, `nccl:…`) `cpu_op`,
//!    which [`link_ops`] ties to a host-ET node — by `Record function id` = `rf_id` (PyTorch ≥
//!    2.1), else by `External id` = `rf_id` + a per-thread offset found by name agreement
//!    (PyTorch 2.0, e.g. the DLRM traces).
//! 3. **The host execution trace by issue order**, for kernels whose operator is not linked: the
//!    k-th kernel takes the next unused host-ET collective (after the last one linked) whose kind
//!    the kernel can run (`SendRecv` runs all-to-all, send, recv, gather, scatter). Both sides
//!    list collectives in issue order on one NCCL stream, so this is exact when the ET records
//!    the same iteration as the Kineto window.
//! 4. **Operator input shapes**: `Input Dims` × `Input type` of the enclosing `record_param_comms`
//!    `cpu_op` (present for single-tensor collectives; tensor lists have no dims there).
//!
//! A kernel none of these sizes keeps `bytes: None` and says so in [`MatchedBy::Unmatched`].

use std::collections::{BTreeMap, HashMap};

use std::path::{Path, PathBuf};

use super::collective::{self, CollectiveSize};
use super::host_et::{CollectiveKind, CommCall, HostEt, dtype_bytes, read_host_et};
use super::kineto::{Category, Event, KinetoTrace, Phase};
use super::step::TraceJob;

/// How a kernel's size was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum MatchedBy {
    KernelArgs,
    RecordFunctionId,
    /// Kineto `External id` = host-ET `rf_id` + a per-thread offset (see [`link_ops`]).
    ExternalIdOffset,
    IssueOrder,
    OperatorInputs,
    Unmatched,
}

/// One NCCL/RCCL kernel of a Kineto trace with its collective.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CollectiveInfo {
    /// Index of the kernel in `KinetoTrace::events`.
    pub event_index: usize,
    pub kernel: String,
    pub kind: CollectiveKind,
    /// Bytes this rank sends; `None` when no source had it.
    pub bytes: Option<u64>,
    /// Bytes this rank receives (the output buffer), when known.
    pub out_bytes: Option<u64>,
    pub dtype: Option<String>,
    pub pg: Option<String>,
    pub ranks: Option<Vec<u32>>,
    pub group_size: Option<u32>,
    /// The host ET node (`record_param_comms`) it was linked to.
    pub host_et_node_id: Option<u64>,
    pub matched_by: MatchedBy,
}

/// Why a host ET does not fit the Kineto trace.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LinkError {
    #[error(
        "kernel {kernel} (event {event_index}) is linked through its operator to host-ET node \
         {node}, a {call:?} that a {kind:?} kernel cannot run: the host ET is not of the same run"
    )]
    KindMismatch {
        event_index: usize,
        kernel: String,
        kind: CollectiveKind,
        node: u64,
        call: CollectiveKind,
    },
    #[error(
        "the host ET has {calls} collectives and the Kineto trace {kernels} NCCL kernels without \
         sizes, but not one kernel could be matched to a host-ET collective: the two traces are \
         not of the same run"
    )]
    NoMatch { calls: usize, kernels: usize },
}

fn is_collective_kernel(e: &Event) -> bool {
    if e.cat != Category::Kernel || e.ph != Phase::Complete {
        return false;
    }
    let n = e.name.to_ascii_lowercase();
    n.contains("nccl") || n.contains("rccl")
}

fn is_comm_op(name: &str) -> bool {
    name == "record_param_comms" || name.starts_with("nccl:") || name.starts_with("c10d::")
}

/// `[0, 1]` → `[0, 1]`.
fn parse_ranks(s: &str) -> Option<Vec<u32>> {
    let t = s.trim().trim_start_matches('[').trim_end_matches(']');
    if t.trim().is_empty() {
        return None;
    }
    t.split(',').map(|x| x.trim().parse().ok()).collect()
}

fn from_call(e_idx: usize, e: &Event, c: &CommCall, how: MatchedBy) -> CollectiveInfo {
    CollectiveInfo {
        event_index: e_idx,
        kernel: e.name.to_string(),
        kind: c.kind.clone(),
        bytes: Some(c.bytes),
        out_bytes: c.out_bytes,
        dtype: c.dtype.clone(),
        pg: c.pg.clone(),
        ranks: c.ranks.clone(),
        group_size: c.group_size,
        host_et_node_id: Some(c.host_et_node_id),
        matched_by: how,
    }
}

/// Bytes from the first input's dims and type (`[[6144], ...]`, `["float", ...]`).
fn operator_input_bytes(op: &Event) -> Option<(u64, String)> {
    let dims: serde_json::Value = serde_json::from_str(op.args.input_dims.as_deref()?).ok()?;
    let dims = dims.as_array()?.first()?.as_array()?;
    if dims.is_empty() {
        return None;
    }
    let elems = dims
        .iter()
        .try_fold(1u64, |acc, d| acc.checked_mul(d.as_u64()?))?;
    let ty: serde_json::Value = serde_json::from_str(op.args.input_type.as_deref()?).ok()?;
    let ty = ty.as_array()?.first()?.as_str()?;
    Some((elems.checked_mul(dtype_bytes(ty)?)?, ty.to_string()))
}

/// How a Kineto CPU event was tied to a host-ET node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum OpLinkMethod {
    /// The event's `Record function id` is the node's `rf_id` (PyTorch ≥ 2.1).
    RecordFunctionId,
    /// The event's `External id` minus `offset` is the node's `rf_id`: the offset is found per
    /// Kineto thread as the one that makes the most operator names agree (PyTorch 2.0 numbers
    /// the two differently, and differently per thread: +1 on the DLRM main thread, +234 on its
    /// autograd thread).
    ExternalIdOffset { offset: i64 },
}

/// One Kineto CPU event (`cpu_op` / `user_annotation`) tied to a host-ET node of the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OpLink {
    pub event_index: usize,
    pub node_id: u64,
    pub method: OpLinkMethod,
}

/// Names that occur at most this often in the host ET vote for a thread's offset (frequent
/// names would make the vote quadratic and add nothing).
const RARE_NAME: usize = 16;

/// Ties the Kineto trace's CPU operators to the host-ET nodes of the same run: by record-function
/// id when the Kineto events carry it, else by `External id` with a per-thread offset (see
/// [`OpLinkMethod`]). A pair is kept only when the names agree; a thread whose best offset
/// explains fewer than 2 names (or under 10 % of its operators) is left unlinked.
pub fn link_ops(kineto: &KinetoTrace, et: &HostEt) -> Vec<OpLink> {
    let ev = &kineto.events;
    let mut by_rf: HashMap<u64, (u64, &str)> = HashMap::new();
    let mut by_name: HashMap<&str, Vec<u64>> = HashMap::new();
    for n in &et.nodes {
        if let Some(rf) = n.rf_id {
            by_rf.entry(rf).or_insert((n.id, n.name.as_str()));
            by_name.entry(n.name.as_str()).or_default().push(rf);
        }
    }
    let ops: Vec<usize> = (0..ev.len())
        .filter(|&i| {
            matches!(ev[i].cat, Category::CpuOp | Category::UserAnnotation)
                && ev[i].ph == Phase::Complete
        })
        .collect();
    let mut out = Vec::new();
    if ops.iter().any(|&i| ev[i].args.rf_id.is_some()) {
        for &i in &ops {
            let e = &ev[i];
            if let Some(rf) = e.args.rf_id.and_then(|r| u64::try_from(r).ok())
                && let Some(&(node, name)) = by_rf.get(&rf)
                && name == &*e.name
            {
                out.push(OpLink {
                    event_index: i,
                    node_id: node,
                    method: OpLinkMethod::RecordFunctionId,
                });
            }
        }
        return out;
    }
    let mut threads: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for &i in &ops {
        if ev[i].args.external_id.is_some() {
            threads
                .entry((ev[i].pid.to_string(), ev[i].tid.to_string()))
                .or_default()
                .push(i);
        }
    }
    for list in threads.values() {
        let mut votes: BTreeMap<i64, usize> = BTreeMap::new();
        for &i in list {
            let Some(ext) = ev[i].args.external_id else {
                continue;
            };
            let Some(rfs) = by_name.get(&*ev[i].name) else {
                continue;
            };
            if rfs.len() > RARE_NAME {
                continue;
            }
            for &rf in rfs {
                if let Ok(rf) = i64::try_from(rf) {
                    *votes.entry(ext.saturating_sub(rf)).or_default() += 1;
                }
            }
        }
        // Most votes; ties to the smallest offset.
        let Some((&offset, _)) = votes
            .iter()
            .max_by_key(|&(o, v)| (*v, std::cmp::Reverse(*o)))
        else {
            continue;
        };
        let pairs: Vec<OpLink> = list
            .iter()
            .filter_map(|&i| {
                let rf = u64::try_from(ev[i].args.external_id?.checked_sub(offset)?).ok()?;
                let &(node, name) = by_rf.get(&rf)?;
                (name == &*ev[i].name).then_some(OpLink {
                    event_index: i,
                    node_id: node,
                    method: OpLinkMethod::ExternalIdOffset { offset },
                })
            })
            .collect();
        if pairs.len() >= 2 && pairs.len() * 10 >= list.len() {
            out.extend(pairs);
        }
    }
    out.sort_by_key(|l| l.event_index);
    out
}

/// Per NCCL/RCCL kernel of `kineto` (in start-time order): its collective's kind and size, from
/// the kernel's args, else `host_et` (the execution trace of the same run), else the enclosing
/// operator's input shapes (see the module docs for the order and the rules).
pub fn collective_sizes(
    kineto: &KinetoTrace,
    host_et: Option<&HostEt>,
) -> Result<Vec<CollectiveInfo>, LinkError> {
    let ev = &kineto.events;
    let kernels = collective_kernels(ev);
    let comm_ops = CommOps::new(ev);
    let mut et = EtCalls::new(kineto, host_et);
    let mut out = Vec::with_capacity(kernels.len());
    for &i in &kernels {
        let k = &ev[i];
        // 1. kernel args
        if let Some(info) = from_kernel_args(i, k) {
            out.push(info);
            continue;
        }
        let kind = CollectiveKind::parse(&k.name);
        let op_index = comm_ops.enclosing(ev, k);
        // 2. the enclosing op's link to a host-ET node, 3. issue order
        if let Some(info) = et.take(i, k, &kind, op_index)? {
            out.push(info);
            continue;
        }
        // 4. operator input shapes
        out.push(from_operator_inputs(i, k, kind, op_index.map(|o| &ev[o])));
    }
    et.check_matched()?;
    Ok(out)
}

/// The NCCL/RCCL kernels' event indices, in start-time order.
fn collective_kernels(ev: &[Event]) -> Vec<usize> {
    let mut kernels: Vec<usize> = (0..ev.len())
        .filter(|&i| is_collective_kernel(&ev[i]))
        .collect();
    kernels.sort_by_key(|&i| (ev[i].ts_ns, i));
    kernels
}

/// The kernel's size from its own args (`Collective name`, `In msg nelems` × `dtype`; PyTorch ≥
/// 2.1), when it has them all.
fn from_kernel_args(i: usize, k: &Event) -> Option<CollectiveInfo> {
    let a = &k.args;
    let (Some(name), Some(n)) = (&a.collective_name, a.in_msg_nelems) else {
        return None;
    };
    let size = a.dtype.as_deref().and_then(dtype_bytes);
    let (Some(s), Ok(n)) = (size, u64::try_from(n)) else {
        return None;
    };
    let ranks = a.process_group_ranks.as_deref().and_then(parse_ranks);
    Some(CollectiveInfo {
        event_index: i,
        kernel: k.name.to_string(),
        kind: CollectiveKind::parse(name),
        bytes: Some(n.saturating_mul(s)),
        out_bytes: a
            .out_msg_nelems
            .and_then(|o| u64::try_from(o).ok())
            .map(|o| o.saturating_mul(s)),
        dtype: a.dtype.clone(),
        pg: a.process_group_name.clone(),
        group_size: a
            .group_size
            .and_then(|g| u32::try_from(g).ok())
            .or(ranks.as_ref().map(|r| r.len() as u32)),
        ranks,
        host_et_node_id: None,
        matched_by: MatchedBy::KernelArgs,
    })
}

/// The communication `cpu_op`s of a trace (`record_param_comms`, `nccl:…`, `c10d::…`) and the
/// runtime calls by correlation, to find the operator a kernel was launched from.
struct CommOps {
    /// correlation → launching runtime call (event index).
    launch: HashMap<i64, usize>,
    cpu_ops: Vec<usize>,
}

impl CommOps {
    fn new(ev: &[Event]) -> CommOps {
        let launch: HashMap<i64, usize> = ev
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e.cat, Category::CudaRuntime | Category::CudaDriver))
            .filter_map(|(i, e)| Some((e.args.correlation?, i)))
            .collect();
        let cpu_ops: Vec<usize> = (0..ev.len())
            .filter(|&i| {
                ev[i].cat == Category::CpuOp
                    && ev[i].ph == Phase::Complete
                    && is_comm_op(&ev[i].name)
            })
            .collect();
        CommOps { launch, cpu_ops }
    }

    /// The innermost communication cpu_op enclosing the kernel's launch (its event index).
    fn enclosing(&self, ev: &[Event], k: &Event) -> Option<usize> {
        let l = &ev[*self.launch.get(&k.args.correlation?)?];
        self.cpu_ops
            .iter()
            .copied()
            .filter(|&i| {
                let o = &ev[i];
                o.pid == l.pid && o.tid == l.tid && o.ts_ns <= l.ts_ns && o.end_ns() >= l.end_ns()
            })
            .max_by_key(|&i| (ev[i].ts_ns, std::cmp::Reverse(ev[i].dur_ns)))
    }
}

/// The host ET's collectives, handed out to the kernels that need one: through the kernel's
/// linked operator, else in issue order.
struct EtCalls {
    calls: Vec<CommCall>,
    /// Host-ET node → its comm call: the record_param_comms node itself, its nccl:* child or its
    /// c10d::* parent.
    call_of_node: HashMap<u64, usize>,
    /// Kineto CPU event → its host-ET node (see [`link_ops`]).
    links: HashMap<usize, OpLink>,
    /// The first call issue order may still give (after the last one taken).
    next_call: usize,
    /// Kernels that asked, and kernels that got a call.
    needed: usize,
    got: usize,
}

impl EtCalls {
    fn new(kineto: &KinetoTrace, host_et: Option<&HostEt>) -> EtCalls {
        let calls: Vec<CommCall> = host_et.map(HostEt::comm_calls).unwrap_or_default();
        let call_of_node = host_et.map_or_else(HashMap::new, |et| call_of_node(et, &calls));
        let links: HashMap<usize, OpLink> = match host_et {
            Some(et) if !calls.is_empty() => link_ops(kineto, et)
                .into_iter()
                .map(|l| (l.event_index, l))
                .collect(),
            _ => HashMap::new(),
        };
        EtCalls {
            calls,
            call_of_node,
            links,
            next_call: 0,
            needed: 0,
            got: 0,
        }
    }

    /// The host-ET collective of kernel `k` (event `i`, launched from operator `op_index`): the
    /// call its operator is linked to (a call the kernel cannot run is an error: the traces are
    /// not of one run), else the next unused call in issue order that it can run. `None` when
    /// the host ET has no collectives, or none left for it.
    fn take(
        &mut self,
        i: usize,
        k: &Event,
        kind: &CollectiveKind,
        op_index: Option<usize>,
    ) -> Result<Option<CollectiveInfo>, LinkError> {
        if self.calls.is_empty() {
            return Ok(None);
        }
        self.needed += 1;
        if let Some(link) = op_index.and_then(|o| self.links.get(&o))
            && let Some(&c) = self.call_of_node.get(&link.node_id)
        {
            let call = &self.calls[c];
            if !kind.kernel_runs(&call.kind) {
                return Err(LinkError::KindMismatch {
                    event_index: i,
                    kernel: k.name.to_string(),
                    kind: kind.clone(),
                    node: call.host_et_node_id,
                    call: call.kind.clone(),
                });
            }
            self.next_call = self.next_call.max(c + 1);
            self.got += 1;
            let how = match link.method {
                OpLinkMethod::RecordFunctionId => MatchedBy::RecordFunctionId,
                OpLinkMethod::ExternalIdOffset { .. } => MatchedBy::ExternalIdOffset,
            };
            return Ok(Some(from_call(i, k, call, how)));
        }
        if let Some(off) = self.calls[self.next_call.min(self.calls.len())..]
            .iter()
            .position(|c| kind.kernel_runs(&c.kind))
        {
            let c = self.next_call + off;
            self.next_call = c + 1;
            self.got += 1;
            return Ok(Some(from_call(i, k, &self.calls[c], MatchedBy::IssueOrder)));
        }
        Ok(None)
    }

    /// Kernels needed the host ET but not one got a call: the traces are not of the same run.
    fn check_matched(&self) -> Result<(), LinkError> {
        if self.needed > 0 && self.got == 0 {
            return Err(LinkError::NoMatch {
                calls: self.calls.len(),
                kernels: self.needed,
            });
        }
        Ok(())
    }
}

/// Host-ET node → the index of its comm call in `calls`: the record_param_comms node itself, its
/// c10d::* parent, and its nccl:* children.
fn call_of_node(et: &HostEt, calls: &[CommCall]) -> HashMap<u64, usize> {
    let mut call_of_node: HashMap<u64, usize> = HashMap::new();
    for (c, call) in calls.iter().enumerate() {
        call_of_node.insert(call.host_et_node_id, c);
        if let Some(p) = et.node(call.host_et_node_id).and_then(|n| n.parent) {
            call_of_node.entry(p).or_insert(c);
        }
    }
    let own: HashMap<u64, usize> = calls
        .iter()
        .enumerate()
        .map(|(c, call)| (call.host_et_node_id, c))
        .collect();
    for n in &et.nodes {
        if let Some(&c) = n.parent.and_then(|p| own.get(&p)) {
            call_of_node.entry(n.id).or_insert(c);
        }
    }
    call_of_node
}

/// The kernel's size from the enclosing operator's first input (`Input Dims` × `Input type`),
/// else unmatched (`bytes: None`).
fn from_operator_inputs(
    i: usize,
    k: &Event,
    kind: CollectiveKind,
    op: Option<&Event>,
) -> CollectiveInfo {
    let (bytes, dtype, how) = match op.and_then(operator_input_bytes) {
        Some((b, t)) => (Some(b), Some(t), MatchedBy::OperatorInputs),
        None => (None, None, MatchedBy::Unmatched),
    };
    CollectiveInfo {
        event_index: i,
        kernel: k.name.to_string(),
        kind,
        bytes,
        out_bytes: bytes,
        dtype,
        pg: None,
        ranks: None,
        group_size: None,
        host_et_node_id: None,
        matched_by: how,
    }
}

/// The one-rank-to-n model's kind for a collective (`None` for kinds it has no formula for).
pub fn model_kind(k: &CollectiveKind) -> Option<collective::CollectiveKind> {
    use collective::CollectiveKind as M;
    Some(match k {
        CollectiveKind::AllReduce => M::AllReduce,
        CollectiveKind::AllToAll => M::AllToAll,
        CollectiveKind::AllGather => M::AllGather,
        CollectiveKind::ReduceScatter => M::ReduceScatter,
        CollectiveKind::Broadcast => M::Broadcast,
        CollectiveKind::Reduce => M::Reduce,
        CollectiveKind::Send | CollectiveKind::Recv | CollectiveKind::SendRecv => M::SendRecv,
        CollectiveKind::Barrier => M::Barrier,
        CollectiveKind::Gather | CollectiveKind::Scatter | CollectiveKind::Other(_) => {
            return None;
        }
    })
}

/// Sizes of a built step's collectives (in [`TraceJob::collectives`] order, matched by kernel
/// event index) from [`collective_sizes`]; all-gather takes its output buffer, the rest what a
/// rank sends.
pub fn sizes_for_step(built: &TraceJob, infos: &[CollectiveInfo]) -> Vec<Option<CollectiveSize>> {
    let by_event: HashMap<usize, &CollectiveInfo> =
        infos.iter().map(|c| (c.event_index, c)).collect();
    built
        .collectives
        .iter()
        .map(|c| {
            let info = by_event.get(&c.event)?;
            let kind = model_kind(&info.kind)?;
            let bytes = if kind == collective::CollectiveKind::AllGather {
                info.out_bytes.or(info.bytes)?
            } else {
                info.bytes?
            };
            Some(CollectiveSize { kind, bytes })
        })
        .collect()
}

/// The host execution trace recorded beside a Kineto trace: the same file name with `kineto`
/// replaced by `execution_trace`, `host_et` or `et` (`rank3.kineto.json.gz` →
/// `rank3.execution_trace.json.gz`), when such a file exists.
pub fn host_et_beside(kineto_path: &Path) -> Option<PathBuf> {
    let name = kineto_path.file_name()?.to_str()?;
    if !name.contains("kineto") {
        return None;
    }
    ["execution_trace", "host_et", "et"]
        .iter()
        .map(|r| kineto_path.with_file_name(name.replacen("kineto", r, 1)))
        .find(|p| p.is_file())
}

/// Sizes of `built`'s collectives from the host execution trace beside `path` (see
/// [`host_et_beside`]); all `None` when there is none. An execution trace that cannot be read or
/// does not fit is reported as a warning and ignored: it is an optional extra source.
pub fn sizes_beside(
    path: &Path,
    trace: &KinetoTrace,
    built: &TraceJob,
) -> Vec<Option<CollectiveSize>> {
    let none = vec![None; built.collectives.len()];
    let Some(et_path) = host_et_beside(path) else {
        return none;
    };
    let et = match read_host_et(&et_path) {
        Ok(et) => et,
        Err(e) => {
            tracing::warn!("ignoring the execution trace beside the Kineto trace: {e}");
            return none;
        }
    };
    match collective_sizes(trace, Some(&et)) {
        Ok(infos) => {
            tracing::info!(
                file = %et_path.display(),
                collectives = infos.len(),
                "collective sizes from the execution trace"
            );
            sizes_for_step(built, &infos)
        }
        Err(e) => {
            tracing::warn!(file = %et_path.display(), "ignoring the execution trace: {e}");
            none
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::host_et::{parse_host_et, read_host_et};
    use crate::trace::kineto::{parse_kineto, read_kineto};
    use std::path::{Path, PathBuf};

    /// Two launches from record_param_comms ops with record-function ids 11 and 21; the second
    /// op's input dims say 8 floats.
    const KINETO: &str = r#"{"traceEvents":[
    {"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":1,"tid":1,"ts":0,"dur":10,"args":{"Record function id":11}},
    {"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":2,"dur":5,"args":{"correlation":100}},
    {"ph":"X","cat":"kernel","name":"ncclDevKernel_AllReduce_Sum_f32_RING_LL","pid":0,"tid":7,"ts":20,"dur":5,"args":{"correlation":100}},
    {"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":1,"tid":1,"ts":30,"dur":10,"args":{"Record function id":21,"Input Dims":[[8],[]],"Input type":["float","Scalar"]}},
    {"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":32,"dur":5,"args":{"correlation":101}},
    {"ph":"X","cat":"kernel","name":"ncclDevKernel_SendRecv","pid":0,"tid":7,"ts":40,"dur":5,"args":{"correlation":101}}
    ]}"#;

    fn et(rf1: u64, name2: &str) -> String {
        format!(
            r#"{{"schema":"1.1.0","nodes":[
            {{"id":5,"name":"record_param_comms","ctrl_deps":4,
              "inputs":{{"values":[[[1,2,0,250,4,"cuda:0"]],1,["0","default_pg"],0,"allreduce",[],[],0,1,2],
                        "shapes":[],"types":["GenericList[Tensor(float)]","Int","Tuple[String,String]","Int","String","GenericList[]","GenericList[]","Int","Int","Int"]}},
              "attrs":[{{"name":"rf_id","value":{rf1}}}]}},
            {{"id":9,"name":"record_param_comms","ctrl_deps":8,
              "inputs":{{"values":[[3,4,0,64,4,"cuda:0"],2,["0","default_pg"],0,"{name2}",[32,32],[32,32]],
                        "shapes":[],"types":["Tensor(float)","Int","Tuple[String,String]","Int","String","GenericList[Int,Int]","GenericList[Int,Int]"]}},
              "attrs":[{{"name":"rf_id","value":77}}]}}]}}"#
        )
    }

    fn check(et_text: Option<&str>, expect: &[(Option<u64>, MatchedBy)]) {
        let k = parse_kineto(KINETO.as_bytes(), "k.json").unwrap();
        let et = et_text.map(|t| parse_host_et(t.as_bytes(), "et.json").unwrap());
        let got: Vec<_> = collective_sizes(&k, et.as_ref())
            .unwrap()
            .into_iter()
            .map(|c| (c.bytes, c.matched_by))
            .collect();
        assert_eq!(got, expect);
    }

    #[test]
    fn sources_in_order() {
        use MatchedBy::*;
        // No host ET: the first has nothing, the second its op's input dims (8 floats).
        check(None, &[(None, Unmatched), (Some(32), OperatorInputs)]);
        // rf id 11 links the first; the second (rf 21 is not in the ET) goes by issue order.
        check(
            Some(&et(11, "all_to_allv")),
            &[(Some(1000), RecordFunctionId), (Some(256), IssueOrder)],
        );
        // rf ids not in the ET: issue order for both.
        check(
            Some(&et(12, "all_to_allv")),
            &[(Some(1000), IssueOrder), (Some(256), IssueOrder)],
        );
    }

    #[test]
    fn wrong_run_is_an_error() {
        let k = parse_kineto(KINETO.as_bytes(), "k.json").unwrap();
        // rf 11 names an all-to-all: an AllReduce kernel cannot run it.
        let text = et(11, "allreduce").replace("\"allreduce\",[],[]", "\"all_to_all\",[],[]");
        let et = parse_host_et(text.as_bytes(), "et.json").unwrap();
        let e = collective_sizes(&k, Some(&et)).unwrap_err();
        assert!(matches!(e, LinkError::KindMismatch { node: 5, .. }), "{e}");
    }

    fn shared() -> Option<PathBuf> {
        let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
        if d.is_dir() {
            Some(d)
        } else {
            crate::skip_note!(
                "skipping: ../shared/traces is absent (the real linking tests need it)"
            );
            None
        }
    }

    #[test]
    fn real_dlrm_all_ranks() {
        let Some(d) = shared() else { return };
        use CollectiveKind::*;
        // Sizes from the host ETs' record_param_comms inputs, checked with python3; kinds from
        // the Kineto kernel names (5 SendRecv, 3 AllReduce).
        let send = [24576, 192, 1536, 13568, 1576964, 24576, 448, 907840];
        let kinds = [
            AllToAll, AllToAll, AllToAll, AllToAll, AllReduce, AllToAll, AllReduce, AllReduce,
        ];
        let mut per_rank = Vec::new();
        for r in 0..8 {
            let k =
                read_kineto(&d.join(format!("multi-rank-dlrm/rank{r}.kineto.json.gz"))).unwrap();
            let et =
                read_host_et(&d.join(format!("multi-rank-dlrm/rank{r}.execution_trace.json.gz")))
                    .unwrap();
            let got = collective_sizes(&k, Some(&et)).unwrap();
            assert_eq!(got.len(), 8, "rank {r}");
            // The kernels' record_param_comms ops are tied to their host-ET nodes by External
            // id (per-thread offset) where the offset holds, else by issue order; either way the
            // sizes are those the python3 recount read from the record_param_comms inputs.
            let how: Vec<MatchedBy> = got.iter().map(|c| c.matched_by).collect();
            assert!(
                how.iter()
                    .all(|m| matches!(m, MatchedBy::ExternalIdOffset | MatchedBy::IssueOrder)),
                "rank {r}: {how:?}"
            );
            if r == 0 {
                // The last all-reduce's op has External id 1632 and the autograd thread's
                // offset (+234) gives rf 1398, but its node has rf_id 1400: the offset drifts
                // at the end of the backward pass, and issue order takes over.
                let mut expect = vec![MatchedBy::ExternalIdOffset; 7];
                expect.push(MatchedBy::IssueOrder);
                assert_eq!(how, expect);
            }
            let bytes: Vec<u64> = got.iter().map(|c| c.bytes.unwrap()).collect();
            assert_eq!(bytes, send, "rank {r}");
            let ks: Vec<_> = got.iter().map(|c| c.kind.clone()).collect();
            assert_eq!(ks, kinds, "rank {r}");
            per_rank.push(
                got.iter()
                    .map(|c| (c.kind.clone(), c.bytes))
                    .collect::<Vec<_>>(),
            );

            // Without the host ET: the single-tensor all-to-alls from the operator's input dims;
            // the all-reduces pass tensor lists, which have no dims in Kineto.
            let alone: Vec<Option<u64>> = collective_sizes(&k, None)
                .unwrap()
                .iter()
                .map(|c| c.bytes)
                .collect();
            let expect: Vec<Option<u64>> = send
                .iter()
                .zip(&kinds)
                .map(|(&b, k)| (*k == AllToAll).then_some(b))
                .collect();
            assert_eq!(alone, expect, "rank {r}");
        }
        assert!(per_rank.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn real_dlrm_op_links() {
        let Some(d) = shared() else { return };
        let k = read_kineto(&d.join("multi-rank-dlrm/rank0.kineto.json.gz")).unwrap();
        let et = read_host_et(&d.join("multi-rank-dlrm/rank0.execution_trace.json.gz")).unwrap();
        let links = link_ops(&k, &et);
        let mut per_offset: BTreeMap<i64, usize> = BTreeMap::new();
        for l in &links {
            let OpLinkMethod::ExternalIdOffset { offset } = l.method else {
                panic!("{l:?}")
            };
            *per_offset.entry(offset).or_default() += 1;
        }
        // Main thread: External id = rf_id + 1 for 791 of its 989 operators; autograd thread:
        // + 234 for 527 of 684 (python3, same name rule).
        assert_eq!(per_offset, BTreeMap::from([(1, 791), (234, 527)]));

        // The tiny pair: all 36 CPU events, External id = rf_id.
        let k = read_kineto(&d.join("execution-traces/simple_add.kineto.json.gz")).unwrap();
        let et = read_host_et(&d.join("execution-traces/simple_add.host_et.json.gz")).unwrap();
        let links = link_ops(&k, &et);
        assert_eq!(links.len(), 36);
        assert!(
            links
                .iter()
                .all(|l| l.method == OpLinkMethod::ExternalIdOffset { offset: 0 })
        );
    }

    #[test]
    fn real_dlrm_step_sizes_from_the_execution_trace_beside() {
        let Some(d) = shared() else { return };
        let p = d.join("multi-rank-dlrm/rank0.kineto.json.gz");
        assert_eq!(
            host_et_beside(&p),
            Some(d.join("multi-rank-dlrm/rank0.execution_trace.json.gz"))
        );
        let k = read_kineto(&p).unwrap();
        let built = crate::trace::graph::build_job(&k, "rank0", None).unwrap();
        let sizes = sizes_beside(&p, &k, &built);
        let bytes: Vec<u64> = sizes.iter().map(|s| s.unwrap().bytes).collect();
        assert_eq!(
            bytes,
            [24576, 192, 1536, 13568, 1576964, 24576, 448, 907840]
        );
        assert_eq!(
            sizes[4].unwrap().kind,
            crate::trace::extrapolate::CollectiveKind::AllReduce
        );
    }

    #[test]
    fn real_kernel_args() {
        let Some(d) = shared() else { return };
        let k = read_kineto(&d.join("pytorch-kineto/resnet50_ddp_a100_rank0of2.json.gz")).unwrap();
        let got = collective_sizes(&k, None).unwrap();
        assert_eq!(got.len(), 21);
        assert!(got.iter().all(|c| c.matched_by == MatchedBy::KernelArgs
            && c.group_size == Some(2)
            && c.ranks == Some(vec![0, 1])
            && c.pg.as_deref() == Some("0")));
        let mut sizes: Vec<(CollectiveKind, u64)> = got
            .iter()
            .map(|c| (c.kind.clone(), c.bytes.unwrap()))
            .collect();
        sizes.sort();
        sizes.dedup();
        // Each of these 7 appears 3 times (3 steps); counted with python3.
        use CollectiveKind::*;
        assert_eq!(
            sizes,
            vec![
                (AllReduce, 8196000),
                (AllReduce, 9724160),
                (AllReduce, 26255360),
                (AllReduce, 26550272),
                (AllReduce, 31502336),
                (Broadcast, 424),
                (Broadcast, 212480),
            ]
        );
    }
}
