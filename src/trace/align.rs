//! Clock alignment of rank traces (dPRO §4.2) as a quadratic program solved by clarabel.
//!
//! Each rank records on its own clock; rank r's true time is its recorded time plus an unknown
//! offset θ_r (θ of the first rank is 0: it is the reference). What ties the clocks together are the
//! collectives: a collective ends on every rank at about the same moment, after the last rank has
//! arrived, and the part of it after that moment — the data transfer, dPRO's RECV-family duration —
//! takes about equally long on every rank. For collective k with recorded start s_rk and end e_rk on
//! rank r, and m_k the (unknown) moment the last rank arrives:
//!
//! ```text
//! minimise   Σ_k Σ_r (D_rk − mean_j D_jk)²  +  w · Σ_hosts Σ_{r∈host} (θ_r − mean_{j∈host} θ_j)²
//! where      D_rk = e_rk + θ_r − m_k                      (transfer time of k seen on rank r)
//! subject to s_jk + θ_j ≤ m_k          for every rank j   (m_k is after every arrival)
//!            m_k ≤ e_rk + θ_r + tol    for every rank r   (no rank finishes before the last arrival)
//! ```
//!
//! The variance of D_rk over r does not depend on m_k, so the objective is a convex quadratic in θ
//! and the m_k only enter the constraints: the dependency constraints that rule out offsets under
//! which a collective would end before one of its ranks started it. The second term (ranks of one
//! host share a clock) is used only when hosts are given. `tol` absorbs the profiler's timestamp
//! noise (a few µs). Times are solved in µs around a coarse estimate (the median difference of
//! collective ends to the reference rank), which keeps the problem well conditioned for absolute
//! nanosecond timestamps.
//!
//! **Scale.** A variance Σ_r (x_r − x̄)² written out has a dense Hessian (I − 11ᵀ/n): (n−1)²
//! entries, 2 GB and minutes for 16,384 ranks. It equals min_u Σ_r (x_r − u)², so each variance
//! term gets its mean as a variable (u for the ranks, u_h per host): the Hessian becomes an arrow
//! with O(n) non-zeros, the constraints have O(nK), and the interior-point factorisation stays
//! linear in the ranks (`experiments/rank_scale.rs`: 16,384 ranks align in well under a second).
//! The minimiser in θ is the dense form's (a unit test compares them).

// Index loops below follow the formulas' subscripts (r ranks, c collectives).
#![allow(clippy::needless_range_loop)]

use clarabel::algebra::CscMatrix;
use clarabel::solver::{
    DefaultSettings, DefaultSolver, IPSolver, SolverStatus, SupportedConeT::NonnegativeConeT,
};

/// Why the offsets could not be estimated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AlignError {
    #[error("clock alignment needs at least one collective common to all ranks")]
    NoCollectives,
    #[error("rank {rank} has {got} collectives but rank 0 has {want}: they cannot be aligned")]
    Mismatch {
        rank: usize,
        got: usize,
        want: usize,
    },
    #[error("the clock-alignment QP could not be solved: {0}")]
    Solver(String),
}

/// Options of the alignment.
#[derive(Clone, Debug)]
pub struct AlignOptions {
    /// Host of each rank (ranks on one host share a clock); empty: every rank its own clock.
    pub hosts: Vec<u32>,
    /// Weight of the within-host offset variance.
    pub host_weight: f64,
    /// Timestamp noise tolerated in the dependency constraints (ns).
    pub tolerance_ns: f64,
}

impl Default for AlignOptions {
    fn default() -> Self {
        AlignOptions {
            hosts: Vec::new(),
            host_weight: 1.0,
            tolerance_ns: 5_000.0,
        }
    }
}

/// The estimated offsets.
#[derive(Clone, Debug, PartialEq)]
pub struct Alignment {
    /// θ_r in ns: add to rank r's recorded times to get the reference (rank 0's) clock.
    pub offsets_ns: Vec<i64>,
    /// Root-mean-square spread of the transfer durations D_rk around their per-collective mean,
    /// before (offsets 0) and after alignment (ns).
    pub spread_before_ns: f64,
    pub spread_after_ns: f64,
    /// Whether the dependency constraints were feasible (if not, the unconstrained least-squares
    /// solution is returned).
    pub constrained: bool,
}

