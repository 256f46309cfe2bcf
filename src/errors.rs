//! Every error line the module answers, each named once: the single source
//! of the protocol's errors. `make catalogue` lists them in
//! `protocol/catalogue.json` and generates from it the Lua fallback's and
//! the clients' copies and the table of `docs/errors.md` (each doc comment
//! below is its "when" column).
//!
//! A bound that an error line names is built from the limit constant that
//! decides it ([`concatcp!`]), never retyped. A line with a `{}` is a
//! template: the function next to it fills it in. Pure: no Redis types.

use const_format::concatcp;

use crate::bucket::MAX_AMOUNT;
use crate::fair::MAX_WEIGHT;
use crate::lease::{MAX_LEASES, MAX_TTL_MS};
use crate::parse::{MAX_FLOW_NAME, MAX_KEYS, MAX_WAIT_MS};
use crate::settings::MAX_BLOCKED_LIMIT;
use crate::topkeys::TOP_CAPACITY;

/// Declares each error line as a `pub const` and lists them all in [`ALL`].
macro_rules! errors {
    ($($(#[doc = $doc:literal])+ $name:ident = $text:expr;)+) => {
        $($(#[doc = $doc])+ pub const $name: &str = $text;)+

        /// Every error line: its name, its text and its doc comment (the
        /// catalogue's `errors`).
        pub const ALL: &[Error] = &[$(Error {
            name: stringify!($name),
            text: $name,
            doc: concat!($($doc, "\n"),+),
        }),+];
    };
}

/// One error line of [`ALL`].
#[derive(Clone, Copy, Debug)]
pub struct Error {
    /// The constant's name (`ERR_RATE`).
    pub name: &'static str,
    /// The line, as the client receives it (`{}` where a template is filled).
    pub text: &'static str,
    /// Its doc comment, one line per `///` line.
    pub doc: &'static str,
}

errors! {
    // ---- Numbers and rates (every command) --------------------------------
    /// An unparsable rate: negative, NaN, infinite, signs, spaces, non-UTF-8
    /// bytes.
    ERR_RATE = "ERR rate must be a non-negative decimal (10, 0.5, 1e-3) or N/s, N/m, N/h, N/d";
    /// A rate above 9e15/s (`bucket::MAX_RATE_NUM`), below about 1e-12/s
    /// (`bucket::MAX_RATE_DEN`), or an exponent out of range.
    ERR_RATE_RANGE = "ERR rate out of range or too precise: supported from about 1e-12 to 9e15 tokens per second";
    /// A bad capacity.
    ERR_CAPACITY = concatcp!("ERR capacity must be an integer from 0 to ", MAX_AMOUNT);
    /// A bad `n`.
    ERR_N = concatcp!("ERR n must be an integer from 0 to ", MAX_AMOUNT);

    // ---- TB.CONSUME's options ----------------------------------------------
    /// A bad `RESERVE` or `BLOCK` wait.
    ERR_WAIT = concatcp!("ERR RESERVE and BLOCK take a wait in milliseconds, an integer from 0 to ", MAX_WAIT_MS);
    /// A wait above the `max-wait-ms` setting, whose current value fills the
    /// `{}` (`wait_exceeds`).
    ERR_WAIT_EXCEEDS = "ERR wait exceeds tb.max-wait-ms ({})";
    /// An unknown or repeated option of `TB.CONSUME`.
    ERR_OPTION = "ERR unknown or repeated option: after n, use RESERVE ms, BLOCK ms or ATMOST";
    /// `MIN` with a chunk that is not an integer, 0, or above the capacity
    /// (in `TB.MCONSUME`, of any part asking for the largest `n`).
    ERR_MIN = "ERR MIN takes a chunk, an integer from 1 to capacity";
    /// `MIN` without `ATMOST`.
    ERR_MIN_ATMOST = "ERR MIN needs ATMOST";
    /// `ATMOST` with `RESERVE` or `BLOCK`.
    ERR_ATMOST_WAIT = "ERR ATMOST cannot be combined with RESERVE or BLOCK";
    /// `BLOCK` where Redis cannot block: inside MULTI, a script, or on a
    /// client that cannot block.
    ERR_CANNOT_BLOCK = "ERR BLOCK cannot wait inside MULTI, a script, or on a client that cannot block: use RESERVE and wait on the client";

    // ---- TB.MCONSUME ---------------------------------------------------------
    /// A bad `numkeys` (above `parse::MAX_KEYS`), or one the arguments do not
    /// match.
    ERR_NUMKEYS = concatcp!("ERR numkeys must be an integer from 1 to ", MAX_KEYS, " and match the arguments");
    /// A key named twice in `TB.MCONSUME`.
    ERR_DUPLICATE = "ERR a key appears twice in TB.MCONSUME";
    /// An unknown option of `TB.MCONSUME`.
    ERR_MCONSUME_OPTION = "ERR unknown option: TB.MCONSUME takes RESERVE ms, or ATMOST [MIN chunk], and LEASE part ttl-ms";
    /// `TB.MCONSUME`'s `BLOCK` with `RESERVE` or `ATMOST`.
    ERR_MCONSUME_BLOCK = "ERR BLOCK cannot be combined with RESERVE or ATMOST";

    // ---- FLOW and WEIGHT (both consume commands) ------------------------------
    /// `FLOW` without `BLOCK`: it names the queue a call waits in, and only
    /// `BLOCK` waits there.
    ERR_FLOW_BLOCK = "ERR FLOW needs BLOCK";
    /// A missing, empty or too long flow name (`parse::MAX_FLOW_NAME`).
    ERR_FLOW_NAME = concatcp!("ERR FLOW takes a name of 1 to ", MAX_FLOW_NAME, " bytes");
    /// A bad weight (above `fair::MAX_WEIGHT`), or `WEIGHT` not right after
    /// `FLOW name`.
    ERR_WEIGHT = concatcp!("ERR WEIGHT takes an integer from 1 to ", MAX_WEIGHT, ", after FLOW name");

    // ---- Leases and TB.RELEASE -----------------------------------------------
    /// A bad lease TTL (above `lease::MAX_TTL_MS`).
    ERR_LEASE_TTL = concatcp!("ERR LEASE takes a TTL in milliseconds, an integer from 1 to ", MAX_TTL_MS);
    /// `LEASE` repeated (or twice for one part of `TB.MCONSUME`).
    ERR_LEASE_TWICE = "ERR LEASE given twice";
    /// A lease is never reserved and never partial (in `TB.MCONSUME`,
    /// `RESERVE` applies to the other parts; `BLOCK` waits for the lease).
    ERR_LEASE_MODE = "ERR LEASE cannot be combined with RESERVE or ATMOST";
    /// A lease of 0 tokens.
    ERR_LEASE_N = "ERR LEASE needs n of at least 1";
    /// The per-bucket maximum of leases (`lease::MAX_LEASES`).
    ERR_LEASE_FULL = concatcp!("ERR the bucket holds ", MAX_LEASES, " leases already: release some or wait for them to expire");
    /// A bad `LEASE` of `TB.MCONSUME`.
    ERR_LEASE_PART = "ERR LEASE in TB.MCONSUME takes a part number from 1 to numkeys and a TTL";
    /// A bad lease id in `TB.RELEASE`.
    ERR_LEASE_ID = concatcp!("ERR lease-id must be an integer from 0 to ", MAX_AMOUNT);
    /// A bad `USED`.
    ERR_USED = concatcp!("ERR USED takes the tokens used, an integer from 0 to ", MAX_AMOUNT);
    /// Another option of `TB.RELEASE`.
    ERR_RELEASE_OPTION = "ERR unknown option: TB.RELEASE takes USED n";

    // ---- CL.THROTTLE ---------------------------------------------------------
    /// A bad `CL.THROTTLE` `max_burst` (the capacity is `max_burst + 1`).
    ERR_BURST = concatcp!("ERR max_burst must be an integer from 0 to ", MAX_AMOUNT - 1);
    /// A bad `CL.THROTTLE` `count`.
    ERR_COUNT = concatcp!("ERR count must be an integer from 0 to ", MAX_AMOUNT);
    /// A bad `CL.THROTTLE` `period`.
    ERR_PERIOD = concatcp!("ERR period must be an integer number of seconds from 1 to ", MAX_AMOUNT);
    /// A bad `CL.THROTTLE` `quantity`.
    ERR_QUANTITY = concatcp!("ERR quantity must be an integer from 0 to ", MAX_AMOUNT);

    // ---- TB.TOP ----------------------------------------------------------------
    /// A bad `TB.TOP` option.
    ERR_TOP_OPTION = "ERR unknown or repeated option: TB.TOP takes DENIED or WAITS, and COUNT n";
    /// A `TB.TOP` `COUNT` above what the sketches hold (`topkeys::TOP_CAPACITY`).
    ERR_TOP_COUNT = concatcp!("ERR COUNT must be an integer from 0 to ", TOP_CAPACITY);

    // ---- TB.CONFIG and the settings ------------------------------------------
    /// An unknown `TB.CONFIG` subcommand.
    ERR_SUBCOMMAND = "ERR unknown subcommand: use GET pattern, SET name value, or RESETSTAT";
    /// `TB.CONFIG SET` of a setting that does not exist, named in the `{}`
    /// (`unknown_setting`).
    ERR_UNKNOWN_SETTING = "ERR unknown setting '{}'";
    /// A bad value of the `expire-idle` setting.
    ERR_EXPIRE_IDLE = "ERR expire-idle must be yes or no";
    /// A bad value of the `max-wait-ms` setting (at most `parse::MAX_WAIT_MS`).
    ERR_MAX_WAIT = concatcp!("ERR max-wait-ms must be an integer from 0 to ", MAX_WAIT_MS);
    /// A bad value of the `max-blocked` setting (at most
    /// `settings::MAX_BLOCKED_LIMIT`).
    ERR_MAX_BLOCKED = concatcp!("ERR max-blocked must be an integer from 0 to ", MAX_BLOCKED_LIMIT);
    /// A bad value of the `top-keys` setting.
    ERR_TOP_KEYS = "ERR top-keys must be yes or no";

    // ---- TB.SETSTATE (replication and the AOF) -------------------------------
    /// An impossible internal state.
    ERR_STATE = "ERR invalid bucket state for TB.SETSTATE";
    /// A replicated lease change applied to a key that is not the state the
    /// master changed.
    ERR_DELTA = "ERR TB.SETSTATE: the lease change does not fit the leases the key holds";

    // ---- The server's own lines, which the module sends itself ---------------
    /// The key holds another type.
    ERR_WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value";
    /// A wrong argument count, answered by a call waiting server-side (whose
    /// arity was checked when it came; Redis' own line names the command).
    ERR_WRONG_ARITY = "ERR wrong number of arguments";
    /// Writes past `maxmemory` (the commands are `deny-oom`), and in scripts
    /// flagged `allow-oom` a command that would create a bucket.
    ERR_OOM = "OOM command not allowed when used memory > 'maxmemory'.";
    /// A call waiting with `BLOCK` on a server that turned replica (a
    /// failover): retry it on the new master.
    ERR_UNBLOCKED = "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)";

    // ---- The module's own failures (never seen in tests or fuzzing; please report one)
    /// A bug in the module, caught before the command began to write.
    ERR_PANIC_NO_EFFECT = "ERR tb: internal error; the command had no effect";
    /// A bug in the module, caught after the command began to write.
    ERR_PANIC_MAY_HAVE_EFFECTS = "ERR tb: internal error; the command may have had effects (check the key)";
    /// A call waiting server-side woken without its reply (a bug).
    ERR_LOST_REPLY = "ERR tb: lost the reservation reply";
    /// An error line that could not be sent as it is (a bug).
    ERR_UNSENDABLE = "ERR tb: error";
}

/// [`ERR_WAIT_EXCEEDS`] for the setting's current value.
pub fn wait_exceeds(max_wait_ms: u64) -> String {
    ERR_WAIT_EXCEEDS.replace("{}", &max_wait_ms.to_string())
}

/// [`ERR_UNKNOWN_SETTING`] for `name` (shown lossily as UTF-8).
pub fn unknown_setting(name: &str) -> String {
    ERR_UNKNOWN_SETTING.replace("{}", name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_texts_are_unique_and_each_starts_with_an_error_code() {
        let mut names: Vec<_> = ALL.iter().map(|e| e.name).collect();
        let mut texts: Vec<_> = ALL.iter().map(|e| e.text).collect();
        names.sort_unstable();
        names.dedup();
        texts.sort_unstable();
        texts.dedup();
        assert_eq!((names.len(), texts.len()), (ALL.len(), ALL.len()));
        for e in ALL {
            let code = e.text.split(' ').next().unwrap_or_default();
            assert!(
                !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()),
                "{e:?}"
            );
            assert!(e.name.starts_with("ERR_") && !e.doc.is_empty(), "{e:?}");
        }
    }

    #[test]
    fn bounds_come_from_the_limits() {
        assert!(ERR_WAIT.ends_with(" 86400000"));
        assert!(ERR_LEASE_FULL.contains(" 1024 leases"));
        assert!(ERR_NUMKEYS.contains(" 1 to 16 "));
        assert!(ERR_TOP_COUNT.ends_with(" 256"));
        assert!(ERR_BURST.ends_with(" 9007199254740991"));
        assert_eq!(
            wait_exceeds(60000),
            "ERR wait exceeds tb.max-wait-ms (60000)"
        );
        assert_eq!(unknown_setting("x"), "ERR unknown setting 'x'");
    }

    /// Every error line of the Rust source is here: no other file spells
    /// one (a string literal that starts with an error code).
    #[test]
    fn no_error_line_outside_this_module() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stray = Vec::new();
        let mut dirs = vec![src];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.extension().is_none_or(|x| x != "rs") || path.ends_with("errors.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                for (i, line) in code.lines().enumerate() {
                    let l = line.trim_start();
                    // `"ERR "` alone is the code, which a setting's line drops.
                    if l.starts_with("//") || l.contains("(\"ERR \")") {
                        continue;
                    }
                    for code in [
                        "\"ERR ",
                        "\"WRONGTYPE ",
                        "\"OOM ",
                        "\"UNBLOCKED ",
                        "\"NOPERM ",
                    ] {
                        if l.contains(code) {
                            stray.push(format!("{}:{}: {}", path.display(), i + 1, l));
                        }
                    }
                }
            }
        }
        assert!(
            stray.is_empty(),
            "error lines outside src/errors.rs (name them there): {stray:#?}"
        );
    }
}
