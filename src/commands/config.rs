//! `TB.CONFIG GET pattern | SET name value | RESETSTAT`: module settings in
//! the style of FT.CONFIG; the same settings are native configs (`tb.*`).

use crate::glue::command::{block, one_of, pattern, pure_token, string, Arity, Command};
use crate::glue::command::{Keys, Spec};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::{config, stats};
use crate::parse::{self, glob, ConfigArgs};
use crate::{errors, settings};

/// `TB.CONFIG`.
pub struct Config;

impl Command for Config {
    const SPEC: &'static Spec = &Spec {
        name: c"tb.config",
        run,
        arity: Arity::AtLeast(2),
        flags: c"admin deny-script",
        keys: Keys::None,
        acl: c"admin dangerous",
        summary: c"Gets or sets the module's settings, or resets its INFO counters",
        args: &[one_of(
            c"action",
            &[
                pattern(c"pattern").token(c"GET"),
                block(c"set", &[string(c"name"), string(c"value")]).token(c"SET"),
                pure_token(c"resetstat", c"RESETSTAT"),
            ],
        )],
    };
}

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let r = ctx.reply();
    match parse::config_args(args)? {
        ConfigArgs::Get(pattern) => {
            let hits: Vec<_> = settings::ALL
                .iter()
                .filter(|s| glob(pattern, s.name.as_bytes()))
                .collect();
            r.array(hits.len() * 2);
            for s in hits {
                r.bulk(s.name.as_bytes());
                r.bulk(s.show().as_bytes());
            }
        }
        ConfigArgs::Set(name, value) => {
            let setting = settings::find(name).ok_or_else(|| {
                CmdError::Owned(errors::unknown_setting(&String::from_utf8_lossy(name)))
            })?;
            config::set(setting, value)?;
            r.ok();
        }
        ConfigArgs::ResetStat => {
            stats::reset();
            r.ok();
        }
    }
    Ok(())
}
