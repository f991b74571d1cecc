//! The replayer's queue of devices: each device with work at most once, keyed by the earliest
//! start of its next op, ties broken by the lower device id.
//!
//! An indexed 4-ary min-heap: every device knows its slot, so a device whose key moves (an op
//! became ready earlier, or the device ran one and its clock advanced) is moved in place instead
//! of pushed again. The heap never holds a stale entry, so it holds at most one entry per device,
//! and the device that just ran an op and starts the next one first stays at the root after one
//! sift (the fast path of a busy stream).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::graph::OpId;

/// One device's ready ops by (ready time, op id). The least is kept apart from the heap of the
/// others: most devices hold one or two ready ops, and a device with one never touches the heap.
#[derive(Default)]
pub(super) struct Pending {
    head: Option<(u64, OpId)>,
    rest: BinaryHeap<Reverse<(u64, OpId)>>,
}

impl Pending {
    #[inline]
    pub(super) fn push(&mut self, item: (u64, OpId)) {
        match self.head {
            None => self.head = Some(item),
            Some(h) if item < h => {
                self.rest.push(Reverse(h));
                self.head = Some(item);
            }
            Some(_) => self.rest.push(Reverse(item)),
        }
    }

    #[inline]
    pub(super) fn peek(&self) -> Option<(u64, OpId)> {
        self.head
    }

    #[inline]
    pub(super) fn pop(&mut self) -> Option<(u64, OpId)> {
        let h = self.head.take()?;
        self.head = self.rest.pop().map(|Reverse(x)| x);
        Some(h)
    }
}

/// Slot of a device that is not in the heap.
const ABSENT: u32 = u32::MAX;
/// Children per node.
const ARITY: usize = 4;

/// Indexed min-heap of `(key, device)`.
pub(super) struct DeviceHeap {
    /// `(key, device)`, heap-ordered.
    slots: Vec<(u64, u32)>,
    /// Each device's index in `slots`, or [`ABSENT`].
    pos: Vec<u32>,
}

impl DeviceHeap {
    pub(super) fn new(devices: usize) -> Self {
        DeviceHeap {
            slots: Vec::with_capacity(devices),
            pos: vec![ABSENT; devices],
        }
    }

    /// The device with the lowest `(key, device)`.
    #[inline]
    pub(super) fn peek(&self) -> Option<(u64, u32)> {
        self.slots.first().copied()
    }

    /// The device's key, if it is in the heap.
    #[cfg(test)]
    pub(super) fn key(&self, d: u32) -> Option<u64> {
        match self.pos[d as usize] {
            ABSENT => None,
            i => Some(self.slots[i as usize].0),
        }
    }

    /// Put the device in the heap with `key`, or move it there.
    #[inline]
    pub(super) fn set(&mut self, d: u32, key: u64) {
        let i = self.pos[d as usize];
        if i == ABSENT {
            let at = self.slots.len();
            self.slots.push((key, d));
            self.pos[d as usize] = at as u32;
            self.sift_up(at);
            return;
        }
        let i = i as usize;
        let old = self.slots[i].0;
        self.slots[i].0 = key;
        if key < old {
            self.sift_up(i);
        } else if key > old {
            self.sift_down(i);
        }
    }

    /// Take the device out of the heap (no-op when it is not in it).
    #[inline]
    pub(super) fn remove(&mut self, d: u32) {
        let i = self.pos[d as usize];
        if i == ABSENT {
            return;
        }
        self.pos[d as usize] = ABSENT;
        let i = i as usize;
        let last = self.slots.pop().expect("a device in the heap");
        if i == self.slots.len() {
            return;
        }
        let old = self.slots[i];
        self.slots[i] = last;
        self.pos[last.1 as usize] = i as u32;
        if last < old {
            self.sift_up(i);
        } else {
            self.sift_down(i);
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        let item = self.slots[i];
        while i > 0 {
            let parent = (i - 1) / ARITY;
            let p = self.slots[parent];
            if p <= item {
                break;
            }
            self.slots[i] = p;
            self.pos[p.1 as usize] = i as u32;
            i = parent;
        }
        self.slots[i] = item;
        self.pos[item.1 as usize] = i as u32;
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.slots.len();
        let item = self.slots[i];
        loop {
            let first = i * ARITY + 1;
            if first >= n {
                break;
            }
            let mut best = first;
            let mut best_item = self.slots[first];
            for c in first + 1..(first + ARITY).min(n) {
                let s = self.slots[c];
                if s < best_item {
                    best = c;
                    best_item = s;
                }
            }
            if item <= best_item {
                break;
            }
            self.slots[i] = best_item;
            self.pos[best_item.1 as usize] = i as u32;
            i = best;
        }
        self.slots[i] = item;
        self.pos[item.1 as usize] = i as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any sequence of sets and removes leaves the heap agreeing with a sorted reference.
        #[test]
        fn agrees_with_a_sorted_reference(
            steps in proptest::collection::vec((0u32..12, 0u64..20, any::<bool>()), 0..200)
        ) {
            let mut h = DeviceHeap::new(12);
            let mut want: std::collections::BTreeMap<u32, u64> = Default::default();
            for (d, key, remove) in steps {
                if remove {
                    h.remove(d);
                    want.remove(&d);
                } else {
                    h.set(d, key);
                    want.insert(d, key);
                }
                let best = want.iter().map(|(&d, &k)| (k, d)).min();
                prop_assert_eq!(h.peek(), best);
                for d in 0..12 {
                    prop_assert_eq!(h.key(d), want.get(&d).copied());
                }
            }
        }

        /// Pending pops in (ready, op) order whatever the order of its pushes and pops.
        #[test]
        fn pending_pops_in_order(steps in proptest::collection::vec(proptest::option::of((0u64..20, 0u32..50)), 0..200)) {
            let mut p = Pending::default();
            let mut want: Vec<(u64, u32)> = Vec::new();
            for step in steps {
                match step {
                    Some(item) => {
                        p.push(item);
                        want.push(item);
                        want.sort_unstable();
                    }
                    None => {
                        let least = (!want.is_empty()).then(|| want.remove(0));
                        prop_assert_eq!(p.pop(), least);
                    }
                }
                prop_assert_eq!(p.peek(), want.first().copied());
            }
        }
    }
}
