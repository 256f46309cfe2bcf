//! The command table: every command the module registers, in order. Each
//! command's whole path is in its own file: its spec (name, flags, key
//! specs, ACL categories, arity and docs, written once), its handler, and the
//! parser it calls in `parse/`.
//!
//! No raw pointer and no `unsafe` in here: handlers see Redis only through
//! the glue's lifetime-bound types (`Ctx`, `Args`, `KeyName`, `BucketKey`).

#![deny(unsafe_code)]

pub mod config;
pub mod consume;
pub mod info;
pub mod mconsume;
pub mod refund;
pub mod release;
pub mod setstate;
pub mod throttle;
pub mod top;

use crate::glue::command::Registration;

/// Every command, in registration order.
pub const ALL: &[Registration] = &[
    Registration::of::<consume::Consume>(),
    Registration::of::<mconsume::Mconsume>(),
    Registration::of::<refund::Refund>(),
    Registration::of::<release::Release>(),
    Registration::of::<throttle::Throttle>(),
    Registration::of::<info::Info>(),
    Registration::of::<top::Top>(),
    Registration::of::<config::Config>(),
    Registration::of::<setstate::SetState>(),
];
