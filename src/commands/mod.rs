//! Command table: every command's name, entry point, flags and key positions.
//! Each command's whole path starts in its own file here.

pub mod config;
pub mod consume;
pub mod info;
pub mod mconsume;
pub mod refund;
pub mod setstate;
pub mod throttle;
pub mod top;

use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr;

use redis_module::raw;

use crate::command_entry;

command_entry!(consume_entry, consume::run);
command_entry!(info_entry, info::run);
command_entry!(config_entry, config::run);
command_entry!(setstate_entry, setstate::run);
command_entry!(refund_entry, refund::run);
command_entry!(mconsume_entry, mconsume::run);
command_entry!(throttle_entry, throttle::run);
command_entry!(top_entry, top::run);

type Entry =
    extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// One registered command.
struct Spec {
    name: &'static CStr,
    entry: Entry,
    /// Redis command flags.
    flags: &'static CStr,
    /// Key positions: first, last (-1 = last argument), step.
    keys: (c_int, c_int, c_int),
    /// ACL categories, applied on servers that support them (7.2+).
    acl: &'static CStr,
    /// What `COMMAND DOCS` shows.
    doc: Doc,
}

/// A command's documentation for `COMMAND DOCS` (RedisModule_SetCommandInfo).
struct Doc {
    summary: &'static CStr,
    /// Argument count checked by Redis before the command runs, the command
    /// name included; `-n` means at least `n`. It must agree with the
    /// handler's own check, which stays in place.
    arity: c_int,
    args: &'static [Arg],
}

/// One argument as `COMMAND DOCS` describes it.
struct Arg {
    name: &'static CStr,
    kind: raw::RedisModuleCommandArgType,
    /// The keyword in front of the value (`RESERVE ms`), or the whole
    /// argument for a pure token.
    token: Option<&'static CStr>,
    /// `REDISMODULE_CMD_ARG_*` flags.
    flags: u32,
    /// Sub-arguments of a `ONEOF` or `BLOCK`.
    sub: &'static [Arg],
}

/// Module version in which every command first appeared (`since` in
/// `COMMAND DOCS`).
const SINCE: &CStr = crate::version::FIRST_RELEASE;

const fn arg(name: &'static CStr, kind: raw::RedisModuleCommandArgType) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        flags: raw::REDISMODULE_CMD_ARG_NONE,
        sub: &[],
    }
}

const fn key(name: &'static CStr) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
    )
}

const fn string(name: &'static CStr) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
    )
}

const fn integer(name: &'static CStr) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
    )
}

/// A keyword on its own (`ATMOST`).
const fn pure_token(name: &'static CStr, token: &'static CStr) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
    )
    .token(token)
}

const fn one_of(name: &'static CStr, sub: &'static [Arg]) -> Arg {
    Arg {
        sub,
        ..arg(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
        )
    }
}

const fn block(name: &'static CStr, sub: &'static [Arg]) -> Arg {
    Arg {
        sub,
        ..arg(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
        )
    }
}

impl Arg {
    const fn token(self, token: &'static CStr) -> Arg {
        Arg {
            token: Some(token),
            ..self
        }
    }

    const fn optional(self) -> Arg {
        Arg {
            flags: self.flags | raw::REDISMODULE_CMD_ARG_OPTIONAL,
            ..self
        }
    }

    const fn multiple(self) -> Arg {
        Arg {
            flags: self.flags | raw::REDISMODULE_CMD_ARG_MULTIPLE,
            ..self
        }
    }
}

/// `ATMOST [MIN chunk]`: a partial grant, of at least `chunk` tokens.
const ATMOST_ARGS: &[Arg] = &[
    pure_token(c"atmost", c"ATMOST"),
    integer(c"chunk").token(c"MIN").optional(),
];

/// The `ATMOST [MIN chunk]` block of the consume commands.
const fn atmost_block() -> Arg {
    block(c"atmost", ATMOST_ARGS)
}

