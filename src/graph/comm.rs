//! Fine-grained communication topologies (dPRO §4.1): how one tensor's synchronisation becomes
//! SEND/RECV ops on links, wired between the tensor's per-worker `Out` (gradient ready) and `In`
//! (synchronised) virtual ops.
//!
//! * **Ring all-reduce**: 2(n−1) steps; in step `s` worker `i` SENDs a chunk of `S/n` bytes on
//!   link `i → i+1` and worker `i+1` RECVs it. SEND(i, s) waits for RECV(i, s−1) (the chunk it
//!   forwards); SEND(i, 0) waits for the gradient and for the worker's previous collective
//!   (NCCL runs one collective at a time per communicator, in issue order).
//! * **Tree all-reduce**: a binary tree (parent of `i` is `(i−1)/2`); the whole tensor is reduced
//!   up and broadcast down, one message per tree edge and direction (unpipelined).
//! * **Parameter server**: the tensor is sharded over the servers; each worker PUSHes one shard to
//!   every server on its NIC, each server aggregates the shard from all workers and PULLs it back
//!   to every worker on its own NIC.
//! * **Symmetric ring** ([`CommTopology::symmetric_ring`]): the quotient graph of a ring over `n`
//!   identical workers. Worker `i`'s RECV in step `s` happens when worker `i−1`'s SEND in step
//!   `s` ends, which by symmetry is when its own SEND ends: one worker and a chain of 2(n−1)
//!   SEND → RECV pairs replay exactly like the full ring when all ring links are alike. With
//!   mixed links (NVLink inside, network between nodes) each step takes as long as the slowest
//!   hop the ring has for that chunk size (α included), the hop that paces a real ring.
//!
//! Per-hop costs are α–β ([`AlphaBeta`]): a SEND of `b` bytes takes `α + b/B` on its link; the
//! RECV carries no extra time (NCCL's fused receive-reduce-send kernel is inside the calibrated
//! α–β); a PS aggregation streams the shard through the server's memory.
//!
//! Link bandwidth between nodes is the NIC's times the NICs per node: NCCL spreads its rings over
//! all NICs.

use std::collections::BTreeMap;

use crate::cost::comm::AlphaBeta;
use crate::cost::compute::ns;
use crate::cost::config::{Cluster, SyncScheme};

use super::{
    DeviceId, DeviceKind, DfgBuilder, LinkClass, NONE, OpId, OpKind, OpSpec, Phase, TensorId,
};

/// What a collective computes. Ring forms: an all-reduce is a reduce-scatter (n−1 steps, each
/// rank ends with its reduced 1/n) followed by an all-gather (n−1 steps); each step moves a
/// chunk of `S/n` bytes on every ring link (NCCL's ring algorithms; the sharded data-parallel
/// collectives of FSDP and ZeRO).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    #[default]
    AllReduce,
    /// Each rank ends with its 1/n of the sum (gradients of sharded data parallelism).
    ReduceScatter,
    /// Each rank contributes 1/n and ends with the whole tensor (sharded parameters).
    AllGather,
}

impl CollectiveKind {
    /// Ring steps over `n` ranks.
    pub fn ring_steps(self, n: u32) -> u32 {
        match self {
            CollectiveKind::AllReduce => 2 * n.saturating_sub(1),
            CollectiveKind::ReduceScatter | CollectiveKind::AllGather => n.saturating_sub(1),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all-reduce",
            CollectiveKind::ReduceScatter => "reduce-scatter",
            CollectiveKind::AllGather => "all-gather",
        }
    }
}

/// The ranks one collective runs over: groups of `size` workers `stride` apart (HSDP: a shard
/// group of consecutive ranks, stride 1; the replicas of one shard, stride = the shard group's
/// size). `size` 0 means every worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Group {
    pub size: u32,
    pub stride: u32,
}

impl Group {
    /// Every worker.
    pub const ALL: Group = Group { size: 0, stride: 1 };

