//! Hand-computed replays: every expected time below was worked out on paper from the semantics
//! in the module docs.

use super::*;
use crate::cost::comm::AlphaBeta;
use crate::cost::config::SyncScheme;
use crate::graph::comm::{CommCost, CommSpec, CommTopology};
use crate::graph::{DeviceKind, DfgBuilder, OpKind, OpSpec, Phase};

fn op(b: &mut DfgBuilder, dev: u32, dur: u64) -> OpId {
    b.add_op(OpSpec::new(OpKind::Compute, Phase::Fw, dev, dur))
}

fn gpu(b: &mut DfgBuilder, w: u32) -> u32 {
    b.add_device(DeviceKind::GpuStream {
        worker: w,
        stream: 0,
    })
}

/// Replay `g` and compare (start, end) of every op.
fn check(g: &Dfg, expect: &[(u64, u64)], iteration: u64) -> Replay {
    let r = replay(g);
    let got: Vec<(u64, u64)> = r
        .start_ns
        .iter()
        .copied()
        .zip(r.end_ns.iter().copied())
        .collect();
    assert_eq!(got, expect);
    assert_eq!(r.iteration_ns, iteration);
    r
}

#[test]
fn cpu_launches_feed_a_gpu_stream() {
    let mut b = DfgBuilder::new();
    let cpu = b.add_device(DeviceKind::CpuThread {
        worker: 0,
        thread: 0,
    });
    let g0 = gpu(&mut b, 0);
    let l1 = b.add_op(OpSpec::new(OpKind::Launch, Phase::Fw, cpu, 5));
    let l2 = b.add_op(OpSpec::new(OpKind::Launch, Phase::Fw, cpu, 5));
    let k1 = op(&mut b, g0, 10);
    let k2 = op(&mut b, g0, 10);
    b.add_edge(l1, k1);
    b.add_edge(l2, k2);
    b.add_edge(l1, l2);
    let g = b.build().unwrap();
    let r = check(&g, &[(0, 5), (5, 10), (5, 15), (15, 25)], 25);
    assert_eq!(r.device_busy_ns, vec![10, 20]);
    // K2 waited for the stream (K1), not for its launch.
    assert_eq!(critical_path(&g, &r).ops, vec![l1, k1, k2]);
    assert_eq!(dependency_bound_ns(&g), 20);
}

#[test]
fn diamond_on_two_devices() {
    let mut b = DfgBuilder::new();
    let d1 = gpu(&mut b, 0);
    let d2 = gpu(&mut b, 1);
    let a = op(&mut b, d1, 2);
    let bb = op(&mut b, d1, 3);
    let c = op(&mut b, d2, 5);
    let d = op(&mut b, d1, 1);
    for (x, y) in [(a, bb), (a, c), (bb, d), (c, d)] {
        b.add_edge(x, y);
    }
    let g = b.build().unwrap();
    let r = check(&g, &[(0, 2), (2, 5), (2, 7), (7, 8)], 8);
    assert_eq!(critical_path(&g, &r).ops, vec![a, c, d]);
    assert_eq!(dependency_bound_ns(&g), 8);
}

#[test]
fn diamond_on_one_device_serialises_in_id_order() {
    let mut b = DfgBuilder::new();
    let d1 = gpu(&mut b, 0);
    let a = op(&mut b, d1, 2);
    let bb = op(&mut b, d1, 3);
    let c = op(&mut b, d1, 5);
    let d = op(&mut b, d1, 1);
    for (x, y) in [(a, bb), (a, c), (bb, d), (c, d)] {
        b.add_edge(x, y);
    }
    let g = b.build().unwrap();
    let r = check(&g, &[(0, 2), (2, 5), (5, 10), (10, 11)], 11);
    // C started when B freed the device; D waited for C.
    assert_eq!(critical_path(&g, &r).ops, vec![a, bb, c, d]);
    assert_eq!(dependency_bound_ns(&g), 8);
}

#[test]
fn gaps_keep_the_device_busy() {
    let mut b = DfgBuilder::new();
    let cpu = b.add_device(DeviceKind::CpuThread {
        worker: 0,
        thread: 0,
    });
    b.add_op(OpSpec {
        gap_ns: 2,
        ..OpSpec::new(OpKind::CpuOther, Phase::Fw, cpu, 3)
    });
    b.add_op(OpSpec::new(OpKind::CpuOther, Phase::Fw, cpu, 1));
    let g = b.build().unwrap();
    check(&g, &[(0, 3), (5, 6)], 6);
}

