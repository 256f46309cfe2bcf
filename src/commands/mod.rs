//! Command table: every command's name, entry point, flags and key positions.
//! Each command's whole path starts in its own file here.

pub mod config;
pub mod consume;
pub mod info;
pub mod mconsume;
pub mod refund;
pub mod setstate;
pub mod throttle;

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use crate::command_entry;

command_entry!(consume_entry, consume::run);
command_entry!(info_entry, info::run);
command_entry!(config_entry, config::run);
command_entry!(setstate_entry, setstate::run);
command_entry!(refund_entry, refund::run);
command_entry!(mconsume_entry, mconsume::run);
command_entry!(throttle_entry, throttle::run);

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
}

const COMMANDS: &[Spec] = &[
    Spec {
        name: c"tb.consume",
        entry: consume_entry,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast",
    },
    Spec {
        name: c"tb.mconsume",
        entry: mconsume_entry,
        flags: c"write deny-oom getkeys-api",
        keys: (2, 2, 1),
        acl: c"write",
    },
    Spec {
        name: c"tb.refund",
        entry: refund_entry,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast",
    },
    Spec {
        name: c"cl.throttle",
        entry: throttle_entry,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast",
    },
    Spec {
        name: c"tb.info",
        entry: info_entry,
        flags: c"readonly fast",
        keys: (1, 1, 1),
        acl: c"read fast",
    },
    Spec {
        name: c"tb.config",
        entry: config_entry,
        flags: c"admin deny-script",
        keys: (0, 0, 0),
        acl: c"admin dangerous",
    },
    Spec {
        name: c"tb.setstate",
        entry: setstate_entry,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast dangerous",
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
        }
    }
    Ok(())
}