    /// The group's size over `n` workers.
    pub fn len(self, n: u32) -> u32 {
        if self.size == 0 { n } else { self.size.min(n) }
    }

    /// True when it is every worker.
    pub fn is_all(self, n: u32) -> bool {
        self.len(n) == n && self.stride.max(1) == 1
    }

    /// The members of worker `w`'s group, in ring order.
    pub fn members(self, n: u32, w: u32) -> Vec<u32> {
        let size = self.len(n);
        let stride = self.stride.max(1);
        let span = size * stride;
        let base = (w / span) * span + w % stride;
        (0..size)
            .map(|k| base + k * stride)
            .filter(|&m| m < n)
            .collect()
    }
}

/// α–β of the two link classes and the PS aggregation rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CommCost {
    pub intra: AlphaBeta,
    pub inter: AlphaBeta,
    /// Bytes/ns a parameter server sums (one input stream).
    pub aggregate_bytes_per_ns: f64,
}

impl CommCost {
    /// Costs from a cluster's network descriptions.
    pub fn from_cluster(c: &Cluster) -> CommCost {
        let intra = AlphaBeta {
            alpha_ns: c.intra.alpha_us * 1e3,
            bytes_per_ns: c.intra.bytes_per_ns(),
        };
        let inter = c.inter.as_ref().map_or(intra, |n| AlphaBeta {
            alpha_ns: n.alpha_us * 1e3,
            bytes_per_ns: n.bytes_per_ns() * c.nics_per_node.min(c.gpus_per_node).max(1) as f64,
        });
        CommCost {
            intra,
            inter,
            // A server sums with AVX at ~20 GB/s per core (BytePS summation service).
            aggregate_bytes_per_ns: 20.0,
        }
    }

    pub(crate) fn link(&self, class: LinkClass) -> AlphaBeta {
        match class {
            LinkClass::IntraNode => self.intra,
            LinkClass::InterNode => self.inter,
        }
    }
}

/// What [`CommTopology`] needs to know of a cluster.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CommSpec {
    pub scheme: SyncScheme,
    /// Workers per node: ring and tree hops between nodes use the inter-node link.
    pub gpus_per_node: u32,
    /// Nodes (the symmetric ring uses the inter-node link when there are several).
    pub nodes: u32,
    /// Parameter servers (PS only).
    pub ps_servers: u32,
    pub cost: CommCost,
}

impl CommSpec {
    pub fn from_cluster(c: &Cluster) -> CommSpec {
        CommSpec {
            scheme: c.sync,
            gpus_per_node: c.gpus_per_node.max(1),
            nodes: c.nodes.max(1),
            ps_servers: c.ps_servers,
            cost: CommCost::from_cluster(c),
        }
    }
}

/// The communication devices of a job and the wiring of each tensor's synchronisation.
#[derive(Clone, Debug)]
pub struct CommTopology {
    scheme: SyncScheme,
    /// Workers that exist in the graph (1 in the symmetric form).
    workers: u32,
    /// Workers taking part in the collective (n).
    n: u32,
    gpus_per_node: u32,
    cost: CommCost,
    /// Symmetric form: the link classes the real ring's hops have.
    quotient_hops: Vec<LinkClass>,
    comm_stream: Vec<DeviceId>,
    /// Ring: link i → i+1. Symmetric: the single quotient link.
    ring_links: Vec<DeviceId>,
    links: BTreeMap<(u32, u32), DeviceId>,
    worker_nic: Vec<DeviceId>,
    server_nic: Vec<DeviceId>,
    server_agg: Vec<DeviceId>,
    /// Each worker's previous collective's last op (NCCL's one-at-a-time order).
    last: Vec<OpId>,
    priority: i32,
}

