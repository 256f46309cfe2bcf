//! `parse::glob` (TB.CONFIG GET patterns) on arbitrary pattern/name pairs
//! (split at the first NUL byte), compared with a straightforward dynamic
//! programming matcher: `*` any run, `?` any one byte, the rest literal and
//! ASCII case-insensitive. Names are what TB.CONFIG matches: setting names.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tb::parse;

/// Reference matcher: `m[i][j]` = pattern[i..] matches name[j..].
fn reference(p: &[u8], n: &[u8]) -> bool {
    let mut m = vec![vec![false; n.len() + 1]; p.len() + 1];
    m[p.len()][n.len()] = true;
    for i in (0..p.len()).rev() {
        for j in (0..=n.len()).rev() {
            m[i][j] = match p[i] {
                b'*' => m[i + 1][j] || (j < n.len() && m[i][j + 1]),
                b'?' => j < n.len() && m[i + 1][j + 1],
                c => j < n.len() && c.eq_ignore_ascii_case(&n[j]) && m[i + 1][j + 1],
            };
        }
    }
    m[0][0]
}

fuzz_target!(|data: &[u8]| {
    let (pattern, name) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b"expire-idle"[..]),
    };
    if pattern.len() > 256 || name.len() > 256 {
        return;
    }
    assert_eq!(
        parse::glob(pattern, name),
        reference(pattern, name),
        "glob({:?}, {:?})",
        String::from_utf8_lossy(pattern),
        String::from_utf8_lossy(name)
    );
});
