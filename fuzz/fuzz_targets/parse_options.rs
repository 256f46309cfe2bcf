//! `parse::consume_options` (what follows `capacity` in TB.CONSUME) on
//! arbitrary argument lists (the input split at NUL bytes): never panics;
//! every accepted request is in range and self-consistent, reads back the
//! same from its canonical form, and the keywords are case-insensitive.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tb::bucket::MAX_AMOUNT;
use tb::errors::{ERR_ATMOST_WAIT, ERR_MIN, ERR_MIN_ATMOST, ERR_N, ERR_OPTION, ERR_WAIT};
use tb::parse::{self, ConsumeOptions, Wait, MAX_WAIT_MS};

fn parse(args: &[Vec<u8>]) -> Result<ConsumeOptions, parse::ParseError> {
    parse::consume_options(args.iter().map(Vec::as_slice))
}

/// The shortest argument list meaning `o`.
fn canonical(o: &ConsumeOptions) -> Vec<Vec<u8>> {
    let mut out = vec![o.n.to_string().into_bytes()];
    if o.atmost {
        out.push(b"ATMOST".to_vec());
    }
    if let Some(c) = o.min {
        out.extend([b"MIN".to_vec(), c.to_string().into_bytes()]);
    }
    match o.wait {
        Wait::No => {}
        Wait::Reserve(ms) => out.extend([b"RESERVE".to_vec(), ms.to_string().into_bytes()]),
        Wait::Block(ms) => out.extend([b"BLOCK".to_vec(), ms.to_string().into_bytes()]),
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let args: Vec<Vec<u8>> = if data.is_empty() {
        Vec::new()
    } else {
        data.split(|&b| b == 0).map(<[u8]>::to_vec).collect()
    };
    let got = parse(&args);
    match &got {
        Ok(o) => {
            assert!(o.n <= MAX_AMOUNT, "{o:?}");
            match o.wait {
                Wait::No => {}
                Wait::Reserve(ms) | Wait::Block(ms) => {
                    assert!(ms <= MAX_WAIT_MS, "{o:?}");
                    assert!(!o.atmost, "ATMOST with a wait: {o:?}");
                }
            }
            if let Some(c) = o.min {
                assert!(o.atmost && (1..=MAX_AMOUNT).contains(&c), "{o:?}");
            }
            assert!(args.len() <= 4, "n, ATMOST and MIN chunk, or a wait, at most: {args:?}");
            assert_eq!(parse(&canonical(o)).as_ref(), Ok(o), "canonical form");
        }
        Err(e) => assert!(
            [ERR_N, ERR_WAIT, ERR_OPTION, ERR_ATMOST_WAIT, ERR_MIN, ERR_MIN_ATMOST].contains(e),
            "unexpected error {e:?}"
        ),
    }
    // Keywords are case-insensitive and numbers have no case.
    let upper: Vec<Vec<u8>> = args.iter().map(|a| a.to_ascii_uppercase()).collect();
    let lower: Vec<Vec<u8>> = args.iter().map(|a| a.to_ascii_lowercase()).collect();
    assert_eq!(parse(&upper), got, "upper case of {args:?}");
    assert_eq!(parse(&lower), got, "lower case of {args:?}");
});