/// RMS of e_rk + θ_r around the per-collective mean (the objective's first term, normalised).
fn spread(times: &[Vec<(i64, i64)>], theta: &[f64]) -> f64 {
    let n = times.len();
    let k = times[0].len();
    let mut sum = 0.0;
    for c in 0..k {
        let e: Vec<f64> = (0..n)
            .map(|r| (times[r][c].1 - times[0][c].1) as f64 + theta[r])
            .collect();
        let mean = e.iter().sum::<f64>() / n as f64;
        sum += e.iter().map(|x| (x - mean).powi(2)).sum::<f64>();
    }
    (sum / (n * k) as f64).sqrt()
}

/// A `rows` × `cols` CSC matrix from (row, col, value) triplets, duplicates summed.
fn csc(rows: usize, cols: usize, mut trip: Vec<(usize, usize, f64)>) -> CscMatrix<f64> {
    trip.sort_unstable_by_key(|&(r, c, _)| (c, r));
    let mut colptr = vec![0usize; cols + 1];
    let mut rowval = Vec::with_capacity(trip.len());
    let mut nzval: Vec<f64> = Vec::with_capacity(trip.len());
    let mut last = None;
    for (r, c, v) in trip {
        if last == Some((r, c)) {
            *nzval.last_mut().expect("a previous entry") += v;
            continue;
        }
        last = Some((r, c));
        rowval.push(r);
        nzval.push(v);
        colptr[c + 1] += 1;
    }
    for j in 0..cols {
        colptr[j + 1] += colptr[j];
    }
    CscMatrix::new(rows, cols, colptr, rowval, nzval)
}

/// The checked, shifted input of the alignment: one rank (nothing to align), or (ranks n,
/// collectives K, each rank's coarse offset in ns — the median over collectives of its end
/// against rank 0's —, and every collective's start and end in µs on the coarsely aligned
/// clocks, relative to rank 0's first end).
enum Shifted {
    One(Alignment),
    Many((usize, usize, Vec<i64>, Vec<Vec<f64>>, Vec<Vec<f64>>)),
}

fn shifted(times: &[Vec<(i64, i64)>]) -> Result<Shifted, AlignError> {
    let n = times.len();
    let Some(first) = times.first() else {
        return Err(AlignError::NoCollectives);
    };
    let k = first.len();
    if k == 0 {
        return Err(AlignError::NoCollectives);
    }
    for (r, t) in times.iter().enumerate() {
        if t.len() != k {
            return Err(AlignError::Mismatch {
                rank: r,
                got: t.len(),
                want: k,
            });
        }
    }
    if n == 1 {
        return Ok(Shifted::One(Alignment {
            offsets_ns: vec![0],
            spread_before_ns: 0.0,
            spread_after_ns: 0.0,
            constrained: true,
        }));
    }
    // Coarse estimate: median over collectives of (end on rank 0 − end on rank r).
    let coarse: Vec<i64> = (0..n)
        .map(|r| {
            let mut d: Vec<i64> = (0..k).map(|c| first[c].1 - times[r][c].1).collect();
            d.sort_unstable();
            d[k / 2]
        })
        .collect();
    // Shifted times in µs relative to rank 0's first collective end.
    let base = first[0].1;
    let us = |t: i64, r: usize| (t + coarse[r] - base) as f64 / 1e3;
    let s: Vec<Vec<f64>> = (0..n)
        .map(|r| (0..k).map(|c| us(times[r][c].0, r)).collect())
        .collect();
    let e: Vec<Vec<f64>> = (0..n)
        .map(|r| (0..k).map(|c| us(times[r][c].1, r)).collect())
        .collect();

    Ok(Shifted::Many((n, k, coarse, s, e)))
}

