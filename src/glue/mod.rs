//! Everything that touches the Redis module API. Commands call into these
//! helpers; nothing here decides a bucket's arithmetic.

pub mod blocking;
pub mod clock;
pub mod command;
pub mod config;
pub mod datatype;
pub mod entry;
pub mod eviction;
pub mod lease_wait;
pub mod log;
pub mod random;
pub mod reply;
pub mod setstate;
pub mod stats;
pub mod store;
pub mod top;
pub mod waker;