#[test]
fn priority_picks_among_ready_ops_only() {
    let mut b = DfgBuilder::new();
    let d = gpu(&mut b, 0);
    let first = op(&mut b, d, 10);
    let low = op(&mut b, d, 1);
    let high = b.add_op(OpSpec {
        priority: -1,
        ..OpSpec::new(OpKind::Compute, Phase::Fw, d, 1)
    });
    let late = b.add_op(OpSpec {
        priority: -5,
        ..OpSpec::new(OpKind::Compute, Phase::Fw, d, 1)
    });
    let other = gpu(&mut b, 1);
    let gate = op(&mut b, other, 20);
    b.add_edge(gate, late);
    b.add_edge(first, low);
    b.add_edge(first, high);
    let g = b.build().unwrap();
    // At 10 both `low` and `high` are ready: `high` (priority -1) goes first; `late` has the
    // best priority but is not ready until 20.
    check(&g, &[(0, 10), (11, 12), (10, 11), (20, 21), (0, 20)], 21);
}

#[test]
fn virtual_ops_take_no_device() {
    let mut b = DfgBuilder::new();
    let d = gpu(&mut b, 0);
    let v = b.add_device(DeviceKind::Virtual);
    let a = op(&mut b, d, 4);
    let o1 = b.add_op(OpSpec::new(OpKind::Out, Phase::Comm, v, 0));
    let o2 = b.add_op(OpSpec::new(OpKind::Out, Phase::Comm, v, 0));
    let c = op(&mut b, d, 1);
    b.add_edge(a, o1);
    b.add_edge(a, o2);
    b.add_edge(o2, c);
    let g = b.build().unwrap();
    let r = check(&g, &[(0, 4), (4, 4), (4, 4), (4, 5)], 5);
    assert_eq!(critical_path(&g, &r).ops, vec![a, o2, c]);
}

fn ring_spec(scheme: SyncScheme) -> CommSpec {
    let link = AlphaBeta {
        alpha_ns: 1000.0,
        bytes_per_ns: 1.0,
    };
    CommSpec {
        scheme,
        gpus_per_node: 8,
        nodes: 1,
        ps_servers: 2,
        cost: CommCost {
            intra: link,
            inter: link,
            aggregate_bytes_per_ns: 10.0,
        },
    }
}

/// `n` workers, each with one gradient op of `grad_ns[w]` and one tensor of `bytes`.
fn one_tensor(n: u32, grad_ns: &[u64], bytes: u64, scheme: SyncScheme) -> Dfg {
    let mut b = DfgBuilder::new();
    let v = b.add_device(DeviceKind::Virtual);
    let streams: Vec<u32> = (0..n)
        .map(|w| b.add_device(DeviceKind::CommStream { worker: w }))
        .collect();
    let gpus: Vec<u32> = (0..n).map(|w| gpu(&mut b, w)).collect();
    let mut topo = CommTopology::new(&mut b, &ring_spec(scheme), streams);
    let grads: Vec<OpId> = (0..n as usize)
        .map(|w| op(&mut b, gpus[w], grad_ns[w]))
        .collect();
    let done: Vec<OpId> = (0..n)
        .map(|_| b.add_op(OpSpec::new(OpKind::In, Phase::Comm, v, 0)))
        .collect();
    topo.allreduce(&mut b, 0, bytes, &grads, &done);
    b.build().unwrap()
}

#[test]
fn ring_allreduce_on_four_workers() {
    // Chunk 1000 B: a step is 1000 ns + 1000 B / (1 B/ns) = 2000 ns; 6 steps.
    let g = one_tensor(4, &[0, 0, 0, 0], 4000, SyncScheme::Ring);
    assert_eq!(g.op_count(), 4 + 4 + 4 * 6 * 2);
    assert_eq!(replay(&g).iteration_ns, 12_000);
}

#[test]
fn ring_allreduce_waits_for_the_slowest_gradient() {
    // Worker 2's gradient ends at 500: its link is 500 ns late in step 0 and paces step 1 for
    // itself and worker 3; from step 2 on every hop waits for a late neighbour, so the whole ring
    // ends 500 ns late (steps end at 2000/2500, 4000/4500, 6500, 8500, 10500, 12500).
    let g = one_tensor(4, &[0, 0, 500, 0], 4000, SyncScheme::Ring);
    let r = replay(&g);
    assert_eq!(r.iteration_ns, 12_500);
    // The critical path starts at worker 2's gradient (op 2: gradients are ops 0–3).
    let cp = critical_path(&g, &r);
    assert_eq!(cp.ops[0], 2, "{cp:?}");
}

