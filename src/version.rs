//! The module's version, taken from Cargo.toml at compile time, in the forms
//! Redis shows it: `MODULE LIST`/`INFO modules` (`ver`, one integer) and
//! `COMMAND DOCS` (`since`, a dotted string).

use std::ffi::CStr;

/// The crate version, e.g. `"0.1.0"`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// [`VERSION`] as Redis encodes module versions, `major * 10000 + minor *
/// 100 + patch` (0.1.0 is 100, 1.2.3 is 10203); passed to `RedisModule_Init`.
/// A minor or patch number above 99 would be ambiguous, so it fails the build.
pub const NUMBER: i32 = encode(
    number(env!("CARGO_PKG_VERSION_MAJOR")),
    number(env!("CARGO_PKG_VERSION_MINOR")),
    number(env!("CARGO_PKG_VERSION_PATCH")),
);

/// The first released version: the `since` that `COMMAND DOCS` shows for
/// every command that existed then. A command added later names its own
/// version instead. Never later than [`VERSION`] (checked by a unit test).
pub const FIRST_RELEASE: &CStr = c"0.1.0";

/// `major * 10000 + minor * 100 + patch`; panics (at compile time, in a
/// const) when minor or patch is above 99 or the result overflows.
pub const fn encode(major: i32, minor: i32, patch: i32) -> i32 {
    assert!(
        minor >= 0 && minor <= 99 && patch >= 0 && patch <= 99,
        "Redis module versions encode minor and patch in two digits each"
    );
    assert!(major >= 0 && major <= 214_747, "major version too large");
    major * 10_000 + minor * 100 + patch
}

/// Parses a decimal version component at compile time.
const fn number(s: &str) -> i32 {
    let b = s.as_bytes();
    assert!(
        !b.is_empty() && b.len() <= 6,
        "version component of 1 to 6 digits"
    );
    let mut v = 0;
    let mut i = 0;
    while i < b.len() {
        assert!(b[i].is_ascii_digit(), "version component must be digits");
        v = v * 10 + (b[i] - b'0') as i32;
        i += 1;
    }
    v
}

/// Parses `"X.Y.Z"` into its encoded number, or `None` if it is not three
/// numbers with minor and patch below 100.
pub fn parse(text: &str) -> Option<i32> {
    let mut parts = text.split('.').map(|p| {
        (!p.is_empty() && p.len() <= 6 && p.bytes().all(|c| c.is_ascii_digit()))
            .then(|| p.parse::<i32>().ok())
            .flatten()
    });
    let (major, minor, patch) = (parts.next()??, parts.next()??, parts.next()??);
    if parts.next().is_some() || minor > 99 || patch > 99 || major > 214_747 {
        return None;
    }
    Some(encode(major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_as_redis_does() {
        assert_eq!(encode(0, 1, 0), 100);
        assert_eq!(encode(1, 2, 3), 10_203);
        assert_eq!(encode(7, 99, 99), 79_999);
        assert_eq!(parse("0.1.0"), Some(100));
        assert_eq!(parse("12.0.7"), Some(120_007));
    }

    #[test]
    fn number_matches_the_crate_version_string() {
        assert_eq!(parse(VERSION), Some(NUMBER));
    }

    #[test]
    fn first_release_is_not_after_this_version() {
        let first = parse(FIRST_RELEASE.to_str().unwrap()).unwrap();
        assert!(first <= NUMBER, "{FIRST_RELEASE:?} is after {VERSION}");
    }

    #[test]
    fn refuses_what_redis_cannot_encode() {
        for bad in [
            "", "1", "1.2", "1.2.3.4", "1.100.0", "1.0.100", "a.b.c", "1..2", "-1.0.0",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
