//! `TB.CONFIG GET pattern | SET name value | RESETSTAT`: module settings in
//! the style of FT.CONFIG; the same settings are native configs (`tb.*`).

use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::{config, stats};
use crate::parse::{glob, is_keyword};
use crate::settings;

/// Handler of `TB.CONFIG`.
pub fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    if args.len() < 2 {
        return Err(CmdError::WrongArity);
    }
    let sub = args.bytes(1);
    let r = ctx.reply();
    if is_keyword(sub, "GET") {
        if args.len() != 3 {
            return Err(CmdError::WrongArity);
        }
        let pattern = args.bytes(2);
        let hits: Vec<_> = settings::ALL
            .iter()
            .filter(|s| glob(pattern, s.name.as_bytes()))
            .collect();
        r.array(hits.len() * 2);
        for s in hits {
            r.bulk(s.name.as_bytes());
            r.bulk(s.show().as_bytes());
        }
    } else if is_keyword(sub, "SET") {
        if args.len() != 4 {
            return Err(CmdError::WrongArity);
        }
        let name = args.bytes(2);
        let setting = settings::find(name).ok_or_else(|| {
            CmdError::Owned(format!(
                "ERR unknown setting '{}'",
                String::from_utf8_lossy(name)
            ))
        })?;
        config::set(setting, args.bytes(3))?;
        r.ok();
    } else if is_keyword(sub, "RESETSTAT") {
        if args.len() != 2 {
            return Err(CmdError::WrongArity);
        }
        stats::reset();
        r.ok();
    } else {
        return Err("ERR unknown subcommand: use GET pattern, SET name value, or RESETSTAT".into());
    }
    Ok(())
}