impl CommTopology {
    /// The full topology of `cluster` over `comm_stream.len()` workers, one comm stream each.
    pub fn new(b: &mut DfgBuilder, spec: &CommSpec, comm_stream: Vec<DeviceId>) -> Self {
        let n = comm_stream.len() as u32;
        let mut t = CommTopology {
            scheme: spec.scheme,
            workers: n,
            n,
            gpus_per_node: spec.gpus_per_node.max(1),
            cost: spec.cost,
            quotient_hops: Vec::new(),
            comm_stream,
            ring_links: Vec::new(),
            links: BTreeMap::new(),
            worker_nic: Vec::new(),
            server_nic: Vec::new(),
            server_agg: Vec::new(),
            last: vec![NONE; n as usize],
            priority: 0,
        };
        match t.scheme {
            SyncScheme::Ring if n > 1 => {
                for i in 0..n {
                    let to = (i + 1) % n;
                    let class = t.class(i, to);
                    t.ring_links
                        .push(b.add_device(DeviceKind::Link { from: i, to, class }));
                }
            }
            SyncScheme::Ps => {
                let servers = spec.ps_servers.max(1);
                for w in 0..n {
                    t.worker_nic.push(b.add_device(DeviceKind::NicTx {
                        node: w,
                        server: false,
                    }));
                }
                for s in 0..servers {
                    t.server_nic.push(b.add_device(DeviceKind::NicTx {
                        node: s,
                        server: true,
                    }));
                    t.server_agg
                        .push(b.add_device(DeviceKind::Server { server: s }));
                }
                // Servers sit on their own machines: every push and pull crosses the network.
                t.gpus_per_node = 1;
            }
            _ => {}
        }
        t
    }

    /// The quotient form of a ring over `n` identical workers: one worker, one comm stream, one
    /// link with the slowest class of the ring.
    pub fn symmetric_ring(
        b: &mut DfgBuilder,
        spec: &CommSpec,
        n: u32,
        comm_stream: DeviceId,
    ) -> Self {
        let class = if spec.nodes > 1 {
            LinkClass::InterNode
        } else {
            LinkClass::IntraNode
        };
        // The hop classes the ring really has: intra-node hops need two GPUs on a node,
        // inter-node hops two nodes. Each step takes as long as the slowest of them.
        let mut hops = Vec::new();
        if spec.gpus_per_node > 1 || spec.nodes <= 1 {
            hops.push(LinkClass::IntraNode);
        }
        if spec.nodes > 1 {
            hops.push(LinkClass::InterNode);
        }
        let link = b.add_device(DeviceKind::Link {
            from: 0,
            to: 1 % n.max(1),
            class,
        });
        CommTopology {
            scheme: SyncScheme::Ring,
            workers: 1,
            n,
            gpus_per_node: spec.gpus_per_node.max(1),
            cost: spec.cost,
            quotient_hops: hops,
            comm_stream: vec![comm_stream],
            ring_links: vec![link],
            links: BTreeMap::new(),
            worker_nic: Vec::new(),
            server_nic: Vec::new(),
            server_agg: Vec::new(),
            last: vec![NONE],
            priority: 0,
        }
    }

    /// True for the quotient form.
    pub fn is_symmetric(&self) -> bool {
        self.workers < self.n
    }

    fn class(&self, a: u32, b: u32) -> LinkClass {
        if a / self.gpus_per_node == b / self.gpus_per_node {
            LinkClass::IntraNode
        } else {
            LinkClass::InterNode
        }
    }

    fn link(&mut self, b: &mut DfgBuilder, from: u32, to: u32) -> DeviceId {
        let class = self.class(from, to);
        *self
            .links
            .entry((from, to))
            .or_insert_with(|| b.add_device(DeviceKind::Link { from, to, class }))
    }

    fn comm_op(
        &self,
        kind: OpKind,
        device: DeviceId,
        tensor: TensorId,
        step: u32,
        dur_ns: u64,
    ) -> OpSpec {
        OpSpec {
            step,
            tensor,
            priority: self.priority,
            ..OpSpec::new(kind, Phase::Comm, device, dur_ns)
        }
    }

