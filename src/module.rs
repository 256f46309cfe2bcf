//! The module declaration: name, data type, settings and start-up.

use std::sync::atomic::Ordering::Relaxed;

use redis_module::configuration::ConfigurationFlags;
use redis_module::{raw, redis_module, Context, RedisString, Status};

use crate::commands;
use crate::glue::command;
use crate::glue::config::{
    DEFAULT_MAX_BLOCKED, DEFAULT_MAX_WAIT_MS, EXPIRE_IDLE, MAX_BLOCKED, MAX_MAX_BLOCKED, MAX_WAIT,
};
use crate::glue::datatype::TB_TYPE;
use crate::glue::eviction;
use crate::parse::MAX_WAIT_MS;

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    // Module arguments become config defaults without a range check: do it here.
    let (wait, blocked) = (MAX_WAIT.load(Relaxed), MAX_BLOCKED.load(Relaxed));
    if !(0..=MAX_WAIT_MS as i64).contains(&wait) || !(0..=MAX_MAX_BLOCKED).contains(&blocked) {
        ctx.log_warning("tb: max-wait-ms must be 0..86400000 and max-blocked 0..1000000");
        return Status::Err;
    }
    std::panic::set_hook(Box::new(|info| {
        redis_module::logging::log_warning(format!("tb: panic caught, command failed: {info}"));
    }));
    // Handle RDB I/O errors ourselves (a corrupt RESTORE payload gets an
    // error, not an abort), and signal modified keys only when we really
    // write, so a denial does not touch WATCHed keys.
    ctx.set_module_options(
        raw::ModuleOptions::HANDLE_IO_ERRORS | raw::ModuleOptions::NO_IMPLICIT_SIGNAL_MODIFIED,
    );
    // Warn now if the eviction policy can evict buckets (see eviction.rs).
    eviction::refresh(ctx);
    match command::register_all(ctx, commands::ALL) {
        Ok(()) => Status::Ok,
        Err(e) => {
            ctx.log_warning(&format!("tb: {e}"));
            Status::Err
        }
    }
}

redis_module! {
    name: "tb",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [TB_TYPE],
    init: init,
    configurations: [
        i64: [
            ["max-wait-ms", &MAX_WAIT, DEFAULT_MAX_WAIT_MS, 0, MAX_WAIT_MS as i64, ConfigurationFlags::DEFAULT, None],
            ["max-blocked", &MAX_BLOCKED, DEFAULT_MAX_BLOCKED, 0, MAX_MAX_BLOCKED, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [
            ["expire-idle", &EXPIRE_IDLE, true, ConfigurationFlags::DEFAULT, None],
        ],
        enum: [],
        module_args_as_configuration: true,
    ]
}
