//! What one recorded step is once built: its window ([`StepWindow`]), the job built from it with
//! what each op came from ([`TraceJob`]) and its collective kernels ([`TraceCollective`]).
//!
//! These are the types the stages of `graph` produce and every later stage reads (the work, the
//! facts, the memory, the peers, several ranks, one rank extrapolated): they live below all of
//! them, so that the importer's modules depend downward only.

use crate::graph::OpId;
use crate::graph::job::Job;

use super::kineto::Id;
use super::work::WorkSource;

/// One iteration window of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepWindow {
    /// `ProfilerStep#N` or `Optimizer.step iteration i`.
    pub label: String,
    /// `N` of `ProfilerStep#N`, or the iteration index `i` (1-based) between Optimizer.step ends.
    pub number: u64,
    pub start_ns: i64,
    pub end_ns: i64,
    /// The CPU thread the marker is on (pid, tid).
    pub pid: Id,
    pub tid: Id,
    /// Launched GPU work and every launch's GPU activity is in the file.
    pub complete: bool,
}

impl StepWindow {
    pub fn measured_ns(&self) -> u64 {
        (self.end_ns - self.start_ns).max(0) as u64
    }
}

/// A job built from one iteration of a trace.
#[derive(Clone, Debug)]
pub struct TraceJob {
    /// The job; `job.meta.trace` holds what the trace says about it ([`TraceFacts`]).
    ///
    /// [`TraceFacts`]: crate::graph::job::TraceFacts
    pub job: Job,
    pub window: StepWindow,
    /// Local op marking the end of the step on the step's thread: its replayed end is the
    /// predicted step time.
    pub step_end: OpId,
    /// Recorded start of each local op, ns from the window's start (a blocking call's wait op:
    /// the call's start).
    pub recorded_start_ns: Vec<i64>,
    /// The trace event each local op came from (`None` for gaps and markers).
    pub op_event: Vec<Option<usize>>,
    /// How each local op's work is known (shapes, kernel name, none).
    pub work_source: Vec<WorkSource>,
    /// The step's NCCL/RCCL kernels in stream order: the collectives other ranks must match.
    pub collectives: Vec<TraceCollective>,
    /// Collectives whose duration was re-derived because their peers are absent (see the
    /// `peers` module).
    pub peer_waits: usize,
    /// Ignorable oddities met while building.
    pub warnings: Vec<String>,
}

/// One recorded collective kernel of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceCollective {
    /// Its `Collective` op in the job's local graph.
    pub op: OpId,
    /// Index of the kernel event in the trace's `traceEvents`.
    pub event: usize,
    pub name: String,
    /// Recorded start and duration on the trace's own clock (ns).
    pub start_ns: i64,
    pub dur_ns: u64,
}
