//! The op-heap engine's queue: a monotone radix queue of `(key, tag)` pairs (issue 28).
//!
//! The engine never pushes a key below the last one it popped (an op becomes ready when a
//! predecessor ends, which is no earlier than that predecessor left the queue), so the queue can
//! be a radix heap: an entry sits in the bucket of the highest bit where its key differs from the
//! last popped key, a push is one `leading_zeros` and one `Vec::push`, and a pop that finds no
//! entry at the last key empties the lowest non-empty bucket into lower ones. An entry moves down
//! a bucket at least per move, so at most 64 times, and in a replay typically once or twice.
//!
//! Entries at the last key itself are kept apart, in a binary heap by tag, because the engine's order at one
//! key is its tag order (class, then op). The pop order is exactly a binary min-heap's on
//! `(key, tag)` for every sequence of monotone pushes, which a proptest holds it to.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Bucket `i` holds the entries whose key first differs from `last` at bit `i`.
const BUCKETS: usize = 64;

pub(super) struct RadixQueue {
    /// The key of the latest pop: no entry is below it.
    last: u64,
    /// Tags of the entries whose key is `last`, least first (a heap: many ops can be released
    /// at one instant, by a zero-length op that fans out).
    now: BinaryHeap<Reverse<u64>>,
    buckets: [Vec<(u64, u64)>; BUCKETS],
    /// Bit `i` set when bucket `i` holds an entry.
    filled: u64,
}

impl RadixQueue {
    pub(super) fn new() -> Self {
        RadixQueue {
            last: 0,
            now: BinaryHeap::new(),
            buckets: std::array::from_fn(|_| Vec::new()),
            filled: 0,
        }
    }

    /// Queue `(key, tag)`; `key` must be no less than the last popped key.
    #[inline]
    pub(super) fn push(&mut self, key: u64, tag: u64) {
        debug_assert!(
            key >= self.last,
            "a monotone queue: {key} after {}",
            self.last
        );
        if key == self.last {
            self.now.push(Reverse(tag));
        } else {
            let b = bucket(key, self.last);
            self.buckets[b].push((key, tag));
            self.filled |= 1 << b;
        }
    }

    /// The least `(key, tag)`, removed.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<(u64, u64)> {
        if let Some(Reverse(tag)) = self.now.pop() {
            return Some((self.last, tag));
        }
        if self.filled == 0 {
            return None;
        }
        self.refill();
        self.now.pop().map(|Reverse(tag)| (self.last, tag))
    }

    /// `now` is empty: the lowest filled bucket's least key becomes `last`, its entries at that
    /// key move to `now` and the others to lower buckets.
    fn refill(&mut self) {
        let b = self.filled.trailing_zeros() as usize;
        self.filled &= !(1 << b);
        let mut moved = std::mem::take(&mut self.buckets[b]);
        let least = moved.iter().map(|e| e.0).min().unwrap_or(self.last);
        self.last = least;
        for &(key, tag) in &moved {
            if key == least {
                self.now.push(Reverse(tag));
            } else {
                let to = bucket(key, least);
                self.buckets[to].push((key, tag));
                self.filled |= 1 << to;
            }
        }
        moved.clear();
        self.buckets[b] = moved;
    }
}

/// The bucket of `key` (> `last`): its highest bit that differs from `last`.
#[inline]
fn bucket(key: u64, last: u64) -> usize {
    (63 - (key ^ last).leading_zeros()) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Pushes at or above the last popped key (a step above it, with ties and repeated tags
        /// at one key) and pops: the queue pops what a binary min-heap on (key, tag) pops.
        #[test]
        fn pops_as_a_binary_heap_does(
            steps in proptest::collection::vec(
                proptest::option::of((0u64..4, prop_oneof![0u64..3, 0u64..1 << 40], 0u64..64)),
                0..400,
            )
        ) {
            let mut q = RadixQueue::new();
            let mut want: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
            let mut last = 0u64;
            let mut n = 0u64;
            for step in steps {
                match step {
                    Some((shape, up, tag)) => {
                        // Distinct entries, as the engine's are: the tag's low bits count pushes.
                        let tag = tag << 32 | n;
                        n += 1;
                        let key = if shape == 0 { last } else { last + up };
                        q.push(key, tag);
                        want.push(Reverse((key, tag)));
                    }
                    None => {
                        let got = q.pop();
                        prop_assert_eq!(got, want.pop().map(|Reverse(x)| x));
                        if let Some((k, _)) = got {
                            last = k;
                        }
                    }
                }
            }
            while let Some(Reverse(x)) = want.pop() {
                prop_assert_eq!(q.pop(), Some(x));
            }
            prop_assert_eq!(q.pop(), None);
        }
    }
}