/// Estimate each rank's clock offset from matched collectives: `times[r][k]` = (start, end) of
/// the k-th collective on rank r, in ns on rank r's clock. The steps: coarse offsets and shifted
/// times (`shifted`), the objective (`objective`), the dependency constraints (`constraints`),
/// the solve with its unconstrained fallback (`solve`), the offsets and spreads (`alignment`).
pub fn align(times: &[Vec<(i64, i64)>], opts: &AlignOptions) -> Result<Alignment, AlignError> {
    let (n, k, coarse, s, e) = match shifted(times)? {
        Shifted::One(a) => return Ok(a),
        Shifted::Many(p) => p,
    };
    let dsum = centred_end_sums(&e);
    let (pm, q) = objective(n, k, &coarse, &dsum, opts);
    let (am, b) = constraints(&s, &e, opts.tolerance_ns, q.len());
    let (delta, constrained) = solve(&pm, &q, &am, &b, &dsum, k)?;
    Ok(alignment(times, &coarse, &delta, constrained))
}

/// Variable index of δ_r (r ≥ 1): the offsets come first in every formulation.
fn delta_var(r: usize) -> usize {
    r - 1
}

/// D_r = Σ_k (e_rk − mean_j e_jk): each rank's summed end against the per-collective mean (the
/// linear term of the variance; centred, so Σ_r D_r = 0).
fn centred_end_sums(e: &[Vec<f64>]) -> Vec<f64> {
    let n = e.len();
    let k = e[0].len();
    let nf = n as f64;
    let mut dsum = vec![0.0; n];
    for c in 0..k {
        let mean = (0..n).map(|r| e[r][c]).sum::<f64>() / nf;
        for r in 0..n {
            dsum[r] += e[r][c] - mean;
        }
    }
    dsum
}

/// The objective ½xᵀPx + qᵀx (P as its upper triangle in CSC).
///
/// Variables: δ_1..δ_{n−1} (µs, on top of the coarse offsets), m_1..m_K, the mean u of the δ,
/// then one mean u_h per host. The variance Σ_k ||C(d_k + δ)||² with C = I − 11ᵀ/n is
/// K·Σ_r (δ_r − δ̄)² + 2·Σ_r D_r δ_r + const (d_k is centred, D_r = Σ_k d_rk), and
/// Σ_r (δ_r − δ̄)² = min_u Σ_r (δ_r − u)²: with u a variable the Hessian is an arrow (2K on the
/// diagonal, −2K to u) instead of the dense (n−1)² block of I − J/n, and the same for each host's
/// mean. Same minimiser in δ; O(n + nK) non-zeros in all.
fn objective(
    n: usize,
    k: usize,
    coarse: &[i64],
    dsum: &[f64],
    opts: &AlignOptions,
) -> (CscMatrix<f64>, Vec<f64>) {
    let th = delta_var;
    let uvar = n - 1 + k;
    let mut hosts: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    if !opts.hosts.is_empty() && opts.hosts.len() == n {
        for (r, &h) in opts.hosts.iter().enumerate() {
            hosts.entry(h).or_default().push(r);
        }
    }
    let nv = uvar + 1 + hosts.len();
    let nf = n as f64;
    let kf = k as f64;
    // Upper triangle of P as (row, col, value), and q.
    let mut ptrip: Vec<(usize, usize, f64)> = Vec::with_capacity(3 * n + 2 * n);
    let mut q = vec![0.0; nv];
    for r in 1..n {
        ptrip.push((th(r), th(r), 2.0 * kf));
        ptrip.push((th(r), uvar, -2.0 * kf));
        q[th(r)] = 2.0 * dsum[r];
    }
    // δ_0 = 0 is in the mean too: (0 − u)² adds to u's diagonal.
    ptrip.push((uvar, uvar, 2.0 * kf * nf));
    let w = opts.host_weight;
    for (h, members) in hosts.values().enumerate() {
        // Σ_{r∈h} (θ_r − u_h)² with θ_r = coarse_r/1e3 + δ_r.
        let uh = uvar + 1 + h;
        for &r in members {
            let c = coarse[r] as f64 / 1e3;
            if r > 0 {
                ptrip.push((th(r), th(r), 2.0 * w));
                ptrip.push((th(r), uh, -2.0 * w));
                q[th(r)] += 2.0 * w * c;
            }
            q[uh] -= 2.0 * w * c;
        }
        ptrip.push((uh, uh, 2.0 * w * members.len() as f64));
    }
    (csc(nv, nv, ptrip), q)
}

