//! The steady-state iteration period of a recorded step: the step-to-step time a training loop
//! sees when every step is this one.
//!
//! A recorded step's replay has two ends: the step's CPU thread reaching the step's end (what
//! `ProfilerStep#N` measures) and the *makespan*, when the last GPU work launched in the step
//! drains. When the GPU lags the host the makespan runs past the step (the next step's work
//! queues behind it), and neither is the period: a faster GPU does not move the CPU's end of the
//! step in a host-bound step, and the drain counts work the next step would overlap.
//!
//! The period is measured on three copies of the step played back to back: on every device,
//! copy `c + 1` starts after copy `c` (its ops after the previous copy's last ops on the same
//! device), every CPU thread of copy `c + 1` starts after copy `c`'s step end (the loop's next
//! iteration), and the work a copy inherited from the previous step (the carry-in) is that
//! previous copy's own — so copies after the first carry nothing in. The period is the largest,
//! over devices, of the distance between the ends of the last two copies on that device: the
//! CPU thread's for a host-bound step, the GPU stream's when the GPU falls behind (its backlog
//! grows by the GPU's excess each step), a synchronising step's both. Replayed as recorded, a
//! step in steady state has a period equal to its measured step.

use crate::graph::job::{CARRY_IN_LAYER, Job, STEP_END_LAYER};
use crate::graph::{DeviceKind, DfgBuilder, NONE, OpId, OpKind, OpSpec};

use super::replay;

/// Copies played back to back.
const COPIES: usize = 3;

/// What the steady state of a recorded step gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Steady {
    /// Step-to-step time in steady state, ns.
    pub period_ns: u64,
    /// The device whose step-to-step time that is (the lowest id on ties).
    pub by: DeviceKind,
}

