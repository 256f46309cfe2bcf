//! `tb`: a token-bucket rate limiter as a native Redis module.
//!
//! Layout:
//! - [`bucket`], [`codec`] and [`parse`]: pure arithmetic, the state's
//!   encodings and argument parsing ([`errors`]: every error line they and
//!   the handlers answer), no Redis types, unit-tested with an
//!   injected clock; [`cell`]: `CL.THROTTLE`'s redis-cell reply;
//! - [`decide`]: what a consume call does to the stored state (bucket and
//!   leases) and what it answers, pure as well;
//! - [`topkeys`]: the heavy-hitter sketch behind `TB.TOP`, pure as well;
//! - [`waitq`]: the first-come-first-served queue of calls waiting for
//!   leases, pure; [`fair`]: a weighted fair share among flows waiting on a
//!   bucket, pure (not used by a command yet);
//! - `glue`: everything that touches the Redis module API (entry points, key
//!   access, replication, the data type, configs, statistics);
//! - `commands`: one file per command, each the whole path of that command;
//! - [`settings`] and [`version`]: the settings table and the module version,
//!   pure as well.

pub mod bucket;
pub mod cell;
pub mod codec;
pub mod decide;
pub mod errors;
pub mod fair;
pub mod lease;
pub mod parse;
pub mod settings;
pub mod topkeys;
pub mod version;
pub mod waitq;

// The command table and the glue also compile for unit tests (of the glue's
// pure parts, and of the catalogue, which reads the command specs); nothing
// registers them with Redis there, hence the dead-code allowance.
// The protocol catalogue (`protocol/catalogue.json`), a test that checks and
// writes it from the command specs, errors and limits.
#[cfg(all(test, feature = "module"))]
mod catalogue;
#[cfg(feature = "module")]
#[cfg_attr(test, allow(dead_code))]
mod commands;
#[cfg(feature = "module")]
#[cfg_attr(test, allow(dead_code))]
mod glue;
#[cfg(all(feature = "module", not(test)))]
mod module;
