//! The command table's machinery: what each command declares about itself
//! ([`Spec`], written once, next to its handler in `commands/`), how it is
//! registered with Redis, and how a call reaches its handler.
//!
//! Why not the `redis-module` crate's `#[command]` macro: it registers
//! through `RedisModule_SetCommandACLCategories`, which Redis 7.0 does not
//! have, so a module using it fails to load on 7.0 (crate 2.0.8; the crate
//! notes, findings F1 and F2). This does the same with the 7.0 API:
//! `RedisModule_CreateCommand` for the command and its legacy key range,
//! `RedisModule_SetCommandInfo` (7.0+) for the arity, the key specs and
//! `COMMAND DOCS`, and ACL categories where the server has them (7.2+).

use std::ffi::CStr;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};

use redis_module::{raw, Context};

use super::entry::{Args, CmdError, CmdResult, Ctx};
use crate::errors::{self, ERR_PANIC_MAY_HAVE_EFFECTS, ERR_PANIC_NO_EFFECT};
use crate::parse;

/// A command's handler.
pub type Handler = for<'a> fn(&Ctx<'a>, &Args<'a>) -> CmdResult;

/// How many arguments a command takes, its name included.
#[derive(Clone, Copy, Debug)]
pub enum Arity {
    /// Exactly this many.
    Exactly(usize),
    /// At least this many.
    AtLeast(usize),
    /// From the first to the second, inclusive.
    Between(usize, usize),
}

impl Arity {
    /// The arity as Redis writes it (`-n`: at least `n`); Redis refuses
    /// other counts before the command runs.
    fn redis(self) -> c_int {
        match self {
            Arity::Exactly(n) => n as c_int,
            Arity::AtLeast(n) | Arity::Between(n, _) => -(n as c_int),
        }
    }

    /// Whether `n` arguments are accepted.
    fn admits(self, n: usize) -> bool {
        match self {
            Arity::Exactly(m) => n == m,
            Arity::AtLeast(m) => n >= m,
            Arity::Between(lo, hi) => (lo..=hi).contains(&n),
        }
    }
}

/// What a command does with its keys, as ACL and `COMMAND INFO` see it.
#[derive(Clone, Copy, Debug)]
pub enum Access {
    /// Reads the bucket, changes nothing (`%R~` patterns allow it).
    Read,
    /// Reads the bucket and may change or delete it (read and write
    /// permission).
    Update,
    /// Replaces the bucket without reading it (write permission).
    Overwrite,
}

impl Access {
    /// The `REDISMODULE_CMD_KEY_*` flags.
    fn flags(self) -> u64 {
        u64::from(match self {
            Access::Read => raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
            Access::Update => {
                raw::REDISMODULE_CMD_KEY_RW
                    | raw::REDISMODULE_CMD_KEY_ACCESS
                    | raw::REDISMODULE_CMD_KEY_UPDATE
            }
            Access::Overwrite => raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE,
        })
    }
}

/// Where a command's keys are.
#[derive(Clone, Copy, Debug)]
pub enum Keys {
    /// No key.
    None,
    /// One key, argument 1.
    One(Access),
    /// `numkeys` at argument 1, then that many keys. The command also
    /// carries the `getkeys-api` flag: the glue answers Redis' key position
    /// requests from `numkeys` wherever the key spec cannot be used.
    Counted(Access),
}

/// One command: everything Redis is told about it, and its handler.
pub struct Spec {
    /// Name, lower case; also the event name of its keyspace notifications.
    pub name: &'static CStr,
    /// The handler.
    pub run: Handler,
    /// Argument count, the name included.
    pub arity: Arity,
    /// Redis command flags (`write deny-oom fast`, ...).
    pub flags: &'static CStr,
    /// Key positions and access.
    pub keys: Keys,
    /// ACL categories, applied on servers that have them (7.2+).
    pub acl: &'static CStr,
    /// One line for `COMMAND DOCS`.
    pub summary: &'static CStr,
    /// The arguments as `COMMAND DOCS` shows them.
    pub args: &'static [Arg],
}

/// A command type: its [`Spec`] as a constant, so that the glue can make an
/// entry point for it.
pub trait Command {
    /// The command's spec.
    const SPEC: &'static Spec;
}

/// Redis' calling convention for commands.
type Entry =
    extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// A command ready to register: its spec and its entry point.
