//! The module's settings in one place: names, bounds, defaults, current
//! values and the error text for a bad value. Everything that sets them uses
//! this table: the native configs registered with Redis (`CONFIG SET tb.*`,
//! redis.conf lines; `glue::config`), `TB.CONFIG SET`, and the arguments after
//! `loadmodule` ([`module_args`]). No Redis types here.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::errors;
use crate::parse::{self, MAX_WAIT_MS};

/// What values a setting takes. Every setting's value is an integer from 0 to
/// its maximum; a yes/no setting is 1 or 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `yes` or `no` (any case, as Redis' own yes/no configs).
    Bool,
    /// A decimal integer from 0 to `max`.
    Int {
        /// Largest value accepted.
        max: u64,
    },
}

/// One setting.
#[derive(Debug)]
pub struct Setting {
    /// Name without the `tb.` prefix: the name in `TB.CONFIG` and in module
    /// arguments (`tb.` + name is the native config).
    pub name: &'static str,
    /// Values accepted.
    pub kind: Kind,
    /// Value when nothing sets it.
    pub default: i64,
    /// The error reply for a value outside [`Setting::kind`]; it states the
    /// bounds (a unit test checks it against `kind`).
    pub error: &'static str,
    value: AtomicI64,
}

impl Setting {
    const fn new(name: &'static str, kind: Kind, default: i64, error: &'static str) -> Self {
        Setting {
            name,
            kind,
            default,
            error,
            value: AtomicI64::new(default),
        }
    }

    /// The current value.
    pub fn get(&self) -> i64 {
        self.value.load(Ordering::Relaxed)
    }

    /// Sets the value; `v` must have come from [`Setting::parse`] or be within
    /// [`Setting::max`] (Redis checks native config values against it).
    pub fn store(&self, v: i64) {
        debug_assert!((0..=self.max()).contains(&v), "{} = {v}", self.name);
        self.value.store(v.clamp(0, self.max()), Ordering::Relaxed);
    }

    /// Largest value (1 for yes/no).
    pub fn max(&self) -> i64 {
        match self.kind {
            Kind::Bool => 1,
            Kind::Int { max } => max as i64,
        }
    }

    /// Parses a value as typed by a user, or returns [`Setting::error`].
    pub fn parse(&self, text: &[u8]) -> Result<i64, &'static str> {
        match self.kind {
            Kind::Bool if text.eq_ignore_ascii_case(b"yes") => Ok(1),
            Kind::Bool if text.eq_ignore_ascii_case(b"no") => Ok(0),
            Kind::Bool => Err(self.error),
            Kind::Int { max } => parse::integer(text, max, self.error).map(|v| v as i64),
        }
    }

    /// The current value as users write it (`yes`/`no`, or digits).
    pub fn show(&self) -> String {
        match (self.kind, self.get()) {
            (Kind::Bool, 0) => "no".to_string(),
            (Kind::Bool, _) => "yes".to_string(),
            (Kind::Int { .. }, v) => v.to_string(),
        }
    }

    /// `name` and its values, for messages: `max-wait-ms 0..86400000`.
    pub fn usage(&self) -> String {
        match self.kind {
            Kind::Bool => format!("{} yes|no", self.name),
            Kind::Int { max } => format!("{} 0..{max}", self.name),
        }
    }
}

/// `expire-idle`: a bucket's key expires when the bucket is full again.
pub static EXPIRE_IDLE: Setting =
    Setting::new("expire-idle", Kind::Bool, 1, errors::ERR_EXPIRE_IDLE);

/// `max-wait-ms`: the longest RESERVE or BLOCK wait accepted (default one
/// minute).
pub static MAX_WAIT: Setting = Setting::new(
    "max-wait-ms",
    Kind::Int { max: MAX_WAIT_MS },
    60_000,
    errors::ERR_MAX_WAIT,
);

/// The largest `max-blocked` setting accepted.
pub const MAX_BLOCKED_LIMIT: u64 = 1_000_000;

/// `max-blocked`: clients blocked by BLOCK at most; past it, BLOCK requests
/// are answered at once, as RESERVE would answer them.
pub static MAX_BLOCKED: Setting = Setting::new(
    "max-blocked",
    Kind::Int {
        max: MAX_BLOCKED_LIMIT,
    },
    10_000,
    errors::ERR_MAX_BLOCKED,
);

