//! Tests of the integration-test harness itself, against a plain
//! redis-server without the module: if these fail, the other integration
//! tests cannot be trusted either.

mod common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

use common::{free_port, replica_of, server_version, Server, ServerConfig};
use redis::Connection;

/// A server without the `tb` module, plus `args`.
fn plain(args: &[&str]) -> ServerConfig {
    ServerConfig {
        args: args.iter().map(|a| a.to_string()).collect(),
        load_module: false,
        ..ServerConfig::default()
    }
}

fn get(c: &mut Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(c).unwrap()
}

fn set(c: &mut Connection, key: &str, value: &str) {
    let _: () = redis::cmd("SET").arg(key).arg(value).query(c).unwrap();
}

/// True if nothing answers an inline PING on `port` within half a second
/// (raw socket: the redis crate's handshake would block on a paused server).
fn unreachable(port: u16) -> bool {
    let timeout = Duration::from_millis(500);
    let Ok(mut stream) = TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), timeout)
    else {
        return true;
    };
    stream.set_read_timeout(Some(timeout)).unwrap();
    stream.write_all(b"PING\r\n").unwrap();
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_err()
}

#[test]
fn start_ping_stop() {
    let (major, _, _) = server_version();
    assert!(
        major >= 7,
        "the harness needs redis-server >= 7, got {:?}",
        server_version()
    );
    let mut s = Server::start_with(plain(&[]));
    assert_eq!(s.addr(), format!("127.0.0.1:{}", s.port));
    let pong: String = redis::cmd("PING").query(&mut s.conn()).unwrap();
    assert_eq!(pong, "PONG");
    // The harness defaults are in effect.
    let save: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query(&mut s.conn())
        .unwrap();
    assert_eq!(save, ["save", ""]);
    assert!(
        s.log().contains("Ready to accept connections"),
        "log: {}",
        s.log()
    );
    s.stop();
    assert!(unreachable(s.port), "the server still answers after stop()");
    s.stop(); // a no-op when already stopped
}

#[test]
fn restart_keeps_data_with_appendonly() {
    let mut s = Server::start_with(plain(&["--appendonly", "yes"]));
    set(&mut s.conn(), "k", "v1");
    let (port, dir, pid) = (s.port, s.dir.clone(), s.pid);
    s.restart();
    assert_eq!((s.port, &s.dir), (port, &dir), "same port and directory");
    assert_ne!(s.pid, pid, "a new process");
    assert_eq!(get(&mut s.conn(), "k").as_deref(), Some("v1"));
}

#[test]
fn kill9_then_restart_replays_a_synced_aof() {
    let mut s = Server::start_with(plain(&["--appendonly", "yes", "--appendfsync", "always"]));
    set(&mut s.conn(), "k", "v2");
    s.kill9();
    assert!(
        unreachable(s.port),
        "the server still answers after kill9()"
    );
    s.restart();
    assert_eq!(get(&mut s.conn(), "k").as_deref(), Some("v2"));
}

#[test]
fn pause_freezes_and_resume_thaws() {
    let mut s = Server::start_with(plain(&[]));
    s.pause();
    assert!(unreachable(s.port), "a paused server must not answer");
    s.resume();
    let pong: String = redis::cmd("PING").query(&mut s.conn()).unwrap();
    assert_eq!(pong, "PONG");
    // stop() also ends a paused server gracefully, without waiting for SIGKILL.
    s.pause();
    let t = Instant::now();
    s.stop();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "stop() took {:?}",
        t.elapsed()
    );
    assert!(
        s.log().contains("ready to exit"),
        "no clean shutdown: {}",
        s.log()
    );
}

#[test]
#[should_panic(expected = "is the server paused?")]
fn conn_to_a_paused_server_panics_instead_of_hanging() {
    let s = Server::start_with(plain(&[]));
    s.pause();
    let _ = s.conn();
}

#[test]
fn a_replica_pair_syncs_a_plain_set() {
    let m = Server::start_with(plain(&[]));
    let r = replica_of(&m, plain(&[]));
    let mut mc = m.conn();
    set(&mut mc, "greeting", "hello");
    r.wait_for("the replica to see the SET", Duration::from_secs(10), |c| {
        get(c, "greeting").as_deref() == Some("hello")
    });
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(10_000)
        .query(&mut mc)
        .unwrap();
    assert_eq!(acked, 1, "the replica acknowledged the write");
}

#[test]
fn a_second_server_can_reuse_a_data_dir() {
    let mut first = Server::start_with(plain(&["--appendonly", "yes"]));
    set(&mut first.conn(), "k", "v3");
    first.stop();
    let second = Server::start_with(ServerConfig {
        dir: Some(first.dir.clone()),
        ..plain(&["--appendonly", "yes"])
    });
    assert_ne!(second.port, first.port);
    assert_eq!(get(&mut second.conn(), "k").as_deref(), Some("v3"));
}

#[test]
#[should_panic(expected = "waiting for the impossible")]
fn wait_for_panics_at_its_deadline() {
    let s = Server::start_with(plain(&[]));
    s.wait_for("the impossible", Duration::from_millis(100), |_| false);
}

#[test]
fn free_port_gives_distinct_ports_with_a_free_bus_port() {
    let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
    let distinct: HashSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "duplicates in {ports:?}");
    assert!(
        ports.iter().all(|&p| p > 0 && p <= u16::MAX - 10_000),
        "{ports:?}"
    );
}

#[test]
#[should_panic(expected = "exited during start-up")]
fn a_server_that_cannot_start_panics_with_the_reason() {
    let _ = Server::start_with(plain(&["--no-such-option", "1"]));
}