    /// Scheduling priority given to the ops of the collectives wired from now on (P3: a
    /// tensor's transfers inherit its gradient's priority; 0 by default).
    pub fn set_priority(&mut self, priority: i32) {
        self.priority = priority;
    }

    /// Ops one all-reduce of a tensor adds (for capacity planning).
    pub fn ops_per_tensor(&self) -> usize {
        let n = self.n as usize;
        match self.scheme {
            _ if n <= 1 => 0,
            // The quotient ring: one send and one receive per collective.
            SyncScheme::Ring if self.is_symmetric() => 2,
            SyncScheme::Ring => 4 * n * (n - 1),
            SyncScheme::Tree => 4 * (n - 1),
            SyncScheme::Ps => {
                let s = self.server_agg.len();
                4 * n * s + s
            }
        }
    }

    /// Wire the synchronisation of `tensor` (`bytes` per worker) from each worker's `ready[w]`
    /// to its `done[w]` (both indexed by the graph's workers).
    pub fn allreduce(
        &mut self,
        b: &mut DfgBuilder,
        tensor: TensorId,
        bytes: u64,
        ready: &[OpId],
        done: &[OpId],
    ) {
        self.collective(
            b,
            CollectiveKind::AllReduce,
            Group::ALL,
            tensor,
            bytes,
            ready,
            done,
        );
    }

    /// Wire one collective of `kind` over `group` for `tensor` (`bytes`: the whole tensor, as
    /// an all-reduce's): ring forms only for reduce-scatter, all-gather and sub-groups (the
    /// sharding pass refuses other schemes).
    #[allow(clippy::too_many_arguments)]
    pub fn collective(
        &mut self,
        b: &mut DfgBuilder,
        kind: CollectiveKind,
        group: Group,
        tensor: TensorId,
        bytes: u64,
        ready: &[OpId],
        done: &[OpId],
    ) {
        debug_assert_eq!(ready.len(), self.workers as usize);
        debug_assert_eq!(done.len(), self.workers as usize);
        if kind != CollectiveKind::AllReduce || !group.is_all(self.n) {
            if self.is_symmetric() {
                self.group_ring_quotient(b, kind, group, tensor, bytes, ready[0], done[0]);
            } else {
                self.group_ring(b, kind, group, tensor, bytes, ready, done);
            }
            return;
        }
        if self.n <= 1 {
            for (&r, &d) in ready.iter().zip(done) {
                b.add_edge(r, d);
            }
            return;
        }
        match self.scheme {
            SyncScheme::Ring if self.is_symmetric() => self.group_ring_quotient(
                b,
                CollectiveKind::AllReduce,
                Group::ALL,
                tensor,
                bytes,
                ready[0],
                done[0],
            ),
            SyncScheme::Ring => self.ring(b, tensor, bytes, ready, done),
            SyncScheme::Tree => self.tree(b, tensor, bytes, ready, done),
            SyncScheme::Ps => self.ps(b, tensor, bytes, ready, done),
        }
    }

    fn ring(
        &mut self,
        b: &mut DfgBuilder,
        tensor: TensorId,
        bytes: u64,
        ready: &[OpId],
        done: &[OpId],
    ) {
        let n = self.n;
        let chunk = bytes as f64 / n as f64;
        let steps = 2 * (n - 1);
        let durs: Vec<u64> = (0..n)
            .map(|i| ns(self.cost.link(self.class(i, (i + 1) % n)).time_ns(chunk)))
            .collect();
        // prev[i] = the op worker i must finish before its next SEND.
        let mut prev: Vec<OpId> = ready.to_vec();
        let mut recv = vec![0 as OpId; n as usize];
        for s in 0..steps {
            for i in 0..n {
                let send = b.add_op(self.comm_op(
                    OpKind::Send,
                    self.ring_links[i as usize],
                    tensor,
                    s,
                    durs[i as usize],
                ));
                b.add_edge(prev[i as usize], send);
                if s == 0 && self.last[i as usize] != NONE {
                    b.add_edge(self.last[i as usize], send);
                }
                let to = (i + 1) % n;
                let r = b.add_op(self.comm_op(
                    OpKind::Recv,
                    self.comm_stream[to as usize],
                    tensor,
                    s,
                    0,
                ));
                b.add_edge(send, r);
                recv[to as usize] = r;
            }
            prev.copy_from_slice(&recv);
        }
        for i in 0..n as usize {
            b.add_edge(prev[i], done[i]);
            self.last[i] = prev[i];
        }
    }