#[test]
fn tree_allreduce_on_four_workers() {
    // Tree 0 <- 1, 0 <- 2, 1 <- 3; a message is 1000 + 4000 = 5000 ns. Up: 3→1 (0–5000), then
    // 1→0 (5000–10000) while 2→0 runs 0–5000 on its own link; down: 0→1 and 0→2 (10000–15000),
    // then 1→3 (15000–20000).
    let g = one_tensor(4, &[0, 0, 0, 0], 4000, SyncScheme::Tree);
    assert_eq!(replay(&g).iteration_ns, 20_000);
}

#[test]
fn ps_push_aggregate_pull() {
    // 2 servers, shard 2000 B: a push or pull is 1000 + 2000 = 3000 ns. Each worker's NIC sends
    // its pushes to server 0 then 1: 0–3000, 3000–6000. Server 0 aggregates 2 × 2000 B at 10 B/ns
    // = 400 ns once both pushes are in (3000–3400), then pulls to worker 0 and 1 on its NIC:
    // 3400–6400, 6400–9400. Server 1: pushes in at 6000, aggregate 6000–6400, pulls 6400–12400.
    let g = one_tensor(2, &[0, 0], 4000, SyncScheme::Ps);
    assert_eq!(replay(&g).iteration_ns, 12_400);
}

#[test]
fn partial_replay_of_a_sub_graph_uses_base_end_times() {
    let g = one_tensor(4, &[0, 0, 500, 0], 4000, SyncScheme::Ring);
    let full = replay(&g);
    // The communication ops alone, released at the gradients' ends, take what they took in the
    // full replay.
    let comm: Vec<OpId> = (0..g.op_count() as OpId)
        .filter(|&o| g.kind(o).is_comm())
        .collect();
    let part = partial_replay(&g, &comm, Some(&full));
    assert_eq!(part.first_start_ns, 0);
    assert_eq!(part.replay.iteration_ns, 12_500);
    for (i, &o) in part.ops.iter().enumerate() {
        assert_eq!(part.replay.start_ns[i], full.start_ns[o as usize]);
    }
    // Without a base every op outside is taken as done at 0: the ring takes 12 µs.
    assert_eq!(partial_replay(&g, &comm, None).span_ns(), 12_000);
}

#[test]
fn memory_peaks_between_forward_and_backward() {
    let mut b = DfgBuilder::new();
    let d = gpu(&mut b, 0);
    let fw1 = op(&mut b, d, 1);
    let fw2 = op(&mut b, d, 1);
    let bw2 = op(&mut b, d, 1);
    let bw1 = op(&mut b, d, 1);
    for (x, y) in [(fw1, fw2), (fw2, bw2), (bw2, bw1)] {
        b.add_edge(x, y);
    }
    use crate::graph::{MemEffect, MemWhen};
    for (o, bytes, when) in [
        (fw1, 100, MemWhen::AllocAtStart),
        (fw2, 50, MemWhen::AllocAtStart),
        (bw2, 50, MemWhen::FreeAtEnd),
        (bw1, 100, MemWhen::FreeAtEnd),
        // A workspace allocated by bw1 exactly when bw2's buffer is freed reuses it.
        (bw1, 50, MemWhen::AllocAtStart),
    ] {
        b.add_mem(MemEffect {
            op: o,
            worker: 0,
            bytes,
            when,
        });
    }
    b.set_static_memory(0, 1000);
    let g = b.build().unwrap();
    let r = replay(&g);
    let m = peak_memory(&g, &r);
    assert_eq!(m.peak_bytes, 1150);
    assert_eq!(m.peak_at_ns, 1);
}

