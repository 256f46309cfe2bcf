//! The module declaration: name, version, data type, and start-up (settings,
//! commands).

use redis_module::{raw, redis_module, Context, RedisString, Status};

use crate::commands;
use crate::glue::command;
use crate::glue::datatype::TB_TYPE;
use crate::glue::entry::guard;
use crate::glue::{config, eviction, log};
use crate::version;

/// Runs inside `RedisModule_OnLoad`, after the data type is created. Any
/// error refuses the load, with a log line that says why; so does a panic,
/// which must not unwind into Redis.
fn init(ctx: &Context, args: &[RedisString]) -> Status {
    guard(Status::Err, || start(ctx, args))
}

fn start(ctx: &Context, args: &[RedisString]) -> Status {
    log::init(ctx.get_raw());
    let args: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
    let loaded = config::register(ctx.get_raw(), &args).and_then(|()| config::check_config_file());
    if let Err(e) = loaded {
        log::warning(&format!("tb: refusing to load: {e}"));
        return Status::Err;
    }
    std::panic::set_hook(Box::new(|info| {
        log::warning(&format!("tb: panic caught, command failed: {info}"));
    }));
    // Handle RDB I/O errors ourselves (a corrupt RESTORE payload gets an
    // error, not an abort), and signal modified keys only when we really
    // write, so a denial does not touch WATCHed keys.
    ctx.set_module_options(
        raw::ModuleOptions::HANDLE_IO_ERRORS | raw::ModuleOptions::NO_IMPLICIT_SIGNAL_MODIFIED,
    );
    // Warn now if the eviction policy can evict buckets (see eviction.rs).
    eviction::refresh();
    match command::register_all(ctx, commands::ALL) {
        Ok(()) => Status::Ok,
        Err(e) => {
            log::warning(&format!("tb: {e}"));
            Status::Err
        }
    }
}

// Settings are registered by `init` (glue/config.rs says why not through the
// macro's `configurations:` section).
redis_module! {
    name: "tb",
    version: version::NUMBER,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [TB_TYPE],
    init: init,
}
