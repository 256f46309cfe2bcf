//! Module settings as Redis sees them. Each setting of [`crate::settings`] is
//! a native module config (`CONFIG GET tb.*`, `CONFIG SET`, redis.conf lines,
//! `MODULE LOADEX ... CONFIG`), registered here with the table's bounds, and
//! is also served by `TB.CONFIG GET/SET`; both read and write the table's
//! value.
//!
//! The crate's `configurations:` section of `redis_module!` is not used: it
//! takes module arguments without checking them (an unknown name, a wrong
//! case or `expire-idle false` loaded the module on defaults), ignores the
//! status of each registration and of `RM_LoadConfigs` (a bad `tb.*` line in
//! redis.conf was dropped silently), and its range check is not ours.

use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_longlong, c_void};

use redis_module::raw;

use super::entry::guard;
use super::eviction;
use crate::settings::{self, Kind, Setting, EXPIRE_IDLE, MAX_BLOCKED, MAX_WAIT};

/// Whether buckets' keys expire when full (`expire-idle`).
pub fn expire_idle() -> bool {
    EXPIRE_IDLE.get() != 0
}

/// The `max-wait-ms` setting.
pub fn max_wait_ms() -> u64 {
    MAX_WAIT.get() as u64
}

/// The `max-blocked` setting.
pub fn max_blocked() -> i64 {
    MAX_BLOCKED.get()
}

/// Sets `setting` from `TB.CONFIG SET`, then does what a native `CONFIG
/// SET` of it triggers (the config-change event does not fire for
/// `TB.CONFIG`): `expire-idle` re-checks whether eviction can take buckets.
pub fn set(setting: &'static Setting, text: &[u8]) -> Result<(), &'static str> {
    setting.store(setting.parse(text)?);
    if std::ptr::eq(setting, &EXPIRE_IDLE) {
        eviction::refresh();
    }
    Ok(())
}

/// Applies the module arguments (validated: see [`settings::module_args`])
/// as the settings' defaults, registers every setting as a native config, and
/// loads the `tb.*` config lines and `MODULE LOADEX` configs, which override
/// the module arguments. Must run inside `RedisModule_OnLoad`. On error the
/// module must refuse to load; the message says why.
pub fn register(ctx: *mut raw::RedisModuleCtx, args: &[&[u8]]) -> Result<(), String> {
    for (setting, value) in settings::module_args(args)? {
        setting.store(value);
    }
    // SAFETY: the API pointers are filled by RedisModule_Init and only read.
    let (numeric, boolean, load) = unsafe {
        (
            raw::RedisModule_RegisterNumericConfig,
            raw::RedisModule_RegisterBoolConfig,
            raw::RedisModule_LoadConfigs,
        )
    };
    let (Some(numeric), Some(boolean), Some(load)) = (numeric, boolean, load) else {
        return Err("this server has no module configs (Redis 7.0 or later is needed)".into());
    };
    for &setting in &settings::ALL {
        let name = CString::new(setting.name).map_err(|e| e.to_string())?;
        let privdata = std::ptr::from_ref::<Setting>(setting)
            .cast_mut()
            .cast::<c_void>();
        let flags = raw::REDISMODULE_CONFIG_DEFAULT;
        // SAFETY: ctx is the OnLoad context; Redis copies `name`; privdata is
        // a &'static Setting, valid for the life of the process, and the
        // callbacks only read it (through `setting_of`).
        let status = unsafe {
            match setting.kind {
                Kind::Bool => boolean(
                    ctx,
                    name.as_ptr(),
                    setting.get() as c_int,
                    flags,
                    Some(get_bool),
                    Some(set_bool),
                    None,
                    privdata,
                ),
                Kind::Int { .. } => numeric(
                    ctx,
                    name.as_ptr(),
                    setting.get(),
                    flags,
                    0,
                    setting.max(),
                    Some(get_numeric),
                    Some(set_numeric),
                    None,
                    privdata,
                ),
            }
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(format!("cannot register the config tb.{}", setting.name));
        }
    }
    // SAFETY: ctx is the OnLoad context, after every config is registered.
    if unsafe { load(ctx) } != raw::REDISMODULE_OK as c_int {
        return Err(
            "a tb.* config line or MODULE LOADEX config has a bad value \
             (the line above says which)"
                .into(),
        );
    }
    Ok(())
}

/// Checks the `tb.*` lines of the server's config file (and the files it
/// `include`s) against the settings: a misspelled name refuses the load with
/// a log line that names the file, the line and the closest setting. Redis
/// 7.0 would otherwise stop with only "Module Configuration detected without
/// loadmodule directive". Files that cannot be read are left to Redis.
pub fn check_config_file() -> Result<(), String> {
    let Some(path) = eviction::server_info_field(c"server", c"config_file") else {
        return Ok(());
    };
    let mut problems = Vec::new();
    let mut files = vec![path];
    let mut seen = 0;
    while let Some(file) = files.pop() {
        seen += 1;
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        problems.extend(
            settings::unknown_config_lines(&text)
                .into_iter()
                .map(|p| format!("{file} {p}")),
        );
        if seen < 16 {
            files.extend(text.lines().filter_map(|l| {
                let mut words = l.split_whitespace();
                let include = words.next()?.eq_ignore_ascii_case("include");
                include.then(|| words.next().map(String::from))?
            }));
        }
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(problems.join("; ")),
    }
}

/// The setting a config callback was registered with.
///
/// # Safety
/// `privdata` must be the pointer [`register`] passed for a setting.
unsafe fn setting_of(privdata: *mut c_void) -> &'static Setting {
    // SAFETY: per the contract, privdata came from a &'static Setting.
    unsafe { &*privdata.cast_const().cast::<Setting>() }
}

/// Stores `val` if the setting accepts it; else leaves an error for Redis.
fn store_checked(
    setting: &'static Setting,
    val: i64,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    if (0..=setting.max()).contains(&val) {
        setting.store(val);
        return raw::REDISMODULE_OK as c_int;
    }
    let msg = setting.error.strip_prefix("ERR ").unwrap_or(setting.error);
    if !err.is_null() {
        // SAFETY: a NULL context makes a string Redis owns and frees after
        // showing it; err points to Redis' out-parameter.
        unsafe {
            *err = raw::RedisModule_CreateString.unwrap()(
                std::ptr::null_mut(),
                msg.as_ptr().cast::<c_char>(),
                msg.len(),
            );
        }
    }
    raw::REDISMODULE_ERR as c_int
}

unsafe extern "C" fn get_numeric(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    // SAFETY: Redis passes back the privdata given at registration.
    guard(0, || unsafe { setting_of(privdata) }.get())
}

unsafe extern "C" fn set_numeric(
    _name: *const c_char,
    val: c_longlong,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: Redis passes back the privdata given at registration.
    let setting = unsafe { setting_of(privdata) };
    guard(raw::REDISMODULE_ERR as c_int, || {
        store_checked(setting, val, err)
    })
}

unsafe extern "C" fn get_bool(_name: *const c_char, privdata: *mut c_void) -> c_int {
    // SAFETY: Redis passes back the privdata given at registration.
    guard(0, || unsafe { setting_of(privdata) }.get() as c_int)
}

unsafe extern "C" fn set_bool(
    _name: *const c_char,
    val: c_int,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: Redis passes back the privdata given at registration.
    let setting = unsafe { setting_of(privdata) };
    guard(raw::REDISMODULE_ERR as c_int, || {
        store_checked(setting, i64::from(val != 0), err)
    })
}
