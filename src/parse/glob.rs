//! Glob patterns, as Redis matches them for CONFIG GET.

/// Glob matching as Redis does for CONFIG GET patterns: `*` any run, `?` any
/// one byte, everything else literal (case-insensitive).
pub fn glob(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, n));
            p += 1;
        } else if p < pattern.len()
            && (pattern[p] == b'?' || pattern[p].eq_ignore_ascii_case(&name[n]))
        {
            p += 1;
            n += 1;
        } else if let Some((sp, sn)) = star {
            p = sp + 1;
            n = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob(b"*", b"expire-idle"));
        assert!(glob(b"expire-*", b"expire-idle"));
        assert!(glob(b"EXPIRE-IDLE", b"expire-idle"));
        assert!(glob(b"*idle", b"expire-idle"));
        assert!(glob(b"?xpire*e", b"expire-idle"));
        assert!(!glob(b"max-*", b"expire-idle"));
        assert!(!glob(b"", b"expire-idle"));
        assert!(
            glob(b"a*c", b"a*bc"),
            "a * in the pattern is a wildcard, even facing a *"
        );
        assert!(glob(b"*", b"*"));
    }
}