/// Issue 20, class 7: memory follows dependencies, not timestamps. The same chain as
/// `memory_peaks_between_forward_and_backward` with every duration 0 (what a pass that scales
/// durations to 0 makes): every event is at t = 0, and the peak is still the forward's
/// activations on top of the static memory, because each free comes after the allocation it
/// depends on. (Sorted by time then free-before-alloc, the frees of bw2 and bw1 came first and
/// the peak fell to the static 1,000 bytes plus the workspace.) Numbering the ops against the
/// dependency order changes nothing.
#[test]
fn memory_follows_dependencies_when_ops_take_no_time() {
    use crate::graph::{MemEffect, MemWhen};
    for reversed in [false, true] {
        let mut b = DfgBuilder::new();
        let d = gpu(&mut b, 0);
        let ids: Vec<OpId> = (0..4).map(|_| op(&mut b, d, 0)).collect();
        // fw1 → fw2 → bw2 → bw1, numbered in that order or backwards.
        let [fw1, fw2, bw2, bw1] = if reversed {
            [ids[3], ids[2], ids[1], ids[0]]
        } else {
            [ids[0], ids[1], ids[2], ids[3]]
        };
        for (x, y) in [(fw1, fw2), (fw2, bw2), (bw2, bw1)] {
            b.add_edge(x, y);
        }
        for (o, bytes, when) in [
            (fw1, 100, MemWhen::AllocAtStart),
            (fw2, 50, MemWhen::AllocAtStart),
            (bw2, 50, MemWhen::FreeAtEnd),
            (bw1, 100, MemWhen::FreeAtEnd),
            (bw1, 50, MemWhen::AllocAtStart),
        ] {
            b.add_mem(MemEffect {
                op: o,
                worker: 0,
                bytes,
                when,
            });
        }
        b.set_static_memory(0, 1000);
        let g = b.build().unwrap();
        let r = replay(&g);
        assert_eq!(r.iteration_ns, 0);
        let m = peak_memory(&g, &r);
        assert_eq!(m.peak_bytes, 1150, "reversed ids: {reversed}");
    }
}

/// Issue 28: `peak_memory` sums one worker's events at a time. Whether the workers' ops (and so
/// their memory effects, which the graph keeps in op order) come worker by worker, as every
/// expanded job numbers them, or interleaved (the path that buckets effects by worker), each
/// worker's peak is its own chain's: worker 0 holds 1,000 static bytes and peaks at 1,150 on top
/// of its forward's 100 + 50; worker 1 holds 10 and peaks at 10 + 300 + 7.
#[test]
fn peak_memory_is_per_worker_whatever_the_order_of_effects() {
    use crate::graph::{MemEffect, MemWhen};
    for interleaved in [false, true] {
        let mut b = DfgBuilder::new();
        let devs = [gpu(&mut b, 0), gpu(&mut b, 1)];
        // chains[w] = worker w's fw1, fw2, bw2, bw1.
        let mut chains: [Vec<OpId>; 2] = Default::default();
        if interleaved {
            for _ in 0..4 {
                for w in [1, 0] {
                    chains[w].push(op(&mut b, devs[w], 1));
                }
            }
        } else {
            for w in 0..2 {
                chains[w] = (0..4).map(|_| op(&mut b, devs[w], 1)).collect();
            }
        }
        for (w, (big, small)) in [(100u64, 50u64), (300, 7)].into_iter().enumerate() {
            let c = &chains[w];
            for k in 0..3 {
                b.add_edge(c[k], c[k + 1]);
            }
            for (o, bytes, when) in [
                (c[0], big, MemWhen::AllocAtStart),
                (c[1], small, MemWhen::AllocAtStart),
                (c[2], small, MemWhen::FreeAtEnd),
                (c[3], big, MemWhen::FreeAtEnd),
            ] {
                b.add_mem(MemEffect {
                    op: o,
                    worker: w as u32,
                    bytes,
                    when,
                });
            }
        }
        b.set_workers(2);
        b.set_static_memory(0, 1000);
        b.set_static_memory(1, 10);
        let g = b.build().unwrap();
        let workers: Vec<u32> = g.mem_effects().iter().map(|m| m.worker).collect();
        assert_eq!(workers.is_sorted(), !interleaved, "{workers:?}");
        let m = peak_memory(&g, &replay(&g));
        assert_eq!(
            m.per_worker_bytes,
            vec![1150, 317],
            "interleaved: {interleaved}"
        );
        assert_eq!((m.peak_worker, m.peak_bytes, m.peak_at_ns), (0, 1150, 1));
    }
}

/// The device engine with release times, whatever the graph's priorities (the oracle of the
/// op-heap engine).
fn by_device(g: &Dfg, release: Option<&[u64]>) -> Replay {
    Engine::new(g, release).run()
}

mod engines_agree {
    use super::*;
    use proptest::prelude::*;

