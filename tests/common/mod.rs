//! Integration-test harness shared by every test file (`mod common;`).
//!
//! Each [`Server`] is a real `redis-server` child process on its own port and
//! data directory, started with the `tb` module loaded (unless
//! [`ServerConfig::load_module`] is false). Every wait in here has a
//! deadline: a server that does not come up, stop or reach a state in time
//! makes the test panic with the tail of its log instead of hanging.
//!
//! Environment:
//! - `REDIS_SERVER`: the `redis-server` binary to use (default: found on `PATH`).
//! - `TB_MODULE`: the module to load (default: `target/release/libtb.so`).

#![allow(dead_code)]

pub mod clock;
pub mod cluster;
pub mod rng;
pub mod vocab;

// Not every test file uses the vocabulary (harness.rs tests the harness).
#[allow(unused_imports)]
pub use self::vocab::*;

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, LazyLock, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// How long a server may take to answer its first PING.
const START_DEADLINE: Duration = Duration::from_secs(15);
/// How long a server may take to exit after SIGTERM before it gets SIGKILL.
const STOP_DEADLINE: Duration = Duration::from_secs(10);
/// How long reaping may take after SIGKILL (a formality: the kernel is quick).
const KILL_DEADLINE: Duration = Duration::from_secs(5);
/// Read/write timeout of connections returned by [`Server::conn`].
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Name of the server's logfile inside its data directory.
const LOG_FILE: &str = "redis.log";
/// Number of log lines quoted in panic messages.
const LOG_TAIL_LINES: usize = 30;
/// Cluster-bus offset: Redis Cluster uses `port + 10000`, so keep it free too.
const BUS_OFFSET: u16 = 10_000;

/// The `redis-server` binary to run: `$REDIS_SERVER` if set (a path, or a
/// name looked up on `PATH`), else `redis-server` found on `PATH`.
///
/// Panics with a hint to run `make test` if no binary can be found.
pub fn redis_server_bin() -> PathBuf {
    match std::env::var_os("REDIS_SERVER").filter(|v| !v.is_empty()) {
        Some(v) => {
            let p = PathBuf::from(&v);
            let found = if p.components().count() > 1 {
                p.is_file().then_some(p)
            } else {
                find_on_path(&v)
            };
            found.unwrap_or_else(|| panic!("REDIS_SERVER={v:?} does not exist or is not on PATH"))
        }
        None => find_on_path("redis-server".as_ref()).unwrap_or_else(|| {
            panic!("redis-server not found: run `make test`, which installs it")
        }),
    }
}

/// Looks `name` up in the directories of `$PATH`.
fn find_on_path(name: &std::ffi::OsStr) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The absolute path of the module to load: `$TB_MODULE` if set, else
/// `<crate root>/target/release/libtb.so`.
///
/// Panics with a hint to run `cargo build --release` if the file is missing.
pub fn module_path() -> PathBuf {
    let p = match std::env::var_os("TB_MODULE").filter(|v| !v.is_empty()) {
        Some(v) => PathBuf::from(v),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libtb.so"),
    };
    if !p.is_file() {
        panic!(
            "tb module not found at {}: run `cargo build --release` first \
             (or `make test`, which builds it)",
            p.display()
        );
    }
    // redis-server runs in its data directory, so the path must be absolute.
    p.canonicalize()
        .unwrap_or_else(|e| panic!("cannot resolve {}: {e}", p.display()))
}

/// The `(major, minor, patch)` version of [`redis_server_bin`], parsed from
/// `redis-server --version` (`Redis server v=7.0.15 sha=...`). Cached.
pub fn server_version() -> (u32, u32, u32) {
    static VERSION: OnceLock<(u32, u32, u32)> = OnceLock::new();
    *VERSION.get_or_init(|| {
        let bin = redis_server_bin();
        let out = Command::new(&bin)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {} --version: {e}", bin.display()));
        let text = String::from_utf8_lossy(&out.stdout);
        parse_version(&text)
            .unwrap_or_else(|| panic!("cannot parse the version of {}: {text:?}", bin.display()))
    })
}