/// The dependency constraints A x ≤ b over `nv` variables (δ_r then m_c first), from the shifted
/// starts `s` and ends `e` (µs): every rank arrives before m_c (s_rc + δ_r − m_c ≤ 0), and none
/// finishes before it (m_c − δ_r ≤ e_rc + tol).
fn constraints(
    s: &[Vec<f64>],
    e: &[Vec<f64>],
    tolerance_ns: f64,
    nv: usize,
) -> (CscMatrix<f64>, Vec<f64>) {
    let n = s.len();
    let k = s[0].len();
    let th = delta_var;
    let mvar = |c: usize| n - 1 + c;
    let tol = tolerance_ns / 1e3;
    let mut trip: Vec<(usize, usize, f64)> = Vec::with_capacity(4 * n * k);
    let mut b = Vec::with_capacity(2 * n * k);
    for c in 0..k {
        let mk = mvar(c);
        for r in 0..n {
            // s_rc + δ_r − m_c ≤ 0
            let row = b.len();
            if r > 0 {
                trip.push((row, th(r), 1.0));
            }
            trip.push((row, mk, -1.0));
            b.push(-s[r][c]);
            // m_c − δ_r ≤ e_rc + tol
            let row = b.len();
            trip.push((row, mk, 1.0));
            if r > 0 {
                trip.push((row, th(r), -1.0));
            }
            b.push(e[r][c] + tol);
        }
    }
    let rows = b.len();
    (csc(rows, nv, trip), b)
}

/// Solve the QP for δ (µs, δ_0 = 0) and say whether the constraints held; when they are
/// infeasible (timestamp noise beyond the tolerance), the unconstrained minimum
/// δ_r = −D_r/K up to a common shift.
fn solve(
    pm: &CscMatrix<f64>,
    q: &[f64],
    am: &CscMatrix<f64>,
    b: &[f64],
    dsum: &[f64],
    k: usize,
) -> Result<(Vec<f64>, bool), AlignError> {
    let n = dsum.len();
    let kf = k as f64;
    let cones = [NonnegativeConeT(b.len())];
    let settings = DefaultSettings {
        verbose: false,
        ..DefaultSettings::default()
    };
    let mut solver = DefaultSolver::new(pm, q, am, b, &cones, settings)
        .map_err(|e| AlignError::Solver(format!("{e:?}")))?;
    solver.solve();
    let status = solver.solution.status;
    Ok(match status {
        SolverStatus::Solved | SolverStatus::AlmostSolved => {
            let x = &solver.solution.x;
            let mut d = vec![0.0; n];
            for r in 1..n {
                d[r] = x[delta_var(r)];
            }
            (d, true)
        }
        SolverStatus::PrimalInfeasible | SolverStatus::AlmostPrimalInfeasible => {
            // Unconstrained minimum: δ_r = −D_r/K up to a common shift, δ_0 = 0.
            let mut d: Vec<f64> = dsum.iter().map(|v| -v / kf).collect();
            let d0 = d[0];
            for v in &mut d {
                *v -= d0;
            }
            (d, false)
        }
        other => return Err(AlignError::Solver(format!("{other:?}"))),
    })
}

