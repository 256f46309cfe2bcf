//! Keyspace notifications: every TB write publishes an event of the module
//! class (`d`) named after its command; a write that deletes a full bucket
//! also publishes `del` (generic class, `g`), as Redis' own commands do when
//! they remove a key; an idle bucket's expiry publishes Redis' `expired`
//! (`x`). Denials and peeks write nothing and publish nothing. Replicas
//! publish what they apply (`tb.setstate`).

mod common;

use std::time::Duration;

use common::{config_set, ints, ok, replica_of, sync_replica, Server, ServerConfig};
use redis::{Connection, PubSub};

/// Subscribes to every key-event channel of database 0.
fn subscribe(c: &mut Connection) -> PubSub<'_> {
    let mut ps = c.as_pubsub();
    ps.psubscribe("__keyevent@0__:*").unwrap();
    ps.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    ps
}

/// The next event as `(event, key)`.
fn next(ps: &mut PubSub<'_>) -> (String, String) {
    let m = ps.get_message().expect("an event within 10 s");
    let event = m
        .get_channel_name()
        .strip_prefix("__keyevent@0__:")
        .unwrap_or_else(|| panic!("channel {}", m.get_channel_name()))
        .to_string();
    (event, m.get_payload().unwrap())
}

/// Asserts the next events, in order.
fn expect(ps: &mut PubSub<'_>, want: &[(&str, &str)]) {
    for (event, key) in want {
        assert_eq!(next(ps), (event.to_string(), key.to_string()));
    }
}

#[test]
fn every_write_publishes_an_event_and_nothing_else_does() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, "notify-keyspace-events", "Edgx");
    let mut sub = s.conn();
    let mut ps = subscribe(&mut sub);

    ints(&mut c, &["TB.CONSUME", "n", "1/d", "5", "2"]);
    // A denial and a peek write nothing: the next event is the refund's.
    ints(&mut c, &["TB.CONSUME", "n", "1/d", "5", "9"]);
    ints(&mut c, &["TB.CONSUME", "n", "1/d", "5", "0"]);
    // The refund fills the bucket: its key is deleted.
    ints(&mut c, &["TB.REFUND", "n", "2"]);
    expect(
        &mut ps,
        &[("tb.consume", "n"), ("tb.refund", "n"), ("del", "n")],
    );

    ints(&mut c, &["CL.THROTTLE", "t", "4", "10", "60"]);
    ints(
        &mut c,
        &[
            "TB.MCONSUME",
            "2",
            "{a}1",
            "{a}2",
            "1/d",
            "5",
            "1",
            "1/d",
            "5",
            "1",
        ],
    );
    // A denied MCONSUME writes nothing.
    ints(
        &mut c,
        &[
            "TB.MCONSUME",
            "2",
            "{a}1",
            "{a}2",
            "1/d",
            "5",
            "9",
            "1/d",
            "5",
            "1",
        ],
    );
    ok(&mut c, &["TB.SETSTATE", "s", "1", "0", "1", "1", "10", "0"]);
    ok(&mut c, &["TB.SETSTATE", "s", "DEL"]);
    expect(
        &mut ps,
        &[
            ("cl.throttle", "t"),
            ("tb.mconsume", "{a}1"),
            ("tb.mconsume", "{a}2"),
            ("tb.setstate", "s"),
            ("tb.setstate", "s"),
            ("del", "s"),
        ],
    );

    // An idle bucket's key expires when it is full again: Redis' event.
    ints(&mut c, &["TB.CONSUME", "e", "20", "1"]);
    expect(&mut ps, &[("tb.consume", "e"), ("expired", "e")]);
}

#[test]
fn keyspace_channels_and_replicas_publish_too() {
    let m = Server::start();
    let r = replica_of(&m, ServerConfig::default());
    let mut mc = m.conn();
    let mut rc = r.conn();
    config_set(&mut mc, "notify-keyspace-events", "Kd");
    config_set(&mut rc, "notify-keyspace-events", "Ed");
    let mut msub = m.conn();
    let mut mps = msub.as_pubsub();
    mps.subscribe("__keyspace@0__:k").unwrap();
    mps.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rsub = r.conn();
    let mut rps = subscribe(&mut rsub);
    ints(&mut mc, &["TB.CONSUME", "k", "1/d", "5", "2"]);
    sync_replica(&mut mc);
    let msg = mps.get_message().expect("a keyspace event");
    assert_eq!(msg.get_channel_name(), "__keyspace@0__:k");
    assert_eq!(msg.get_payload::<String>().unwrap(), "tb.consume");
    // The replica applies the state the master sent, and says so.
    expect(&mut rps, &[("tb.setstate", "k")]);
}