pub struct Registration {
    spec: &'static Spec,
    entry: Entry,
}

impl Registration {
    /// The command's spec.
    pub fn spec(&self) -> &'static Spec {
        self.spec
    }

    /// The registration of command `C`.
    pub const fn of<C: Command>() -> Registration {
        Registration {
            spec: C::SPEC,
            entry: entry::<C>,
        }
    }
}

/// The entry point Redis calls for command `C`.
extern "C" fn entry<C: Command>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    dispatch(ctx, argv, argc, C::SPEC)
}

/// The reply to a handler that panicked.
fn panic_reply(may_have_effects: bool) -> &'static str {
    if may_have_effects {
        ERR_PANIC_MAY_HAVE_EFFECTS
    } else {
        ERR_PANIC_NO_EFFECT
    }
}

/// Runs one call of `spec`'s command: answers key position requests, checks
/// the arity, runs the handler, and turns its errors into error replies. No
/// panic crosses into Redis (that would abort the server).
fn dispatch(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    spec: &'static Spec,
) -> c_int {
    let Some(ptr) = NonNull::new(ctx) else {
        return raw::Status::Err as c_int;
    };
    // SAFETY: Redis passes the live context and `argc` live arguments of
    // this call; neither wrapper outlives this function.
    let (ctx, args) = unsafe { (Ctx::new(ptr, spec.name), Args::new(argv, argc)) };
    if let Keys::Counted(access) = spec.keys {
        if key_positions(&ctx, &args, access) {
            return raw::Status::Ok as c_int;
        }
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        if !spec.arity.admits(args.len()) {
            return Err(CmdError::WrongArity);
        }
        (spec.run)(&ctx, &args)
    }));
    let r = ctx.reply();
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(CmdError::Msg(m))) => r.error(m),
        Ok(Err(CmdError::Owned(m))) => r.error(&m),
        Ok(Err(CmdError::WrongArity)) => r.wrong_arity(),
        Ok(Err(CmdError::WrongType)) => r.error(errors::ERR_WRONGTYPE),
        Err(_) => r.error(panic_reply(ctx.may_have_effects())),
    }
    raw::Status::Ok as c_int
}

/// Answers Redis' "where are the keys?" (COMMAND GETKEYS, cluster routing,
/// ACL) for a [`Keys::Counted`] command, when the key spec cannot: the
/// arguments 2 to 1 + numkeys that exist. Returns true if this call was
/// such a request.
fn key_positions(ctx: &Ctx<'_>, args: &Args<'_>, access: Access) -> bool {
    // SAFETY: the API pointers are set by RedisModule_Init; ctx is live.
    unsafe {
        if raw::RedisModule_IsKeysPositionRequest.unwrap()(ctx.as_ptr()) == 0 {
            return false;
        }
        let k = if args.len() >= 2 {
            parse::numkeys(args.bytes(1)).unwrap_or(0)
        } else {
            0
        };
        for pos in 2..(2 + k).min(args.len()) {
            match raw::RedisModule_KeyAtPosWithFlags {
                Some(with_flags) => with_flags(ctx.as_ptr(), pos as c_int, access.flags() as c_int),
                None => raw::RedisModule_KeyAtPos.unwrap()(ctx.as_ptr(), pos as c_int),
            }
        }
    }
    true
}

/// Registers every command of `all`; on failure returns which one.
pub fn register_all(ctx: &Context, all: &[Registration]) -> Result<(), String> {
    for r in all {
        register(ctx, r)?;
    }
    Ok(())
}