    /// A ring of `kind` within each group of `group` (full form): links between the members,
    /// made on first use; each rank's previous collective still goes first.
    #[allow(clippy::too_many_arguments)]
    fn group_ring(
        &mut self,
        b: &mut DfgBuilder,
        kind: CollectiveKind,
        group: Group,
        tensor: TensorId,
        bytes: u64,
        ready: &[OpId],
        done: &[OpId],
    ) {
        let n = self.n;
        let mut seen = vec![false; n as usize];
        for w in 0..n {
            if seen[w as usize] {
                continue;
            }
            let members = group.members(n, w);
            for &m in &members {
                seen[m as usize] = true;
            }
            let k = members.len() as u32;
            if k <= 1 {
                for &m in &members {
                    b.add_edge(ready[m as usize], done[m as usize]);
                }
                continue;
            }
            let chunk = bytes as f64 / k as f64;
            let mut prev: Vec<OpId> = members.iter().map(|&m| ready[m as usize]).collect();
            let mut recv = prev.clone();
            for s in 0..kind.ring_steps(k) {
                for (i, &from) in members.iter().enumerate() {
                    let j = (i + 1) % members.len();
                    let to = members[j];
                    let link = self.link(b, from, to);
                    let dur = ns(self.cost.link(self.class(from, to)).time_ns(chunk));
                    let send = b.add_op(self.comm_op(OpKind::Send, link, tensor, s, dur));
                    b.add_edge(prev[i], send);
                    if s == 0 && self.last[from as usize] != NONE {
                        b.add_edge(self.last[from as usize], send);
                    }
                    let r = b.add_op(self.comm_op(
                        OpKind::Recv,
                        self.comm_stream[to as usize],
                        tensor,
                        s,
                        0,
                    ));
                    b.add_edge(send, r);
                    recv[j] = r;
                }
                prev.copy_from_slice(&recv);
            }
            for (i, &m) in members.iter().enumerate() {
                b.add_edge(prev[i], done[m as usize]);
                self.last[m as usize] = prev[i];
            }
        }
    }

    /// The quotient form of [`Self::group_ring`]: one chain of the group's ring steps, each as
    /// long as the slowest hop the group's ring has (members `stride` apart: a hop between
    /// nodes when the group spans nodes).
    #[allow(clippy::too_many_arguments)]
    fn group_ring_quotient(
        &mut self,
        b: &mut DfgBuilder,
        kind: CollectiveKind,
        group: Group,
        tensor: TensorId,
        bytes: u64,
        ready: OpId,
        done: OpId,
    ) {
        let k = group.len(self.n);
        if k <= 1 {
            b.add_edge(ready, done);
            return;
        }
        let hops: Vec<LinkClass> = if group.is_all(self.n) {
            self.quotient_hops.clone()
        } else {
            let members = group.members(self.n, 0);
            let mut h: Vec<LinkClass> = members
                .iter()
                .zip(members.iter().cycle().skip(1))
                .map(|(&a, &c)| self.class(a, c))
                .collect();
            h.sort_by_key(|c| *c as u8);
            h.dedup();
            h
        };
        let chunk = bytes as f64 / k as f64;
        let dur = hops
            .iter()
            .map(|&c| ns(self.cost.link(c).time_ns(chunk)))
            .max()
            .unwrap_or(0);
        // Every step of the quotient ring is the same chain link (one send of `dur` on the
        // ring link, its receive on the comm stream, after the step before and after the
        // collective before): nothing else can run between two steps, so the chain is one send
        // of all the steps' time and one receive. Same replay, 2(k−1) times fewer ops (a
        // 512-worker all-reduce is 2 ops, not 2,044).
        let steps = kind.ring_steps(k);
        let send = b.add_op(self.comm_op(
            OpKind::Send,
            self.ring_links[0],
            tensor,
            0,
            dur.saturating_mul(u64::from(steps)),
        ));
        b.add_edge(ready, send);
        if self.last[0] != NONE {
            b.add_edge(self.last[0], send);
        }
        let r = b.add_op(self.comm_op(
            OpKind::Recv,
            self.comm_stream[0],
            tensor,
            steps.saturating_sub(1),
            0,
        ));
        b.add_edge(send, r);
        b.add_edge(r, done);
        self.last[0] = r;
    }