/// The steady-state period of a recorded step (`None` for a job without a step-end marker — a
/// zoo job or a Chakra trace — or with gradient syncs of its own).
pub fn steady(job: &Job) -> Option<Steady> {
    let l = &job.local;
    let layer_of = |name: &str| l.layers.iter().position(|x| x == name).map(|p| p as u32);
    let end_layer = layer_of(STEP_END_LAYER)?;
    if !job.syncs.is_empty() {
        return None;
    }
    let carry_layer = layer_of(CARRY_IN_LAYER);
    let n = l.ops.len();
    let step_end: Vec<OpId> = (0..n as OpId)
        .filter(|&i| {
            let s = &l.ops[i as usize].spec;
            s.layer == end_layer && s.kind == OpKind::Gap
        })
        .collect();
    let [step_end] = step_end.as_slice() else {
        return None;
    };
    // Per device: its first and last ops (no predecessor / successor on the same device).
    let dev = |o: OpId| l.ops[o as usize].spec.device;
    let mut has_pred_same = vec![false; n];
    let mut has_succ_same = vec![false; n];
    for &(a, b) in &l.edges {
        if dev(a) == dev(b) {
            has_succ_same[a as usize] = true;
            has_pred_same[b as usize] = true;
        }
    }
    let real = |o: usize| {
        !matches!(
            l.devices[l.ops[o].spec.device as usize],
            DeviceKind::Virtual
        )
    };
    let firsts: Vec<OpId> = (0..n)
        .filter(|&o| real(o) && !has_pred_same[o])
        .map(|o| o as OpId)
        .collect();
    let lasts: Vec<OpId> = (0..n)
        .filter(|&o| real(o) && !has_succ_same[o])
        .map(|o| o as OpId)
        .collect();

    let mut b = DfgBuilder::with_capacity(COPIES * n, COPIES * (l.edges.len() + n));
    for d in &l.devices {
        b.add_device(*d);
    }
    for c in 0..COPIES {
        for o in &l.ops {
            let mut s: OpSpec = o.spec.clone();
            if c > 0 && carry_layer.is_some() && Some(s.layer) == carry_layer {
                s.dur_ns = 0;
                s.gap_ns = 0;
            }
            s.layer = NONE;
            s.tensor = NONE;
            b.add_op(s);
        }
        let base = (c * n) as OpId;
        for &(x, y) in &l.edges {
            b.add_edge(base + x, base + y);
        }
        if c > 0 {
            let prev = ((c - 1) * n) as OpId;
            for &f in &firsts {
                for &z in lasts.iter().filter(|&&z| dev(z) == dev(f)) {
                    b.add_edge(prev + z, base + f);
                }
                if matches!(l.devices[dev(f) as usize], DeviceKind::CpuThread { .. }) {
                    b.add_edge(prev + step_end, base + f);
                }
            }
        }
    }
    b.set_workers(1);
    let g = b.build().ok()?;
    let r = replay(&g);
    // End of each copy on each device.
    let devices = l.devices.len();
    let mut end = vec![[0u64; COPIES]; devices];
    for c in 0..COPIES {
        for i in 0..n {
            let d = l.ops[i].spec.device as usize;
            if l.ops[i].spec.dur_ns == 0 && l.ops[i].spec.kind != OpKind::Gap {
                continue;
            }
            let e = r.end_ns[c * n + i];
            end[d][c] = end[d][c].max(e);
        }
    }
    let (period, d) = (0..devices)
        .filter(|&d| !matches!(l.devices[d], DeviceKind::Virtual))
        .map(|d| (end[d][COPIES - 1].saturating_sub(end[d][COPIES - 2]), d))
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))?;
    Some(Steady {
        period_ns: period,
        by: l.devices[d],
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::graph::job::{JobMeta, LocalGraph, LocalOp};
    use crate::graph::{OpSpec, Phase};

    /// A step on one CPU thread (a launch of `launch` ns, then idle to `step` ns, the step-end
    /// marker) and one GPU stream (a kernel of `kernel` ns after the launch).
    fn job(launch: u64, step: u64, kernel: u64) -> Job {
        let mut g = LocalGraph {
            devices: vec![
                DeviceKind::Virtual,
                DeviceKind::CpuThread {
                    worker: 0,
                    thread: 0,
                },
                DeviceKind::GpuStream {
                    worker: 0,
                    stream: 0,
                },
            ],
            layers: vec![STEP_END_LAYER.into()],
            ..LocalGraph::default()
        };
        let mut push = |s: OpSpec| {
            g.ops.push(LocalOp {
                spec: s,
                work: None,
            });
            (g.ops.len() - 1) as OpId
        };
        let mut l = OpSpec::new(OpKind::Launch, Phase::Fw, 1, launch);
        l.gap_ns = step - launch;
        let l = push(l);
        let k = push(OpSpec::compute(2, Phase::Fw, NONE, kernel));
        let e = push(OpSpec {
            layer: 0,
            ..OpSpec::new(OpKind::Gap, Phase::Other, 1, 0)
        });
        g.edges = vec![(l, k), (l, e)];
        let mut j = crate::passes::recompute::tests::chain(&[1000], &[0]);
        j.local = g.into();
        j.syncs.clear();
        j.meta = JobMeta {
            source: "trace".into(),
            ..JobMeta::default()
        };
        j
    }

    /// A step (60 µs, host-bound) that inherits 50 µs of the previous step's GPU work: a
    /// carried kernel of 5 µs, which a 20 µs host synchronisation waits for, then one of 45 µs;
    /// the step's own kernel (60 µs) runs 50 µs past the step's end.
    pub(crate) fn carried_job() -> Job {
        let mut j = job(1, 60_000, 1);
        let g = std::sync::Arc::make_mut(&mut j.local);
        g.layers.push(CARRY_IN_LAYER.into());
        g.ops.clear();
        let mut push = |s: OpSpec| {
            g.ops.push(LocalOp {
                spec: s,
                work: None,
            });
            (g.ops.len() - 1) as OpId
        };
        let carried = |dur| OpSpec {
            layer: 1,
            ..OpSpec::compute(2, Phase::Other, NONE, dur)
        };
        let k0a = push(carried(5_000));
        let k0b = push(carried(45_000));
        let sync = push(OpSpec::new(OpKind::CpuOther, Phase::Fw, 1, 20_000));
        let mut launch = OpSpec::new(OpKind::Launch, Phase::Fw, 1, 5_000);
        launch.gap_ns = 30_000;
        let launch = push(launch);
        let k1 = push(OpSpec::compute(2, Phase::Fw, NONE, 60_000));
        let end = push(OpSpec {
            layer: 0,
            ..OpSpec::new(OpKind::Gap, Phase::Other, 1, 0)
        });
        g.edges = vec![
            (k0a, k0b),
            (k0a, sync),
            (sync, launch),
            (launch, k1),
            (k0b, k1),
            (launch, end),
        ];
        j
    }

    #[test]
    fn a_wait_for_carried_work_waits_for_the_previous_step_s_tail() {
        // As recorded: the sync ends at 25, the step at 60; the step's own kernel runs 50–110.
        let j = carried_job();
        let r = crate::replay::replay(&j.expand().unwrap());
        assert_eq!(
            (r.end_ns[2], r.end_ns[5], r.end_ns[4]),
            (25_000, 60_000, 110_000)
        );
        // In the copies after the first the carried kernels are the previous copy's own, so
        // the sync waits for its whole tail: 85 µs a step on the host thread, above the
        // recorded 60 (the reports then say which device sets the pace:
        // `cli::traceinfo::period_gap`).
        let s = steady(&j).unwrap();
        assert_eq!(s.period_ns, 85_000);
        assert!(matches!(s.by, DeviceKind::CpuThread { .. }), "{:?}", s.by);
    }

    #[test]
    fn host_bound_step_period_is_the_host_s() {
        // 10 µs launch, 100 µs step, 50 µs kernel: the GPU idles; the period is the step.
        let s = steady(&job(10_000, 100_000, 50_000)).unwrap();
        assert_eq!(s.period_ns, 100_000);
        assert!(matches!(s.by, DeviceKind::CpuThread { .. }));
    }

    #[test]
    fn gpu_bound_step_period_is_the_gpu_s() {
        // The kernel (250 µs) outlasts the 100 µs step: with nothing to hold the host back, the
        // GPU's backlog grows by 150 µs a step and the period is the GPU's 250 µs.
        let s = steady(&job(10_000, 100_000, 250_000)).unwrap();
        assert_eq!(s.period_ns, 250_000);
        assert!(matches!(s.by, DeviceKind::GpuStream { .. }));
        // A zoo job has no step end: no steady state of its own.
        let z = crate::passes::recompute::tests::chain(&[1000], &[0]);
        assert!(steady(&z).is_none());
    }
}