fn register(ctx: &Context, r: &Registration) -> Result<(), String> {
    let s = r.spec();
    let flags = s.flags.to_string_lossy();
    let (first, last, step) = match s.keys {
        Keys::None => (0, 0, 0),
        Keys::One(_) => (1, 1, 1),
        Keys::Counted(_) => {
            if !flags.split(' ').any(|f| f == "getkeys-api") {
                return Err(format!(
                    "{:?} counts its keys: it needs getkeys-api",
                    s.name
                ));
            }
            (2, 2, 1)
        }
    };
    // SAFETY: called from RedisModule_OnLoad with its live context; the API
    // pointers were set by RedisModule_Init; every string is NUL-terminated.
    unsafe {
        let create = raw::RedisModule_CreateCommand.ok_or("no RedisModule_CreateCommand")?;
        let status = create(
            ctx.get_raw(),
            s.name.as_ptr(),
            Some(r.entry),
            s.flags.as_ptr(),
            first,
            last,
            step,
        );
        if status != raw::Status::Ok as c_int {
            return Err(format!("failed to create command {:?}", s.name));
        }
        // ACL categories exist from Redis 7.2; older servers skip them.
        if let (Some(get), Some(set_acl)) = (
            raw::RedisModule_GetCommand,
            raw::RedisModule_SetCommandACLCategories,
        ) {
            let cmd = get(ctx.get_raw(), s.name.as_ptr());
            if cmd.is_null() || set_acl(cmd, s.acl.as_ptr()) != raw::Status::Ok as c_int {
                return Err(format!("failed to set ACL categories of {:?}", s.name));
            }
        }
    }
    if let Err(e) = set_info(ctx, s) {
        ctx.log_warning(&format!(
            "tb: key specs and COMMAND DOCS for {:?} unavailable ({e}); the command \
             still works, with every key read-write to ACL",
            s.name
        ));
    }
    Ok(())
}

/// Module version in which every command first appeared (`since` in
/// `COMMAND DOCS`).
const SINCE: &CStr = crate::version::FIRST_RELEASE;

/// Layout of the structs below as this build knows them; Redis reads the
/// arrays with these sizes, so a server with smaller structs still works.
const INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

/// Attaches the arity, the key specs and the documentation (Redis 7.0+).
/// A failure leaves the key range given to CreateCommand, every key
/// read-write, and no `COMMAND DOCS`.
fn set_info(ctx: &Context, s: &Spec) -> Result<(), &'static str> {
    // SAFETY: the API pointers are set by RedisModule_Init and only read,
    // on the main thread.
    let (get, set_info) = unsafe { (raw::RedisModule_GetCommand, raw::RedisModule_SetCommandInfo) };
    let (Some(get), Some(set_info)) = (get, set_info) else {
        return Err("the server has no RedisModule_SetCommandInfo");
    };
    // Owns every argument array until Redis has copied them.
    let mut arrays = Vec::new();
    let mut key_specs = key_specs(s.keys);
    let info = raw::RedisModuleCommandInfo {
        version: &INFO_VERSION,
        summary: s.summary.as_ptr(),
        complexity: ptr::null(),
        since: SINCE.as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: s.arity.redis(),
        key_specs: match s.keys {
            Keys::None => ptr::null_mut(),
            _ => key_specs.as_mut_ptr(),
        },
        args: raw_args(s.args, &mut arrays),
    };
    // SAFETY: ctx is the OnLoad context and the command was just created;
    // `info` and every array and string it points to outlive the call, and
    // Redis copies what it keeps.
    let status = unsafe {
        let cmd = get(ctx.get_raw(), s.name.as_ptr());
        if cmd.is_null() {
            return Err("RedisModule_GetCommand found no command");
        }
        set_info(cmd, &info)
    };
    if status == raw::Status::Ok as c_int {
        Ok(())
    } else {
        Err("RedisModule_SetCommandInfo refused the info (see the log line above)")
    }
}

/// The key spec of `keys` and the all-zero terminator Redis expects.
fn key_specs(keys: Keys) -> [raw::RedisModuleCommandKeySpec; 2] {
    // SAFETY: an all-zero key spec (null notes, zero flags, begin search
    // INVALID) is valid and is the array terminator.
    let mut specs: [raw::RedisModuleCommandKeySpec; 2] = unsafe { std::mem::zeroed() };
    let (access, keynum) = match keys {
        Keys::None => return specs,
        Keys::One(a) => (a, false),
        Keys::Counted(a) => (a, true),
    };
    let spec = &mut specs[0];
    spec.flags = access.flags();
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    spec.bs.index.pos = 1;
    if keynum {
        spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
        spec.fk.keynum.keynumidx = 0;
        spec.fk.keynum.firstkey = 1;
        spec.fk.keynum.keystep = 1;
    } else {
        spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
        spec.fk.range.lastkey = 0;
        spec.fk.range.keystep = 1;
        spec.fk.range.limit = 0;
    }
    specs
}