/// `top-keys`: whether denials and reservations feed the `TB.TOP` sketches.
pub static TOP_KEYS: Setting = Setting::new("top-keys", Kind::Bool, 1, errors::ERR_TOP_KEYS);

/// Every setting, in the order `TB.CONFIG GET *` and `INFO tb` list them.
pub static ALL: [&Setting; 4] = [&EXPIRE_IDLE, &MAX_WAIT, &MAX_BLOCKED, &TOP_KEYS];

/// The setting called `name`, ignoring case (as `TB.CONFIG SET` and Redis'
/// `CONFIG SET` do).
pub fn find(name: &[u8]) -> Option<&'static Setting> {
    ALL.iter()
        .copied()
        .find(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Checks the arguments after `loadmodule <path>`: pairs of an exact setting
/// name (lower case, without `tb.`) and a valid value, each setting at most
/// once. Returns the values to apply, or the reason to refuse loading: a
/// sentence that names the offending argument and lists every valid setting.
pub fn module_args(args: &[&[u8]]) -> Result<Vec<(&'static Setting, i64)>, String> {
    let mut out: Vec<(&'static Setting, i64)> = Vec::new();
    let mut pairs = args.chunks(2);
    for pair in pairs.by_ref() {
        let name = pair[0];
        let shown = String::from_utf8_lossy(name);
        let Some(setting) = ALL.iter().copied().find(|s| s.name.as_bytes() == name) else {
            return Err(with_usage(unknown(name, &shown)));
        };
        let Some(&value) = pair.get(1) else {
            return Err(with_usage(format!(
                "module argument '{shown}' has no value"
            )));
        };
        if out.iter().any(|(s, _)| std::ptr::eq(*s, setting)) {
            return Err(with_usage(format!(
                "module argument '{shown}' is given twice"
            )));
        }
        match setting.parse(value) {
            Ok(v) => out.push((setting, v)),
            Err(e) => {
                return Err(with_usage(format!(
                    "bad value '{}' for module argument '{shown}': {}",
                    String::from_utf8_lossy(value),
                    e.strip_prefix("ERR ").unwrap_or(e)
                )))
            }
        }
    }
    Ok(out)
}

/// Checks the `tb.*` directives of a redis.conf text: each must name a
/// setting. Returns a sentence per line that does not (its number, the name
/// and the closest setting), for the load-time log: Redis 7.0 itself says
/// only "Module Configuration detected without loadmodule directive".
pub fn unknown_config_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(directive) = line.split_whitespace().next() else {
            continue;
        };
        let Some(name) = directive
            .get(..3)
            .filter(|p| p.eq_ignore_ascii_case("tb."))
            .map(|_| &directive[3..])
        else {
            continue;
        };
        if find(name.as_bytes()).is_some() {
            continue;
        }
        let hint = closest(name).map_or(String::new(), |s| format!(" (did you mean 'tb.{s}'?)"));
        let valid: Vec<String> = ALL.iter().map(|s| format!("tb.{}", s.name)).collect();
        out.push(format!(
            "line {}: unknown setting '{directive}'{hint}; the settings are {}",
            i + 1,
            valid.join(", ")
        ));
    }
    out
}

/// The setting whose name is closest to `name` (ignoring case), if any is
/// within three edits of it.
fn closest(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    ALL.iter()
        .map(|s| (edits(&name, s.name), s.name))
        .filter(|&(d, _)| d <= 3)
        .min()
        .map(|(_, n)| n)
}

/// Levenshtein distance between two short ASCII names.
fn edits(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.as_bytes().iter().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diag + usize::from(ca != cb));
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Why `name` is not a setting, with a hint for the likely mistakes.
fn unknown(name: &[u8], shown: &str) -> String {
    let hint = if let Some(s) = name.strip_prefix(b"tb.").and_then(find) {
        format!(
            " (module arguments take the name without 'tb.': '{0}'; 'tb.{0}' is the \
             name in a redis.conf config line and in CONFIG SET)",
            s.name
        )
    } else if let Some(s) = find(name) {
        format!(" (names are lower case: '{}')", s.name)
    } else {
        String::new()
    };
    format!("unknown module argument '{shown}'{hint}")
}

