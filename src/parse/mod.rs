//! Pure argument parsing: bytes in, typed values or a clear error out.
//!
//! Arguments arrive as raw bytes (they may hold anything, including invalid
//! UTF-8). Every parser is strict: no signs, spaces, NaN or infinities, and
//! every number is range-checked, so a bad argument is rejected before any key
//! is touched. Error messages never echo the argument back.
//!
//! By concern: `number` (integers), `rate` (the refill rate), `glob`
//! (CONFIG GET patterns), `consume` (TB.CONSUME, its LEASE and FLOW
//! options), `mconsume` (TB.MCONSUME), `small` (every other command).
//! This file holds what they share: [`Argv`], [`ArgsError`] and the
//! argument helpers. Every item is re-exported here, so callers name it
//! `parse::X` whatever file it lives in. The error lines live in
//! [`crate::errors`].

mod consume;
mod glob;
mod mconsume;
mod number;
mod rate;
mod small;

pub use consume::*;
pub use glob::*;
pub use mconsume::*;
pub use number::*;
pub use rate::*;
pub use small::*;

/// A parse failure, as the full error line sent to the client.
pub type ParseError = &'static str;

/// Case-insensitive ASCII comparison of an argument with a keyword.
pub fn is_keyword(arg: &[u8], keyword: &str) -> bool {
    arg.eq_ignore_ascii_case(keyword.as_bytes())
}

// Whole commands. Each parser reads one command's arguments (the command
// name at index 0) and returns typed values or the error to reply with; the
// handlers in `commands/` parse nothing themselves. Redis checks each
// command's arity before the handler runs; these parsers still accept any
// argument count (they are fuzzed) and answer a wrong one with `WrongArity`.

/// One call's arguments as the parsers read them, the command name at 0.
/// The Redis glue implements it over the call's argv; tests and the fuzzer
/// use slices.
pub trait Argv<'a> {
    /// Number of arguments, the command name included.
    fn count(&self) -> usize;
    /// Argument `i` (`i < count()`), as bytes.
    fn arg(&self, i: usize) -> &'a [u8];
}

impl<'a> Argv<'a> for [&'a [u8]] {
    fn count(&self) -> usize {
        self.len()
    }

    fn arg(&self, i: usize) -> &'a [u8] {
        self[i]
    }
}

/// Why a command's arguments were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgsError {
    /// An argument is invalid: the full error line.
    Invalid(ParseError),
    /// Too few or too many arguments.
    WrongArity,
}

impl From<ParseError> for ArgsError {
    fn from(e: ParseError) -> Self {
        ArgsError::Invalid(e)
    }
}

/// Argument `i`, or `WrongArity` when there are not that many.
fn nth<'a>(a: &(impl Argv<'a> + ?Sized), i: usize) -> Result<&'a [u8], ArgsError> {
    if i < a.count() {
        Ok(a.arg(i))
    } else {
        Err(ArgsError::WrongArity)
    }
}

/// `WrongArity` unless there are exactly `n` arguments.
fn exactly<'a>(a: &(impl Argv<'a> + ?Sized), n: usize) -> Result<(), ArgsError> {
    if a.count() == n {
        Ok(())
    } else {
        Err(ArgsError::WrongArity)
    }
}
