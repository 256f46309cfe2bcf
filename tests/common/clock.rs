//! The `LD_PRELOAD` clock shim of `tests/clockshift/` (libfaketime hangs
//! these servers): a server started with [`Clock::env`] reads its wall clock
//! through a control file the test writes, stepped or frozen.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::Server;

/// Builds the shim once per test binary (with the C compiler cargo itself
/// links with) and returns its path.
pub fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clockshift/clockshift.c");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("clockshift");
        fs::create_dir_all(&dir).expect("create the shim's directory");
        let out = dir.join("libclockshift.so");
        let tmp = dir.join(format!("libclockshift.so.{}", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let status = Command::new(&cc)
            .args([
                "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o",
            ])
            .arg(&tmp)
            .arg(&src)
            .arg("-ldl")
            .status()
            .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
        assert!(status.success(), "{cc} failed to build {}", src.display());
        fs::rename(&tmp, &out).expect("move the shim into place");
        out
    })
}

/// The control file of one server's clock (see `clockshift.c`).
pub struct Clock {
    file: File,
    /// The control file.
    pub path: PathBuf,
    seq: i64,
}

impl Clock {
    pub fn new(dir: &Path) -> Clock {
        let path = dir.join("clock");
        let file = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .expect("create the clock file");
        let mut c = Clock { file, path, seq: 0 };
        c.set(0, 0);
        c
    }

    /// Writes `mode` and `value` under the seqlock: odd while writing.
    pub fn set(&mut self, mode: i64, value: i64) {
        self.file
            .write_all_at(&(self.seq + 1).to_ne_bytes(), 0)
            .unwrap();
        let mut fields = [0u8; 16];
        fields[..8].copy_from_slice(&mode.to_ne_bytes());
        fields[8..].copy_from_slice(&value.to_ne_bytes());
        self.file.write_all_at(&fields, 8).unwrap();
        self.seq += 2;
        self.file.write_all_at(&self.seq.to_ne_bytes(), 0).unwrap();
    }

    /// The real clock shifted by `offset_us`.
    pub fn shift(&mut self, offset_us: i64) {
        self.set(0, offset_us);
    }

    /// The clock stopped at `at_us`.
    pub fn freeze(&mut self, at_us: i64) {
        self.set(1, at_us);
    }
}

impl Clock {
    /// The environment that makes a server read its clock through this
    /// control file (for `ServerConfig::env`).
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), shim().display().to_string()),
            ("TB_CLOCK_FILE".into(), self.path.display().to_string()),
        ]
    }
}

/// Turns active expiry off on `s`, a server on a frozen clock. Its cycle
/// deletes a key whose expiry is the current millisecond (Redis 8.2 expires
/// at `now >= t`) while a lookup keeps it (`now > t`), at moments set by the
/// real time of the cycle, so what a test reads would depend on when the
/// cycle last ran; lookups alone expire keys the same way every run.
pub fn no_active_expiry(s: &Server) {
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query(&mut s.conn())
        .expect("DEBUG SET-ACTIVE-EXPIRE 0");
}