fn with_usage(problem: String) -> String {
    let valid: Vec<String> = ALL.iter().map(|s| s.usage()).collect();
    format!(
        "{problem}. Valid module arguments: {} (e.g. loadmodule /opt/tb/libtb.so max-wait-ms 10000)",
        valid.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<&[u8]> {
        s.split_whitespace().map(str::as_bytes).collect()
    }

    fn refusal(s: &str) -> String {
        module_args(&args(s)).expect_err(s)
    }

    #[test]
    fn error_texts_state_the_bounds_of_the_table() {
        for s in ALL {
            match s.kind {
                Kind::Bool => assert!(s.error.ends_with("must be yes or no"), "{s:?}"),
                Kind::Int { max } => assert!(
                    s.error
                        .ends_with(&format!("must be an integer from 0 to {max}")),
                    "{s:?}"
                ),
            }
            assert!(s.error.starts_with(&format!("ERR {} ", s.name)), "{s:?}");
            assert!((0..=s.max()).contains(&s.default), "{s:?}");
        }
    }

    #[test]
    fn parses_values_within_bounds_only() {
        assert_eq!(EXPIRE_IDLE.parse(b"yes"), Ok(1));
        assert_eq!(EXPIRE_IDLE.parse(b"NO"), Ok(0));
        assert_eq!(EXPIRE_IDLE.parse(b"false"), Err(EXPIRE_IDLE.error));
        assert_eq!(MAX_WAIT.parse(b"86400000"), Ok(86_400_000));
        assert_eq!(MAX_WAIT.parse(b"86400001"), Err(MAX_WAIT.error));
        assert_eq!(MAX_WAIT.parse(b"-1"), Err(MAX_WAIT.error));
        assert_eq!(MAX_WAIT.parse(b"ten"), Err(MAX_WAIT.error));
        assert_eq!(MAX_BLOCKED.parse(b"0"), Ok(0));
    }

    #[test]
    fn accepts_valid_module_arguments() {
        let got = module_args(&args("expire-idle no max-wait-ms 10000")).unwrap();
        let got: Vec<_> = got.iter().map(|(s, v)| (s.name, *v)).collect();
        assert_eq!(got, [("expire-idle", 0), ("max-wait-ms", 10_000)]);
        assert!(module_args(&[]).unwrap().is_empty());
    }

    #[test]
    fn refuses_each_malformed_module_argument_naming_it() {
        let cases = [
            ("max-wait 10000", "unknown module argument 'max-wait'"),
            ("tb.max-wait-ms 10000", "without 'tb.': 'max-wait-ms'"),
            ("EXPIRE-IDLE NO", "names are lower case: 'expire-idle'"),
            ("max-wait-ms", "module argument 'max-wait-ms' has no value"),
            ("expire-idle no max-blocked", "'max-blocked' has no value"),
            ("max-wait-ms ten", "bad value 'ten' for module argument 'max-wait-ms': max-wait-ms must be an integer from 0 to 86400000"),
            ("expire-idle false", "bad value 'false' for module argument 'expire-idle': expire-idle must be yes or no"),
            ("max-wait-ms 1 max-wait-ms 2", "'max-wait-ms' is given twice"),
        ];
        for (input, expected) in cases {
            let e = refusal(input);
            assert!(e.contains(expected), "{input:?}: {e}");
            assert!(
                e.contains("Valid module arguments: expire-idle yes|no, max-wait-ms 0..86400000, max-blocked 0..1000000, top-keys yes|no"),
                "{input:?}: {e}"
            );
        }
    }

    #[test]
    fn finds_settings_ignoring_case() {
        assert!(std::ptr::eq(find(b"MAX-WAIT-MS").unwrap(), &MAX_WAIT));
        assert!(find(b"tb.max-wait-ms").is_none());
    }

    #[test]
    fn unknown_config_lines_name_the_line_and_the_closest_setting() {
        let conf = "port 6379\n# tb.nothing\nloadmodule /opt/tb/libtb.so\n\
                    tb.max-wait-ms 100\nTB.Max-Wait 10000\ntb.colour blue\n";
        let got = unknown_config_lines(conf);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            got[0].starts_with(
                "line 5: unknown setting 'TB.Max-Wait' (did you mean 'tb.max-wait-ms'?)"
            ),
            "{}",
            got[0]
        );
        assert!(got[1].starts_with("line 6: unknown setting 'tb.colour'; the settings are tb."));
        assert!(unknown_config_lines("tb.expire-idle yes\n").is_empty());
    }
}