/// The offsets (coarse + δ, ns) and the transfer spreads before and after them.
fn alignment(
    times: &[Vec<(i64, i64)>],
    coarse: &[i64],
    delta: &[f64],
    constrained: bool,
) -> Alignment {
    let n = times.len();
    let offsets_ns: Vec<i64> = (0..n)
        .map(|r| coarse[r] + (delta[r] * 1e3).round() as i64)
        .collect();
    let theta_after: Vec<f64> = offsets_ns.iter().map(|&o| o as f64).collect();
    Alignment {
        spread_before_ns: spread(times, &vec![0.0; n]),
        spread_after_ns: spread(times, &theta_after),
        offsets_ns,
        constrained,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Synthetic ranks: collective k ends at the same true time on every rank after the last
    /// arrival; each rank's clock is shifted by a known offset.
    fn synthetic(offsets: &[i64], k: usize) -> Vec<Vec<(i64, i64)>> {
        let n = offsets.len();
        (0..n)
            .map(|r| {
                (0..k)
                    .map(|c| {
                        let arrive = 1_000_000 * c as i64 + 37_000 * ((r * 7 + c * 3) % 5) as i64;
                        let last = (0..n)
                            .map(|j| 1_000_000 * c as i64 + 37_000 * ((j * 7 + c * 3) % 5) as i64)
                            .max()
                            .unwrap();
                        // Timestamp noise of ±1.5 µs that varies between collectives.
                        let end = last + 50_000 + (((r * 5 + c * 11) % 7) as i64 - 3) * 500;
                        (arrive - offsets[r], end - offsets[r])
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn recovers_known_offsets() {
        let truth = [0i64, 4_300_000, -2_750_000, 1_234_567, -4_999_000];
        let t = synthetic(&truth, 6);
        let a = align(&t, &AlignOptions::default()).unwrap();
        assert!(a.constrained);
        for r in 0..truth.len() {
            // The recovered offset maps rank r's clock back onto rank 0's (whose offset is 0).
            let err = (a.offsets_ns[r] - truth[r]).abs();
            assert!(
                err < 2_000,
                "rank {r}: {} vs {} ",
                a.offsets_ns[r],
                truth[r]
            );
        }
        assert!(a.spread_before_ns > 1e6);
        assert!(a.spread_after_ns < 2_000.0);
    }

    #[test]
    fn identical_clocks_give_zero_offsets() {
        let t = synthetic(&[0, 0, 0], 4);
        let a = align(&t, &AlignOptions::default()).unwrap();
        assert!(a.offsets_ns.iter().all(|o| o.abs() < 2_000), "{a:?}");
    }

    #[test]
    fn host_term_pulls_ranks_of_one_host_together() {
        // Two ranks on one host with one collective whose ends disagree by 10 µs: without the host
        // term the offset follows the ends; with a heavy host term it stays near 0.
        let t = vec![vec![(0, 100_000)], vec![(0, 90_000)]];
        let free = align(&t, &AlignOptions::default()).unwrap();
        assert!((free.offsets_ns[1] - 10_000).abs() < 100, "{free:?}");
        let tied = align(
            &t,
            &AlignOptions {
                hosts: vec![0, 0],
                host_weight: 100.0,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(tied.offsets_ns[1].abs() < 1_000, "{tied:?}");
    }

    /// The dense formulation this file had before issue 20 ((n−1)² Hessian), kept as the
    /// reference the sparse one must agree with.
    fn align_dense(
        times: &[Vec<(i64, i64)>],
        opts: &AlignOptions,
    ) -> Result<Alignment, AlignError> {
        let (n, k, coarse, s, e) = match shifted(times)? {
            Shifted::One(a) => return Ok(a),
            Shifted::Many(p) => p,
        };
        // Variables: δ_1..δ_{n−1} (µs, on top of the coarse offsets), then m_1..m_K.
        let nv = n - 1 + k;
        let th = |r: usize| r - 1; // variable index of δ_r, r ≥ 1
        // Objective: Σ_k ||d_k + C δ||² with C = (I − 11ᵀ/n) on columns 1..n−1 (δ_0 = 0), so
        // P = 2K·(I − J/n) and q = 2·Cᵀ Σ_k d_k, plus the host term.
        let mut p = vec![vec![0.0; n - 1]; n - 1];
        let mut q = vec![0.0; nv];
        let nf = n as f64;
        let kf = k as f64;
        for i in 0..n - 1 {
            for j in 0..n - 1 {
                p[i][j] = 2.0 * kf * (if i == j { 1.0 } else { 0.0 } - 1.0 / nf);
            }
        }
        let dsum = centred_end_sums(&e);
        // (Cᵀ D)_i = D_{i} − mean(D) = D_i (D is centred).
        for r in 1..n {
            q[th(r)] = 2.0 * dsum[r];
        }
        if !opts.hosts.is_empty() && opts.hosts.len() == n {
            let mut hosts: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
            for (r, &h) in opts.hosts.iter().enumerate() {
                hosts.entry(h).or_default().push(r);
            }
            let w = opts.host_weight;
            for members in hosts.values() {
                let m = members.len() as f64;
                // Σ_{r∈h} (θ_r − mean θ)², θ_r = coarse_r/1e3 + δ_r.
                let c: Vec<f64> = members.iter().map(|&r| coarse[r] as f64 / 1e3).collect();
                let cmean = c.iter().sum::<f64>() / m;
                for (a, &ra) in members.iter().enumerate() {
                    let lin = 2.0 * w * (c[a] - cmean);
                    if ra > 0 {
                        q[th(ra)] += lin;
                    }
                    for &rb in members {
                        if ra > 0 && rb > 0 {
                            let v = 2.0 * w * (if ra == rb { 1.0 } else { 0.0 } - 1.0 / m);
                            p[th(ra)][th(rb)] += v;
                        }
                    }
                }
            }
        }
        // Upper-triangular CSC of P (the m_k columns are empty).
        let mut colptr = vec![0usize];
        let mut rowval = Vec::new();
        let mut nzval = Vec::new();
        for j in 0..nv {
            if j < n - 1 {
                for (i, row) in p.iter().enumerate().take(j + 1) {
                    if row[j] != 0.0 {
                        rowval.push(i);
                        nzval.push(row[j]);
                    }
                }
            }
            colptr.push(rowval.len());
        }
        let pm = CscMatrix::new(nv, nv, colptr, rowval, nzval);

        let (am, b) = constraints(&s, &e, opts.tolerance_ns, nv);
        let (delta, constrained) = solve(&pm, &q, &am, &b, &dsum, k)?;
        Ok(alignment(times, &coarse, &delta, constrained))
    }

    /// The sparse QP (a mean variable per variance term) has the dense one's minimiser, with and
    /// without hosts, constrained or not.
    #[test]
    fn the_sparse_qp_finds_the_dense_qps_offsets() {
        let truth = [
            0i64, 4_300_000, -2_750_000, 1_234_567, -4_999_000, 77_000, -1_000_000,
        ];
        for (k, hosts) in [
            (6, vec![]),
            (3, vec![0, 0, 1, 1, 1, 2, 2]),
            (1, vec![0, 1, 0, 1, 0, 1, 0]),
        ] {
            let t = synthetic(&truth, k);
            for weight in [1.0, 50.0] {
                let opts = AlignOptions {
                    hosts: hosts.clone(),
                    host_weight: weight,
                    ..Default::default()
                };
                let (a, d) = (align(&t, &opts).unwrap(), align_dense(&t, &opts).unwrap());
                assert_eq!(a.constrained, d.constrained);
                for r in 0..truth.len() {
                    let diff = (a.offsets_ns[r] - d.offsets_ns[r]).abs();
                    assert!(
                        diff <= 20,
                        "k {k}, hosts {hosts:?}, rank {r}: {a:?} vs {d:?}"
                    );
                }
            }
        }
        // Infeasible constraints (a collective that ends before another rank starts it on
        // every offset): both fall back to the same least squares.
        // Collective 1 puts rank 1's offset within ±15 µs, collective 2 at least 85 µs.
        let t = vec![
            vec![(0, 10_000), (100_000, 110_000)],
            vec![(0, 10_000), (0, 10_000)],
        ];
        let (a, d) = (
            align(&t, &AlignOptions::default()).unwrap(),
            align_dense(&t, &AlignOptions::default()).unwrap(),
        );
        assert!(!d.constrained, "{d:?}");
        assert_eq!(
            (a.constrained, &a.offsets_ns),
            (d.constrained, &d.offsets_ns)
        );
    }

    #[test]
    fn refuses_empty_and_mismatched_input() {
        assert_eq!(
            align(&[], &AlignOptions::default()),
            Err(AlignError::NoCollectives)
        );
        assert_eq!(
            align(&[vec![(0, 1)], vec![]], &AlignOptions::default()),
            Err(AlignError::Mismatch {
                rank: 1,
                got: 0,
                want: 1
            })
        );
    }
}
