//! Stage *launches* (back-pressure): a launch much slower than the window's usual one (over 4×
//! the median and 30 µs) was blocked on a full launch queue. It gets an edge from the GPU op (in
//! the window or carried in) that ended last while it was blocked — the op whose end freed its
//! slot — and keeps only its recorded time after that end. Replayed as recorded it changes
//! nothing; in a what-if where the GPU is faster, the launch returns earlier. (The launch → GPU
//! op edges themselves are drawn with the GPU ops, stage *streams*.)

use super::super::kineto::Event;
use super::streams::GpuOps;
use super::threads::CpuOps;
use super::{Builder, ns};
use crate::graph::OpId;

/// Add the back-pressure edges; returns how many launches were modelled as blocked.
pub(super) fn stall_edges(b: &mut Builder, ev: &[Event], cpu: &CpuOps, gpu: &GpuOps) -> usize {
    if cpu.stalled.is_empty() {
        return 0;
    }
    let mut ends: Vec<(i64, OpId, usize)> = gpu
        .gpu_op
        .iter()
        .map(|(&g, &op)| (g, op))
        .chain(gpu.carried.iter().copied())
        .map(|(g, op)| (ev[g].end_ns(), op, g))
        .collect();
    ends.sort_unstable();
    let mut modelled = 0usize;
    for &(op, start, end, le) in &cpu.stalled {
        let corr = ev[le].args.correlation;
        let hi = ends.partition_point(|&(t, _, _)| t <= end);
        let freed = ends[..hi]
            .iter()
            .rev()
            .take_while(|&&(t, _, _)| t > start)
            .find(|&&(_, _, g)| corr.is_none() || ev[g].args.correlation != corr);
        if let Some(&(t, gop, _)) = freed {
            b.local.edges.push((gop, op));
            b.local.ops[op as usize].spec.dur_ns = ns(end - t);
            modelled += 1;
        }
    }
    modelled
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse, stall_trace};
    use super::super::{pick_step, streams, threads};
    use super::*;

    #[test]
    fn a_blocked_launch_waits_for_the_op_that_freed_its_slot() {
        let t = parse(&stall_trace());
        let win = pick_step(&t, "t", None).unwrap();
        let mut th = threads::collect(&t.events, &win);
        let mut gpu = streams::collect(&t.events, &win, &th);
        let mut carry = streams::carry_in(&t.events, &win, &gpu);
        let mut b = Builder::default();
        b.local.devices.push(crate::graph::DeviceKind::Virtual);
        let cpu = threads::build(&mut b, &t.events, &mut th, &win, &gpu.gpu_by_corr);
        assert_eq!(cpu.stalled.len(), 1);
        let g = streams::build(&mut b, &t.events, &win, &mut gpu, &mut carry, &cpu);
        let before = b.local.edges.len();
        assert_eq!(stall_edges(&mut b, &t.events, &cpu, &g), 1);
        assert_eq!(b.local.edges.len(), before + 1);
    }
}