    fn tree(
        &mut self,
        b: &mut DfgBuilder,
        tensor: TensorId,
        bytes: u64,
        ready: &[OpId],
        done: &[OpId],
    ) {
        let n = self.n;
        // Reduce: children before parents, so visit workers from the highest index down.
        // What a worker must have before it sends up: its gradient, its previous collective.
        let mut reduced: Vec<Vec<OpId>> = ready
            .iter()
            .zip(&self.last)
            .map(|(&r, &l)| if l == NONE { vec![r] } else { vec![r, l] })
            .collect();
        for i in (1..n).rev() {
            let p = (i - 1) / 2;
            let link = self.link(b, i, p);
            let dur = ns(self.cost.link(self.class(i, p)).time_ns(bytes as f64));
            let send = b.add_op(self.comm_op(OpKind::Send, link, tensor, 0, dur));
            for &d in &reduced[i as usize] {
                b.add_edge(d, send);
            }
            let r =
                b.add_op(self.comm_op(OpKind::Recv, self.comm_stream[p as usize], tensor, 0, 0));
            b.add_edge(send, r);
            reduced[p as usize].push(r);
        }
        // Broadcast: parents before children.
        let mut have: Vec<OpId> = vec![NONE; n as usize];
        let root_done = b.add_op(self.comm_op(OpKind::Recv, self.comm_stream[0], tensor, 1, 0));
        for &d in &reduced[0] {
            b.add_edge(d, root_done);
        }
        have[0] = root_done;
        for i in 1..n {
            let p = (i - 1) / 2;
            let link = self.link(b, p, i);
            let dur = ns(self.cost.link(self.class(p, i)).time_ns(bytes as f64));
            let send = b.add_op(self.comm_op(OpKind::Send, link, tensor, 1, dur));
            b.add_edge(have[p as usize], send);
            let r =
                b.add_op(self.comm_op(OpKind::Recv, self.comm_stream[i as usize], tensor, 1, 0));
            b.add_edge(send, r);
            // A worker's own gradient and reduce must be in before it takes the result.
            for &d in &reduced[i as usize] {
                b.add_edge(d, r);
            }
            have[i as usize] = r;
        }
        for i in 0..n as usize {
            b.add_edge(have[i], done[i]);
            self.last[i] = have[i];
        }
    }

