//! The module declaration: name, data type, settings and start-up.

use redis_module::configuration::ConfigurationFlags;
use redis_module::{raw, redis_module, Context, RedisString, Status};

use crate::commands;
use crate::glue::config::EXPIRE_IDLE;
use crate::glue::datatype::TB_TYPE;

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    std::panic::set_hook(Box::new(|info| {
        redis_module::logging::log_warning(format!("tb: panic caught, command failed: {info}"));
    }));
    // Handle RDB I/O errors ourselves (a corrupt RESTORE payload gets an
    // error, not an abort), and signal modified keys only when we really
    // write, so a denial does not touch WATCHed keys.
    ctx.set_module_options(
        raw::ModuleOptions::HANDLE_IO_ERRORS | raw::ModuleOptions::NO_IMPLICIT_SIGNAL_MODIFIED,
    );
    match commands::register_all(ctx.get_raw()) {
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
        i64: [],
        string: [],
        bool: [
            ["expire-idle", &EXPIRE_IDLE, true, ConfigurationFlags::DEFAULT, None],
        ],
        enum: [],
        module_args_as_configuration: true,
    ]
}