/// Whether [`redis_server_bin`] offers the module API function
/// `RedisModule_<name>`: its name is in the binary's API table (Redis and
/// Valkey register each function by that string). Tests branch on server
/// features this way, never on the version number: Valkey reports its own
/// version (8.x) over Redis 7.2's API. Cached per name.
pub fn server_has_api(name: &str) -> bool {
    static BINARY: OnceLock<Vec<u8>> = OnceLock::new();
    let binary = BINARY.get_or_init(|| {
        let bin = redis_server_bin();
        fs::read(&bin).unwrap_or_else(|e| panic!("cannot read {}: {e}", bin.display()))
    });
    let needle = format!("RedisModule_{name}\0");
    binary.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Extracts `X.Y.Z` from the `v=X.Y.Z` word of `redis-server --version`.
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.split_whitespace().find_map(|w| w.strip_prefix("v="))?;
    let mut parts = v.split('.').map(|n| n.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// A TCP port on 127.0.0.1 that is free right now, whose cluster-bus port
/// (`port + 10000`) is free as well, and that no other caller in this
/// process has been given before.
pub fn free_port() -> u16 {
    static HANDED_OUT: LazyLock<Mutex<HashSet<u16>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        let Some(bus) = port.checked_add(BUS_OFFSET) else {
            continue;
        };
        if handed_out.contains(&port) || TcpListener::bind((Ipv4Addr::LOCALHOST, bus)).is_err() {
            continue;
        }
        handed_out.insert(port);
        return port;
    }
    panic!("no free port pair (port, port+10000) found on 127.0.0.1 after 1000 tries");
}

/// How to start a [`Server`].
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Extra `redis-server` arguments, e.g. `["--appendonly", "yes"]`. They
    /// come last, so they override the harness defaults.
    pub args: Vec<String>,
    /// Module arguments, appended after the `--loadmodule` path.
    pub module_args: Vec<String>,
    /// Whether to load the `tb` module (default: true).
    pub load_module: bool,
    /// An existing data directory to use (e.g. another server's, to restart
    /// from its files). Default: a fresh temporary directory owned by the
    /// [`Server`] and removed when it is dropped.
    pub dir: Option<PathBuf>,
    /// The port to listen on. Default: [`free_port`].
    pub port: Option<u16>,
    /// Extra environment variables for the server process (e.g. an
    /// `LD_PRELOAD` clock shim, see `tests/clock.rs`).
    pub env: Vec<(String, String)>,
    /// A config file to start from (the first argument of `redis-server`);
    /// the harness's own options follow it and win.
    pub config_file: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            args: Vec::new(),
            module_args: Vec::new(),
            load_module: true,
            dir: None,
            port: None,
            env: Vec::new(),
            config_file: None,
        }
    }
}

/// A running `redis-server` child process. Dropping it kills the process
/// (and removes its data directory if the harness created it).
pub struct Server {
    /// The port it listens on (127.0.0.1 only).
    pub port: u16,
    /// The process id of the current (or last) server process.
    pub pid: u32,
    /// Its data directory (`--dir`), which also holds `redis.log`.
    pub dir: PathBuf,
    child: Option<Child>,
    _tmp: Option<tempfile::TempDir>,
    config: ServerConfig,
}

impl Server {
    /// Starts a server with the default [`ServerConfig`] (module loaded).
    pub fn start() -> Server {
        Server::start_with(ServerConfig::default())
    }