    fn ps(
        &mut self,
        b: &mut DfgBuilder,
        tensor: TensorId,
        bytes: u64,
        ready: &[OpId],
        done: &[OpId],
    ) {
        let servers = self.server_agg.len() as u32;
        let shard = bytes.div_ceil(servers as u64) as f64;
        let net = self.cost.link(LinkClass::InterNode);
        let xfer = ns(net.time_ns(shard));
        let agg_dur = ns(shard * self.n as f64 / self.cost.aggregate_bytes_per_ns);
        for j in 0..servers {
            let agg = b.add_op(self.comm_op(
                OpKind::Aggregate,
                self.server_agg[j as usize],
                tensor,
                j,
                agg_dur,
            ));
            for w in 0..self.n {
                let push = b.add_op(self.comm_op(
                    OpKind::Send,
                    self.worker_nic[w as usize],
                    tensor,
                    j,
                    xfer,
                ));
                b.add_edge(ready[w as usize], push);
                let got =
                    b.add_op(self.comm_op(OpKind::Recv, self.server_agg[j as usize], tensor, j, 0));
                b.add_edge(push, got);
                b.add_edge(got, agg);
            }
            for w in 0..self.n {
                let pull = b.add_op(self.comm_op(
                    OpKind::Send,
                    self.server_nic[j as usize],
                    tensor,
                    j,
                    xfer,
                ));
                b.add_edge(agg, pull);
                let got = b.add_op(self.comm_op(
                    OpKind::Recv,
                    self.comm_stream[w as usize],
                    tensor,
                    j,
                    0,
                ));
                b.add_edge(pull, got);
                b.add_edge(got, done[w as usize]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::config::load_cluster;

    /// One collective of `bytes` over the 8 GPUs of a DGX-1-class node: its replayed time.
    fn time_of(kind: CollectiveKind, group: Group, symmetric: bool, bytes: u64) -> u64 {
        let c = load_cluster("8xv100").expect("built-in cluster");
        let spec = CommSpec::from_cluster(&c);
        let mut b = DfgBuilder::new();
        let virt = b.add_device(DeviceKind::Virtual);
        let workers = if symmetric { 1 } else { 8 };
        let streams: Vec<DeviceId> = (0..workers)
            .map(|w| b.add_device(DeviceKind::CommStream { worker: w }))
            .collect();
        let mut t = if symmetric {
            CommTopology::symmetric_ring(&mut b, &spec, 8, streams[0])
        } else {
            CommTopology::new(&mut b, &spec, streams)
        };
        let mk = |b: &mut DfgBuilder, k: OpKind| -> Vec<OpId> {
            (0..workers)
                .map(|_| b.add_op(OpSpec::new(k, Phase::Comm, virt, 0)))
                .collect()
        };
        let ready = mk(&mut b, OpKind::Out);
        let done = mk(&mut b, OpKind::In);
        b.set_workers(workers);
        t.collective(&mut b, kind, group, NONE, bytes, &ready, &done);
        let g = b.build().expect("a valid graph");
        crate::replay::replay(&g).iteration_ns
    }

    #[test]
    fn reduce_scatter_and_all_gather_are_the_halves_of_an_all_reduce() {
        let s = 64 << 20;
        for sym in [false, true] {
            let ar = time_of(CollectiveKind::AllReduce, Group::ALL, sym, s);
            let rs = time_of(CollectiveKind::ReduceScatter, Group::ALL, sym, s);
            let ag = time_of(CollectiveKind::AllGather, Group::ALL, sym, s);
            assert_eq!(rs, ag);
            assert!(rs * 2 >= ar - 2 && rs * 2 <= ar + 2, "{rs} x 2 vs {ar}");
        }
    }

    #[test]
    fn a_group_ring_has_its_own_steps_and_the_symmetric_form_agrees() {
        let s = 64 << 20;
        let four = Group { size: 4, stride: 1 };
        let full = time_of(CollectiveKind::ReduceScatter, four, false, s);
        let sym = time_of(CollectiveKind::ReduceScatter, four, true, s);
        assert_eq!(full, sym);
        // 3 steps of S/4 (0.75 S per link) against 7 steps of S/8 (0.875 S) on the same links.
        let all = time_of(CollectiveKind::ReduceScatter, Group::ALL, false, s);
        assert!(full < all, "{full} vs {all}");
        assert_eq!(four.members(8, 5), vec![4, 5, 6, 7]);
        let replicas = Group { size: 2, stride: 4 };
        assert_eq!(replicas.members(8, 5), vec![1, 5]);
        assert_eq!(replicas.members(8, 2), vec![2, 6]);
    }
}