/// One argument as `COMMAND DOCS` describes it (the catalogue reads it too).
pub struct Arg {
    /// Name, as `COMMAND DOCS` shows it.
    pub(crate) name: &'static CStr,
    /// `REDISMODULE_ARG_TYPE_*`.
    pub(crate) kind: raw::RedisModuleCommandArgType,
    /// The keyword in front of the value (`RESERVE ms`), or the whole
    /// argument for a pure token.
    pub(crate) token: Option<&'static CStr>,
    /// `REDISMODULE_CMD_ARG_*` flags.
    pub(crate) flags: u32,
    /// Sub-arguments of a `ONEOF` or `BLOCK`.
    pub(crate) sub: &'static [Arg],
}

/// An argument of type `kind`.
pub const fn arg(name: &'static CStr, kind: raw::RedisModuleCommandArgType) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        flags: raw::REDISMODULE_CMD_ARG_NONE,
        sub: &[],
    }
}

/// A key name.
pub const fn key(name: &'static CStr) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
    )
}

/// A string.
pub const fn string(name: &'static CStr) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
    )
}

/// An integer.
pub const fn integer(name: &'static CStr) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
    )
}

/// A glob-style pattern.
pub const fn pattern(name: &'static CStr) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PATTERN,
    )
}

/// A keyword on its own (`ATMOST`).
pub const fn pure_token(name: &'static CStr, token: &'static CStr) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
    )
    .token(token)
}

/// One of `sub`.
pub const fn one_of(name: &'static CStr, sub: &'static [Arg]) -> Arg {
    Arg {
        sub,
        ..arg(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
        )
    }
}

/// All of `sub`, in order.
pub const fn block(name: &'static CStr, sub: &'static [Arg]) -> Arg {
    Arg {
        sub,
        ..arg(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
        )
    }
}

impl Arg {
    /// With the keyword `token` in front.
    pub const fn token(self, token: &'static CStr) -> Arg {
        Arg {
            token: Some(token),
            ..self
        }
    }

    /// May be left out.
    pub const fn optional(self) -> Arg {
        Arg {
            flags: self.flags | raw::REDISMODULE_CMD_ARG_OPTIONAL,
            ..self
        }
    }

    /// May be repeated.
    pub const fn multiple(self) -> Arg {
        Arg {
            flags: self.flags | raw::REDISMODULE_CMD_ARG_MULTIPLE,
            ..self
        }
    }
}

/// Converts `args` into a zero-terminated C array kept alive in `arrays`
/// (moving a `Vec` into `arrays` does not move its heap buffer).
fn raw_args(
    args: &[Arg],
    arrays: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    let mut out: Vec<raw::RedisModuleCommandArg> = Vec::with_capacity(args.len() + 1);
    for a in args {
        let subargs = if a.sub.is_empty() {
            ptr::null_mut()
        } else {
            raw_args(a.sub, arrays)
        };
        let is_key = a.kind == raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
        out.push(raw::RedisModuleCommandArg {
            name: a.name.as_ptr(),
            type_: a.kind,
            // Key arguments refer to the command's one key spec.
            key_spec_index: if is_key { 0 } else { -1 },
            token: a.token.map_or(ptr::null(), CStr::as_ptr),
            summary: ptr::null(),
            since: ptr::null(),
            flags: a.flags as c_int,
            deprecated_since: ptr::null(),
            subargs,
            display_text: ptr::null(),
        });
    }
    // SAFETY: an all-zero RedisModuleCommandArg (null pointers, zero ints) is
    // the terminator Redis expects.
    out.push(unsafe { std::mem::zeroed() });
    let p = out.as_mut_ptr();
    arrays.push(out);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arity_as_redis_writes_it_and_checks_it() {
        assert_eq!(Arity::Exactly(3).redis(), 3);
        assert_eq!(Arity::AtLeast(4).redis(), -4);
        assert_eq!(Arity::Between(5, 6).redis(), -5);
        assert!(Arity::Exactly(3).admits(3) && !Arity::Exactly(3).admits(4));
        assert!(Arity::AtLeast(4).admits(9) && !Arity::AtLeast(4).admits(3));
        let b = Arity::Between(5, 6);
        assert!(b.admits(5) && b.admits(6) && !b.admits(4) && !b.admits(7));
    }

    #[test]
    fn a_panic_after_a_write_is_not_reported_as_harmless() {
        assert_eq!(panic_reply(false), ERR_PANIC_NO_EFFECT);
        assert!(panic_reply(false).contains("had no effect"));
        assert!(panic_reply(true).contains("may have had effects"));
    }
}