const COMMANDS: &[Spec] = &[
    Spec {
        name: c"tb.consume",
        entry: consume_entry,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast",
        doc: Doc {
            summary:
                c"Takes n tokens (default 1) from a token bucket refilled at rate up to capacity",
            arity: -4,
            args: &[
                key(c"key"),
                string(c"rate"),
                integer(c"capacity"),
                integer(c"n").optional(),
                one_of(
                    c"wait",
                    &[
                        integer(c"reserve-ms").token(c"RESERVE"),
                        integer(c"block-ms").token(c"BLOCK"),
                    ],
                )
                .optional(),
                atmost_block().optional(),
            ],
        },
    },
    Spec {
        name: c"tb.mconsume",
        entry: mconsume_entry,
        flags: c"write deny-oom getkeys-api",
        keys: (2, 2, 1),
        acl: c"write",
        doc: Doc {
            summary: c"Takes tokens from several buckets in one slot, all or nothing",
            arity: -6,
            args: &[
                integer(c"numkeys"),
                key(c"key").multiple(),
                block(
                    c"limit",
                    &[string(c"rate"), integer(c"capacity"), integer(c"n")],
                )
                .multiple(),
                one_of(
                    c"mode",
                    &[integer(c"reserve-ms").token(c"RESERVE"), atmost_block()],
                )
                .optional(),
            ],
        },
    },
    Spec {
        name: c"tb.refund",
        entry: refund_entry,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast",
        doc: Doc {
            summary: c"Gives n tokens back to a bucket, never above its capacity",
            arity: 3,
            args: &[key(c"key"), integer(c"n")],
        },
    },
    Spec {
        name: c"cl.throttle",
        entry: throttle_entry,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast",
        doc: Doc {
            summary:
                c"redis-cell compatible throttle: count per period with a burst of max_burst + 1",
            arity: -5,
            args: &[
                key(c"key"),
                integer(c"max_burst"),
                integer(c"count"),
                integer(c"period"),
                integer(c"quantity").optional(),
            ],
        },
    },
    Spec {
        name: c"tb.info",
        entry: info_entry,
        flags: c"readonly fast",
        keys: (1, 1, 1),
        acl: c"read fast",
        doc: Doc {
            summary: c"Shows a bucket's tokens, limits and expiry as of now, without writing",
            arity: 2,
            args: &[key(c"key")],
        },
    },
    Spec {
        name: c"tb.top",
        entry: top_entry,
        flags: c"readonly allow-stale allow-loading",
        keys: (0, 0, 0),
        acl: c"read slow",
        doc: Doc {
            summary: c"Lists the keys this node denied most, or made wait longest, recently",
            arity: -1,
            args: &[
                one_of(
                    c"metric",
                    &[
                        pure_token(c"denied", c"DENIED"),
                        pure_token(c"waits", c"WAITS"),
                    ],
                )
                .optional(),
                integer(c"count").token(c"COUNT").optional(),
            ],
        },
    },
    Spec {
        name: c"tb.config",
        entry: config_entry,
        flags: c"admin deny-script",
        keys: (0, 0, 0),
        acl: c"admin dangerous",
        doc: Doc {
            summary: c"Gets or sets the module's settings, or resets its INFO counters",
            arity: -2,
            args: &[one_of(
                c"action",
                &[
                    arg(
                        c"pattern",
                        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PATTERN,
                    )
                    .token(c"GET"),
                    block(c"set", &[string(c"name"), string(c"value")]).token(c"SET"),
                    pure_token(c"resetstat", c"RESETSTAT"),
                ],
            )],
        },
    },
    Spec {
        name: c"tb.setstate",
        entry: setstate_entry,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast dangerous",
        doc: Doc {
            summary:
                c"Internal: sets a bucket's absolute state (what replicas and the AOF receive)",
            arity: -3,
            args: &[
                key(c"key"),
                one_of(
                    c"state",
                    &[
                        string(c"compact_state"),
                        block(
                            c"decimal_state",
                            &[
                                integer(c"tokens_nanos"),
                                integer(c"updated_us"),
                                integer(c"rate_num"),
                                integer(c"rate_den"),
                                integer(c"capacity"),
                                integer(c"expire_at_ms"),
                            ],
                        ),
                    ],
                ),
            ],
        },
    },
];

/// Registers every command; on failure logs which one and returns an error.
pub fn register_all(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    // SAFETY: called from RedisModule_OnLoad with its live context; the API
    // pointers were filled by RedisModule_Init.
    unsafe {
        let create = raw::RedisModule_CreateCommand.ok_or("no CreateCommand")?;
        for c in COMMANDS {
            let status = create(
                ctx,
                c.name.as_ptr(),
                Some(c.entry),
                c.flags.as_ptr(),
                c.keys.0,
                c.keys.1,
                c.keys.2,
            );
            if status != raw::Status::Ok as c_int {
                return Err(format!("failed to create command {:?}", c.name));
            }
            // ACL categories exist from Redis 7.2; older servers skip them.
            if let (Some(get), Some(set_acl)) = (
                raw::RedisModule_GetCommand,
                raw::RedisModule_SetCommandACLCategories,
            ) {
                let cmd = get(ctx, c.name.as_ptr());
                if cmd.is_null() || set_acl(cmd, c.acl.as_ptr()) != raw::Status::Ok as c_int {
                    return Err(format!("failed to set ACL categories of {:?}", c.name));
                }
            }
            if let Err(e) = set_docs(ctx, c) {
                redis_module::logging::log_warning(format!(
                    "tb: COMMAND DOCS for {:?} unavailable ({e}); the command works without them",
                    c.name
                ));
            }
        }
    }
    Ok(())
}

/// Layout of the structs below as this build knows them; Redis reads the
/// arrays with these sizes, so a server with smaller structs still works.
const INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

/// Attaches the command's summary, arity and arguments (shown by `COMMAND
/// DOCS`, Redis 7.0+). Key positions stay those given to CreateCommand (no
/// key specs are passed). A failure only loses the documentation.
fn set_docs(ctx: *mut raw::RedisModuleCtx, c: &Spec) -> Result<(), &'static str> {
    // SAFETY: the API pointers were filled by RedisModule_Init and are only
    // read, on the main thread.
    let (get, set_info) = unsafe { (raw::RedisModule_GetCommand, raw::RedisModule_SetCommandInfo) };
    let (Some(get), Some(set_info)) = (get, set_info) else {
        return Err("the server has no RedisModule_SetCommandInfo");
    };
    // Owns every argument array until Redis has copied them.
    let mut arrays = Vec::new();
    let info = raw::RedisModuleCommandInfo {
        version: &INFO_VERSION,
        summary: c.doc.summary.as_ptr(),
        complexity: ptr::null(),
        since: SINCE.as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: c.doc.arity,
        key_specs: ptr::null_mut(),
        args: raw_args(c.doc.args, &mut arrays),
    };
    // SAFETY: ctx is the OnLoad context and the command was just created;
    // `info` and every array and string it points to outlive the call, and
    // Redis copies what it keeps.
    let status = unsafe {
        let cmd = get(ctx, c.name.as_ptr());
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
            // Key arguments refer to the one key spec made from CreateCommand's
            // (first, last, step).
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
