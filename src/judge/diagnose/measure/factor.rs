//! One factor between two runs' gradients: fitted once, and called whole (n or 1/n, the
//! fingerprint of dividing by K, W or K/W in the wrong place) by one test.

/// What rounding can do to one value in the runs' precision (`eps`), relative to it: the
/// bounds below were set for float32 and float64; narrower types round more.
pub fn slack(float32_bound: f64, eps: f64, ulps: f64) -> f64 {
    float32_bound.max(ulps * eps)
}

/// Whether `v` or 1/`v` is a whole number of at least 2, to within `rel` of itself.
pub fn is_whole(v: f64, rel: f64) -> bool {
    let whole = |v: f64| v >= 1.5 && (v - v.round()).abs() <= rel * v;
    whole(v) || whole(1.0 / v)
}

/// How close a ratio of norms (which add 1e-6 to a clip's denominator, and sum many
/// squares) must be to a whole number to be called one.
pub const NORM_REL: f64 = 1e-3;

/// y = r * x for one r of any size, r not 1: r fitted by least squares and every residual
/// measured at the largest |x| (a deep net's backward rescaled by a K that is no power of
/// two rounds every element anew, and elements that cancel lose their ratio).
pub fn fitted_ratio(x: &[f64], y: &[f64], eps: f64) -> Option<f64> {
    let (sxy, sxx) = x.iter().zip(y).fold((0.0, 0.0), |(sxy, sxx), (a, b)| (sxy + a * b, sxx + a * a));
    if sxx == 0.0 || x.len() != y.len() {
        return None;
    }
    let r = sxy / sxx;
    let peak = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let tol = ratio_rel(eps);
    let same = x.iter().zip(y).all(|(a, b)| (b - r * a).abs() <= tol * r.abs() * peak);
    (same && (r - 1.0).abs() > tol).then_some(r)
}

/// How well one factor must fit the gradients, in the runs' precision.
fn ratio_rel(eps: f64) -> f64 {
    slack(1e-4, eps, 4.0)
}

/// Whether a fitted factor is whole in the runs' precision: any two numbers have "a ratio";
/// a whole one from different samples would be a coincidence.
pub fn whole_at(r: f64, eps: f64) -> bool {
    is_whole(r, ratio_rel(eps))
}

/// Equal up to rounding: relative to each element, or to the largest one where a deep net's
/// gradients cancel to small values.
pub fn close(x: &[f64], y: &[f64], eps: f64) -> bool {
    let scale = x.iter().chain(y).fold(0.0f64, |m, v| m.max(v.abs()));
    let (rel, at_scale) = (slack(1e-5, eps, 4.0), slack(1e-6, eps, 2.0));
    x.len() == y.len()
        && x.iter().zip(y).all(|(a, b)| {
            let d = (a - b).abs();
            d <= rel * a.abs().max(b.abs()).max(1e-6) || d <= at_scale * scale
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPS: f64 = f32::EPSILON as f64;

    #[test]
    fn a_whole_factor_either_way_is_whole() {
        assert!(is_whole(2.0, 1e-4) && is_whole(0.5, 1e-4) && is_whole(4.0002, 1e-4));
        assert!(!is_whole(1.0, 1e-4) && !is_whole(1.3, 1e-4) && !is_whole(2.01, 1e-4));
    }

    #[test]
    fn one_factor_is_fitted_and_a_mix_is_not() {
        let x = [1.0, -2.0, 0.5, 3.0];
        let y: Vec<f64> = x.iter().map(|v| v * 0.25).collect();
        assert_eq!(fitted_ratio(&x, &y, EPS).filter(|&r| whole_at(r, EPS)), Some(0.25));
        let y: Vec<f64> = x.iter().map(|v| v * 1.37).collect();
        assert!(!whole_at(fitted_ratio(&x, &y, EPS).unwrap(), EPS));
        assert!((fitted_ratio(&x, &y, EPS).unwrap() - 1.37).abs() < 1e-12);
        let mixed = [0.5, -1.0, 1.0, 3.0];
        assert!(fitted_ratio(&x, &mixed, EPS).is_none());
        assert!(fitted_ratio(&x, &x, EPS).is_none(), "a factor of 1 is no factor");
    }

    #[test]
    fn close_allows_rounding_at_the_largest_element() {
        assert!(close(&[1.0, 1e-9], &[1.0 + 1e-7, 2e-9], EPS));
        assert!(!close(&[1.0, 0.5], &[1.0, 0.6], EPS));
    }
}
