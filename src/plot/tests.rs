//! The axes' ticks: what every figure's numbers are read against.

use super::{enclosing_axis, enclosing_log_axis, linear_axis};

/// A value axis's ends are ticks around the data, with 3 to `max` labelled ticks: no value lies
/// beyond the labelled range, and no axis has two ticks (20 and 40 for data up to 53 %).
#[test]
fn a_value_axis_encloses_its_data_between_ticks() {
    let labels = |lo: f64, hi: f64| enclosing_axis(lo, hi, 0.0, 6).ticks.into_iter().map(|t| t.1).collect::<Vec<_>>();
    assert_eq!(labels(8.0, 53.0), ["0", "20", "40", "60"]);
    assert_eq!(labels(1.45, 5.6), ["1", "2", "3", "4", "5", "6"]);
    assert_eq!(labels(0.195, 0.292), ["0.175", "0.200", "0.225", "0.250", "0.275", "0.300"]);
    // Data that are not negative keep a padded axis above 0.
    assert_eq!(enclosing_axis(0.01, 0.9, 0.08, 6).ticks.first().map(|t| t.0), Some(0.0));
    for i in 0..2000 {
        // Ranges from 10⁻⁴ to 10⁵ wide, either side of 0, some of one value.
        let x = (i as f64 * 0.618_034).fract();
        let y = (i as f64 * 0.414_214).fract();
        let lo = (x - 0.5) * 10f64.powf(5.0 * y - 1.0);
        let hi = lo + if i % 7 == 0 { 0.0 } else { 10f64.powf(9.0 * x - 4.0) };
        let a = enclosing_axis(lo, hi, 0.0, 6);
        let (first, last) = (a.ticks.first().unwrap().0, a.ticks.last().unwrap().0);
        assert!((3..=6).contains(&a.ticks.len()), "{lo}..{hi}: {:?}", a.ticks);
        let step = a.ticks[1].0 - a.ticks[0].0;
        assert!(first <= lo + 1e-6 * step && last >= hi - 1e-6 * step, "{lo}..{hi}: ticks {first}..{last}");
        assert!((a.lo - first).abs() <= 1e-9 * (last - first) && (a.hi - last).abs() <= 1e-9 * (last - first));
        let labels: std::collections::BTreeSet<&String> = a.ticks.iter().map(|t| &t.1).collect();
        assert_eq!(labels.len(), a.ticks.len(), "{lo}..{hi}: two ticks read the same: {:?}", a.ticks);
    }
}

/// A time axis keeps the data's own ends (a run of 1,600 steps ends at 1,600, not at 2,000), its
/// ticks inside them.
#[test]
fn a_step_axis_ends_at_the_data() {
    let a = linear_axis(0.0, 1600.0, 0.0, 7);
    assert_eq!((a.lo, a.hi), (0.0, 1600.0));
    assert_eq!(a.ticks.iter().map(|t| t.1.as_str()).collect::<Vec<_>>(), ["0", "500", "1000", "1500"]);
}

/// A log value axis continues its ticks' pattern until they enclose the data: a loss of 0.15 is
/// not drawn under a lowest tick of 0.5, nor 10⁻¹³ under 10⁻¹².
#[test]
fn a_log_value_axis_encloses_its_data_between_ticks() {
    for i in 0..2000 {
        let x = (i as f64 * 0.618_034).fract();
        let y = (i as f64 * 0.414_214).fract();
        let lo = 10f64.powf(-14.0 + 16.0 * x);
        let hi = lo * 10f64.powf(if i % 9 == 0 { 0.0 } else { 14.0 * y });
        let a = enclosing_log_axis(lo, hi, 6);
        assert!(a.ticks.len() >= 2, "{lo}..{hi}: {:?}", a.ticks);
        let (first, last) = (10f64.powf(a.ticks[0].0), 10f64.powf(a.ticks.last().unwrap().0));
        assert!(first <= lo * (1.0 + 1e-9) && last >= hi * (1.0 - 1e-9), "{lo}..{hi}: ticks {first}..{last}");
        assert!((a.lo - first.log10()).abs() < 1e-9 && (a.hi - last.log10()).abs() < 1e-9);
    }
    let labels = |lo: f64, hi: f64| enclosing_log_axis(lo, hi, 6).ticks.into_iter().map(|t| t.1).collect::<Vec<_>>();
    assert_eq!(labels(0.15, 4.0), ["0.1", "0.2", "0.5", "1", "2", "5"]);
}

/// Steps of 2.5 × 10^k print the decimals they need: `2.5`, `0.25`, but `25`, not `25.0`.
#[test]
fn steps_of_two_and_a_half_print_only_the_decimals_they_need() {
    let labels = |lo: f64, hi: f64| enclosing_axis(lo, hi, 0.0, 5).ticks.into_iter().map(|t| t.1).collect::<Vec<_>>();
    assert_eq!(labels(8.0, 100.0), ["0", "25", "50", "75", "100"]);
    assert_eq!(labels(0.8, 10.0), ["0.0", "2.5", "5.0", "7.5", "10.0"]);
}
