//! Persistence: AOF replay, AOF rewrite, RDB reload and restart restore the
//! exact stored state (not shifted by the downtime).

mod common;

use common::{aof_rewrite_done, digest, info_field, state, Server, ServerConfig};
use redis::Connection;

/// Creates buckets in several states; returns (key, digest, updated_at_ms, ttl>0).
fn populate(c: &mut Connection) -> Vec<(String, String, String)> {
    let specs = [
        ("slow", "1e-3", 100, 40),
        ("fixed", "0", 10, 3),
        ("minute", "100/m", 1000, 999),
    ];
    specs
        .iter()
        .map(|(k, rate, cap, n)| {
            let _: Vec<i64> = redis::cmd("TB.CONSUME")
                .arg(*k)
                .arg(*rate)
                .arg(*cap)
                .arg(*n)
                .query(c)
                .unwrap();
            (
                k.to_string(),
                digest(c, k),
                state(c, k)["updated_at_ms"].clone(),
            )
        })
        .collect()
}

fn assert_same(c: &mut Connection, before: &[(String, String, String)], when: &str) {
    for (k, d, updated) in before {
        assert_eq!(&digest(c, k), d, "{k} changed after {when}");
        assert_eq!(
            &state(c, k)["updated_at_ms"],
            updated,
            "{k} time shifted after {when}"
        );
    }
}

#[test]
fn aof_replay_restores_exact_state() {
    let mut s = Server::start_with(ServerConfig {
        args: vec![
            "--appendonly".into(),
            "yes".into(),
            "--appendfsync".into(),
            "always".into(),
        ],
        ..ServerConfig::default()
    });
    let before = populate(&mut s.conn());
    let expire_before: i64 = redis::cmd("PEXPIRETIME")
        .arg("slow")
        .query(&mut s.conn())
        .unwrap();
    assert!(expire_before > 0, "a refilling bucket carries an expiry");
    s.restart();
    let mut c = s.conn();
    assert_same(&mut c, &before, "AOF replay");
    let expire_after: i64 = redis::cmd("PEXPIRETIME").arg("slow").query(&mut c).unwrap();
    assert_eq!(expire_before, expire_after, "absolute expiry restored");
    let ttl: i64 = redis::cmd("PTTL").arg("fixed").query(&mut c).unwrap();
    assert_eq!(ttl, -1);
}

#[test]
fn aof_rewrite_without_rdb_preamble_restores_exact_state() {
    let mut s = Server::start_with(ServerConfig {
        args: vec![
            "--appendonly".into(),
            "yes".into(),
            "--aof-use-rdb-preamble".into(),
            "no".into(),
        ],
        ..ServerConfig::default()
    });
    let before = populate(&mut s.conn());
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut s.conn()).unwrap();
    s.wait_for(
        "AOF rewrite done",
        std::time::Duration::from_secs(20),
        |c| {
            aof_rewrite_done(c) && info_field(c, "persistence", "aof_last_bgrewrite_status") == "ok"
        },
    );
    let aof_dir = s.dir.join("appendonlydir");
    let base = std::fs::read_dir(&aof_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains(".base.aof"))
        .expect("a base AOF file");
    let text = String::from_utf8_lossy(&std::fs::read(base).unwrap()).to_string();
    assert!(
        text.contains("TB.SETSTATE"),
        "the rewrite emits TB.SETSTATE: {text}"
    );
    s.restart();
    assert_same(&mut s.conn(), &before, "AOF rewrite + restart");
}

#[test]
fn rdb_reload_and_restart_restore_exact_state() {
    let mut s = Server::start_with(ServerConfig {
        args: vec!["--save".into(), "3600 1".into()],
        ..ServerConfig::default()
    });
    let before = populate(&mut s.conn());
    let _: String = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut s.conn())
        .unwrap();
    assert_same(&mut s.conn(), &before, "DEBUG RELOAD");
    let _: String = redis::cmd("SAVE").query(&mut s.conn()).unwrap();
    s.restart();
    assert_same(&mut s.conn(), &before, "SAVE + restart");
}