    /// A random graph on `workers` workers: GPU streams, communication streams and links created
    /// in a shuffled order (device ids decide ties), ops of few distinct durations (many ties),
    /// gaps, edges from lower to higher ids, and a contention rate. Ops on real devices take at
    /// least 1 ns: with zero-length ones the device engine can pick an op at an instant before
    /// another, ready at that same instant, is released, and runs them in release order where
    /// the op-heap engine runs them in order of readiness.
    fn graph(
        workers: u32,
        device_order: &[usize],
        ops: &[(usize, u8, u64, u64)],
        edges: &[(usize, usize)],
        ppm: u32,
    ) -> Option<Dfg> {
        let mut b = DfgBuilder::new();
        let mut kinds = vec![DeviceKind::Virtual];
        for w in 0..workers {
            kinds.push(DeviceKind::GpuStream {
                worker: w,
                stream: 0,
            });
            kinds.push(DeviceKind::GpuStream {
                worker: w,
                stream: 1,
            });
            kinds.push(DeviceKind::CommStream { worker: w });
            kinds.push(DeviceKind::Link {
                from: w,
                to: (w + 1) % workers,
                class: crate::graph::LinkClass::IntraNode,
            });
        }
        let mut devices = Vec::with_capacity(kinds.len());
        let mut order: Vec<usize> = (0..kinds.len()).collect();
        for (i, &j) in device_order.iter().enumerate() {
            let n = order.len();
            order.swap(i % n, j % n);
        }
        let mut id = vec![0; kinds.len()];
        for &k in &order {
            id[k] = b.add_device(kinds[k]);
            devices.push(k);
        }
        b.set_workers(workers);
        b.set_contention_ppm(ppm);
        for &(dev, kind, dur, gap) in ops {
            let k = dev % kinds.len();
            let mut spec = if kinds[k] == DeviceKind::Virtual {
                OpSpec::new(OpKind::In, Phase::Comm, id[k], 0)
            } else {
                let kind = [OpKind::Compute, OpKind::Send, OpKind::Recv, OpKind::Memcpy]
                    [kind as usize % 4];
                OpSpec::new(kind, Phase::Fw, id[k], dur)
            };
            spec.gap_ns = gap;
            b.add_op(spec);
        }
        for &(a, c) in edges {
            let (a, c) = (a % ops.len(), c % ops.len());
            if a < c {
                b.add_edge(a as OpId, c as OpId);
            }
        }
        b.build().ok()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Where no op has a priority the op-heap engine is the device engine, op for op:
        /// starts, ends, binding ops, busy times, including contention and its ties.
        #[test]
        fn op_heap_engine_is_the_device_engine(
            workers in 1u32..4,
            device_order in proptest::collection::vec(0usize..16, 0..16),
            ops in proptest::collection::vec(
                (
                    0usize..64,
                    0u8..4,
                    prop_oneof![Just(1u64), Just(2), Just(5), 1u64..40],
                    prop_oneof![4 => Just(0u64), 1 => 0u64..3],
                ),
                1..80,
            ),
            edges in proptest::collection::vec((0usize..80, 0usize..80), 0..160),
            ppm in prop_oneof![Just(0u32), Just(33_000), Just(1_000_000)],
            release in proptest::option::of(proptest::collection::vec(0u64..30, 80)),
        ) {
            let Some(g) = graph(workers, &device_order, &ops, &edges, ppm) else {
                return Ok(());
            };
            let release = release.map(|r| r[..g.op_count()].to_vec());
            prop_assert_eq!(
                ordered::replay(&g, release.as_deref()),
                by_device(&g, release.as_deref())
            );
        }
    }

    /// The same on the planner's graphs: BERT-base on the 16-V100 testbed (contention on),
    /// ResNet-50 with tensor fusion's buckets, and a GPT on H100s.
    #[test]
    fn op_heap_engine_is_the_device_engine_on_zoo_graphs() {
        use crate::cost::config::load_cluster;
        use crate::zoo::{BuildOptions, ModelOptions, build, model};
        for (m, c) in [
            ("bert-base", "dpro-16xv100-rdma"),
            ("resnet50", "8xv100"),
            ("gpt", "64xh100-ib"),
        ] {
            let cluster = load_cluster(c).unwrap();
            let g = build(
                &model(m, &ModelOptions::default()).unwrap(),
                &cluster,
                &BuildOptions::default(),
            )
            .unwrap();
            assert!(g.priorities().iter().all(|&p| p == 0));
            assert_eq!(ordered::replay(&g, None), by_device(&g, None), "{m} on {c}");
        }
    }
}
