//! Walker/Vose alias table: a weighted choice in O(1) from one 64-bit draw.

/// For each column `i`: keep `i` when the draw's fraction within the column is below
/// `keep[i]`, else take `alias[i]`.
#[derive(Debug)]
pub(crate) struct Alias {
    keep: Box<[u64]>,
    alias: Box<[u32]>,
}

impl Alias {
    /// A table for `weights` (each finite and `>= 0`). `None` when they sum to zero: the
    /// caller then chooses uniformly.
    pub(crate) fn new(weights: &[f64]) -> Option<Alias> {
        let n = weights.len();
        let total: f64 = weights.iter().sum();
        if n == 0 || total <= 0.0 || !total.is_finite() {
            return None;
        }
        // Scale so that the average column holds exactly 1.
        let mut p: Vec<f64> = weights.iter().map(|w| w * n as f64 / total).collect();
        let mut keep = vec![u64::MAX; n];
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| p[i] < 1.0);
        while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
            small.pop();
            keep[s] = fraction_to_u64(p[s]);
            alias[s] = l as u32;
            p[l] -= 1.0 - p[s];
            if p[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // What is left holds (up to rounding) exactly 1: it always keeps itself, which its
        // self-alias guarantees whatever `keep` says.
        for i in small.into_iter().chain(large) {
            keep[i] = u64::MAX;
            alias[i] = i as u32;
        }
        Some(Alias {
            keep: keep.into_boxed_slice(),
            alias: alias.into_boxed_slice(),
        })
    }

    /// The column chosen by the uniform 64-bit draw `x`.
    pub(crate) fn pick(&self, x: u64) -> usize {
        let wide = u128::from(x) * self.keep.len() as u128;
        let column = (wide >> 64) as usize;
        if (wide as u64) < self.keep[column] {
            column
        } else {
            self.alias[column] as usize
        }
    }
}

fn fraction_to_u64(f: f64) -> u64 {
    // `as` saturates: 1.0 and above become u64::MAX.
    (f * 18_446_744_073_709_551_616.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use endpoint_state::rng::weyl;

    fn shares(weights: &[f64], draws: u64) -> Vec<u64> {
        let table = Alias::new(weights).unwrap();
        let mut counts = vec![0; weights.len()];
        for k in 0..draws {
            counts[table.pick(weyl(k))] += 1;
        }
        counts
    }

    #[test]
    fn follows_the_weights() {
        let counts = shares(&[1.0, 2.0, 1.0], 40_000);
        assert!((9_990..=10_010).contains(&counts[0]), "{counts:?}");
        assert!((19_990..=20_010).contains(&counts[1]), "{counts:?}");
        assert!((9_990..=10_010).contains(&counts[2]), "{counts:?}");
    }

    #[test]
    fn zero_weight_is_never_chosen() {
        let counts = shares(&[0.0, 3.0, 0.0, 1.0], 10_000);
        assert_eq!(counts[0], 0);
        assert_eq!(counts[2], 0);
        assert!((7_490..=7_510).contains(&counts[1]), "{counts:?}");
    }

    #[test]
    fn all_zero_has_no_table() {
        assert!(Alias::new(&[0.0, 0.0]).is_none());
        assert!(Alias::new(&[]).is_none());
    }
}