    /// Starts a server with `cfg` and waits until it answers PING.
    ///
    /// Panics (quoting the log) if it exits or does not answer within 15 s.
    pub fn start_with(cfg: ServerConfig) -> Server {
        let (dir, tmp) = match &cfg.dir {
            Some(d) => {
                fs::create_dir_all(d)
                    .unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
                (d.clone(), None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("tb-redis-")
                    .tempdir_in(std::env::temp_dir())
                    .expect("create a temporary data directory");
                (t.path().to_path_buf(), Some(t))
            }
        };
        // An automatically chosen port can be taken by someone else between
        // free_port() and the server's bind(): then retry on another one.
        let attempts = if cfg.port.is_some() { 1 } else { 3 };
        let mut last_error = String::new();
        for _ in 0..attempts {
            let port = cfg.port.unwrap_or_else(free_port);
            match spawn(port, &dir, &cfg) {
                Ok(child) => {
                    return Server {
                        port,
                        pid: child.id(),
                        dir,
                        child: Some(child),
                        _tmp: tmp,
                        config: cfg,
                    }
                }
                Err(e) if cfg.port.is_none() && e.contains("Address already in use") => {
                    last_error = e;
                }
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last_error}");
    }

    /// Starts a server with `cfg` that must refuse to start (exit during
    /// start-up, e.g. because the module refuses to load); returns its log.
    ///
    /// Panics if it starts (it is stopped first) or fails to exit within 15 s.
    pub fn start_refused(cfg: ServerConfig) -> String {
        let tmp = tempfile::Builder::new()
            .prefix("tb-redis-")
            .tempdir_in(std::env::temp_dir())
            .expect("create a temporary data directory");
        match spawn(free_port(), tmp.path(), &cfg) {
            Ok(child) => {
                let log = fs::read_to_string(tmp.path().join(LOG_FILE)).unwrap_or_default();
                let _ = terminate(child, false);
                panic!("the server started although it should have refused to: {cfg:?}\n{log}");
            }
            Err(e) if e.contains("exited during start-up") => {
                fs::read_to_string(tmp.path().join(LOG_FILE)).unwrap_or_default()
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// A new connection with a 10 s read/write timeout.
    ///
    /// Panics if the connection cannot be set up within 10 s (the redis
    /// crate's handshake has no timeout of its own, so it runs on a helper
    /// thread: a paused server makes this panic instead of hanging).
    pub fn conn(&self) -> redis::Connection {
        let client = self.client();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(client.get_connection_with_timeout(IO_TIMEOUT));
        });
        let c = match rx.recv_timeout(IO_TIMEOUT) {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => panic!("cannot connect to {}: {e}", self.addr()),
            Err(_) => panic!(
                "no connection to {} within {IO_TIMEOUT:?} (is the server paused?)",
                self.addr()
            ),
        };
        c.set_read_timeout(Some(IO_TIMEOUT))
            .expect("set_read_timeout");
        c.set_write_timeout(Some(IO_TIMEOUT))
            .expect("set_write_timeout");
        c
    }

    /// A new connection (see [`Server::conn`]) authenticated as `user`.
    pub fn login(&self, user: &str, pass: &str) -> redis::Connection {
        let mut c = self.conn();
        redis::cmd("AUTH")
            .arg(user)
            .arg(pass)
            .query::<()>(&mut c)
            .unwrap_or_else(|e| panic!("AUTH {user}: {e}"));
        c
    }

    /// A new connection that has sent `args` and not read the reply (see
    /// [`answer`]), and its client id: for commands that block.
    pub fn send(&self, args: &[&str]) -> (redis::Connection, i64) {
        let mut c = self.conn();
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut c).unwrap();
        c.send_packed_command(&cmd(args).get_packed_command())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        (c, id)
    }

    /// A client for this server (connections made from it have no timeout
    /// unless the caller sets one; prefer [`Server::conn`]).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://{}/", self.addr())).expect("valid redis URL")
    }

    /// `"127.0.0.1:PORT"`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Shuts the server down with SIGTERM (so it writes its AOF/RDB as
    /// configured), waits up to 10 s for it to exit, then SIGKILLs it.
    /// A no-op if it is not running.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            if let Err(e) = terminate(child, true) {
                panic!("{e}\n{}", self.log_tail(LOG_TAIL_LINES));
            }
        }
    }

    /// Kills the server with SIGKILL (no shutdown work at all) and reaps it.
    /// A no-op if it is not running.
    pub fn kill9(&mut self) {
        if let Some(child) = self.child.take() {
            if let Err(e) = terminate(child, false) {
                panic!("{e}");
            }
        }
    }

    /// Freezes the server process (SIGSTOP): it accepts TCP connections in
    /// the kernel backlog but answers nothing until [`Server::resume`].
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Stops the server (SIGTERM, see [`Server::stop`]; a no-op after
    /// [`Server::kill9`]) and starts it again with the same configuration,
    /// port and data directory, waiting until it answers PING.
    pub fn restart(&mut self) {
        self.stop();
        let child = spawn(self.port, &self.dir, &self.config).unwrap_or_else(|e| panic!("{e}"));
        self.pid = child.id();
        self.child = Some(child);
    }

    /// The whole server log (`<dir>/redis.log`, across restarts), or an
    /// empty string if there is none yet.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join(LOG_FILE)).unwrap_or_default()
    }

    /// Calls `f` on one connection every 10 ms until it returns true.
    ///
    /// Panics with `what` and the tail of the server log if that does not
    /// happen within `deadline`.
    pub fn wait_for(
        &self,
        what: &str,
        deadline: Duration,
        mut f: impl FnMut(&mut redis::Connection) -> bool,
    ) {
        let mut c = self.conn();
        let end = Instant::now() + deadline;
        loop {
            if f(&mut c) {
                return;
            }
            if Instant::now() >= end {
                panic!(
                    "timed out after {deadline:?} waiting for {what} on {}\n{}",
                    self.addr(),
                    self.log_tail(LOG_TAIL_LINES)
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `sig` to the running server; panics if it is not running.
    fn signal(&self, sig: libc::c_int) {
        assert!(
            self.child.is_some(),
            "server {} is not running",
            self.addr()
        );
        if let Err(e) = send_signal(self.pid, sig) {
            panic!("kill({}, {sig}) failed: {e}", self.pid);
        }
    }

    /// The last `n` lines of the log, formatted for a panic message.
    fn log_tail(&self, n: usize) -> String {
        log_tail(&self.dir, n)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Never panic here: a panic while unwinding from a failed test aborts.
        if let Some(child) = self.child.take() {
            let _ = terminate(child, false);
        }
    }
}

/// Starts a replica of `master` (adding `--replicaof 127.0.0.1 <port>` in
/// front of `cfg.args`) and waits up to 20 s until `INFO replication` shows
/// `master_link_status:up`.
pub fn replica_of(master: &Server, cfg: ServerConfig) -> Server {
    let mut cfg = cfg;
    let mut args = vec![
        "--replicaof".to_string(),
        "127.0.0.1".to_string(),
        master.port.to_string(),
    ];
    args.append(&mut cfg.args);
    cfg.args = args;
    let replica = Server::start_with(cfg);
    replica.wait_for(
        &format!("the replica's link to master {} to be up", master.addr()),
        Duration::from_secs(20),
        |c| {
            redis::cmd("INFO")
                .arg("replication")
                .query::<String>(c)
                .is_ok_and(|info| info.contains("master_link_status:up"))
        },
    );
    replica
}

/// Spawns `redis-server` on `port` in `dir` and waits until it answers PING.
/// On failure the process is gone and the error quotes the log.
fn spawn(port: u16, dir: &Path, cfg: &ServerConfig) -> Result<Child, String> {
    let bin = redis_server_bin();
    let mut cmd = Command::new(&bin);
    cmd.args(&cfg.config_file);
    cmd.current_dir(dir)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir"])
        .arg(dir)
        .args(["--logfile", LOG_FILE, "--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no"])
        .args([
            "--enable-debug-command",
            "yes",
            "--enable-module-command",
            "yes",
        ]);
    if cfg.load_module {
        cmd.arg("--loadmodule")
            .arg(module_path())
            .args(&cfg.module_args);
    }
    cmd.args(&cfg.args)
        .envs(cfg.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(output_file(dir, "stdout.log"))
        .stderr(output_file(dir, "stderr.log"));
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;

    let deadline = Instant::now() + START_DEADLINE;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return Err(format!(
                    "redis-server on port {port} exited during start-up ({status})\n{}",
                    log_tail(dir, LOG_TAIL_LINES)
                ))
            }
            Ok(None) => {}
            Err(e) => return Err(format!("cannot poll redis-server on port {port}: {e}")),
        }
        if answers_ping(port, Duration::from_secs(1)) {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            let _ = terminate(child, false);
            return Err(format!(
                "redis-server on port {port} did not answer PING within {START_DEADLINE:?}\n{}",
                log_tail(dir, LOG_TAIL_LINES)
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// An append-mode file in `dir` for the child's stdout or stderr.
fn output_file(dir: &Path, name: &str) -> File {
    File::options()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", dir.join(name).display()))
}

/// True if a fresh connection to `port` gets `+PONG` to an inline PING
/// within about `timeout` per step (a loading server replies `-LOADING`).
/// Uses a raw socket: the redis crate's connection handshake has no timeout.
fn answers_ping(port: u16, timeout: Duration) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let mut reply = [0u8; 7];
    stream.set_read_timeout(Some(timeout)).is_ok()
        && stream.set_write_timeout(Some(timeout)).is_ok()
        && stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// Ends `child`: SIGTERM (+ SIGCONT, in case it is paused) with a 10 s grace
/// period when `graceful`, then SIGKILL; reaps it. Never blocks forever.
fn terminate(mut child: Child, graceful: bool) -> Result<ExitStatus, String> {
    let pid = child.id();
    if graceful {
        let _ = send_signal(pid, libc::SIGTERM);
        let _ = send_signal(pid, libc::SIGCONT);
        if let Some(status) = wait_until(&mut child, STOP_DEADLINE) {
            return Ok(status);
        }
    }
    let _ = send_signal(pid, libc::SIGKILL);
    wait_until(&mut child, KILL_DEADLINE)
        .ok_or_else(|| format!("redis-server pid {pid} did not exit after SIGKILL"))
}

/// Polls `child` until it exits or `deadline` passes.
fn wait_until(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + deadline;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= end {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// `kill(pid, sig)`. Only called for children not yet reaped, so the pid
/// cannot have been recycled.
fn send_signal(pid: u32, sig: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The last `n` lines of the server log in `dir`, plus anything the server
/// wrote to stderr (option errors are reported there, not in the log).
fn log_tail(dir: &Path, n: usize) -> String {
    let tail = |name: &str| {
        let text = fs::read_to_string(dir.join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    };
    let mut out = format!(
        "--- last {n} lines of {} ---\n{}",
        dir.join(LOG_FILE).display(),
        tail(LOG_FILE)
    );
    let stderr = tail("stderr.log");
    if !stderr.trim().is_empty() {
        out.push_str(&format!("\n--- stderr ---\n{stderr}"));
    }
    out
}
