//! `parse::rate` on arbitrary bytes: never panics or overflows; whatever it
//! accepts is a reduced fraction inside the supported bounds, agrees with the
//! standard library's float parse of the same text, and survives a round trip
//! through the decimal string `TB.INFO` shows.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tb::bucket::{Rate, MAX_RATE_DEN, MAX_RATE_NUM};
use tb::parse;

fuzz_target!(|data: &[u8]| {
    let Ok(r) = parse::rate(data) else {
        return;
    };
    assert!(r.den() >= 1 && r.den() <= MAX_RATE_DEN, "{r:?}");
    assert!(r.num() <= MAX_RATE_NUM, "{r:?}");
    assert_eq!(
        Rate::new(r.num().into(), r.den().into()),
        Some(r),
        "not reduced"
    );
    // Only ASCII is ever accepted.
    let text = std::str::from_utf8(data).expect("an accepted rate is ASCII");
    assert!(text.is_ascii());

    // Differential check against the standard library's float parser.
    let (number, unit_secs) = match text.rsplit_once('/') {
        Some((n, u)) => {
            let secs = match u {
                "s" | "S" => 1.0,
                "m" | "M" => 60.0,
                "h" | "H" => 3600.0,
                "d" | "D" => 86_400.0,
                _ => panic!("accepted an unknown unit in {text:?}"),
            };
            (n, secs)
        }
        None => (text, 1.0),
    };
    let float: f64 = number
        .parse()
        .unwrap_or_else(|e| panic!("tb accepted {text:?}, std rejects it: {e}"));
    let expected = float / unit_secs;
    let got = r.num() as f64 / r.den() as f64;
    assert!(
        (expected - got).abs() <= 1e-12 * expected,
        "{text:?}: tb {got} vs std {expected}"
    );

    // The rate as TB.INFO renders it: exact when it terminates within 12
    // decimals, else within half a unit of the 12th decimal.
    let shown = r.to_decimal();
    if 1_000_000_000_000 % r.den() == 0 {
        assert_eq!(parse::rate(shown.as_bytes()), Ok(r), "{shown:?}");
    } else if let Ok(back) = parse::rate(shown.as_bytes()) {
        // |r - back| <= 0.5e-12, by cross-multiplication (no overflow:
        // numerators < 2^54, denominators <= 2^40).
        let lhs = u128::from(r.num()) * u128::from(back.den());
        let rhs = u128::from(back.num()) * u128::from(r.den());
        let diff = lhs.abs_diff(rhs);
        let dens = u128::from(r.den()) * u128::from(back.den());
        assert!(
            diff.checked_mul(2_000_000_000_000)
                .is_some_and(|d| d <= dens),
            "{r:?} shown as {shown:?} reads back as {back:?}"
        );
    }
});
