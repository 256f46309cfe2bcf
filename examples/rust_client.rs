//! The tb commands from Rust with the `redis` crate: take tokens, reserve a
//! turn and wait for it without polling, give tokens back, look at a bucket.
//!
//! ```sh
//! cargo run --release --example rust_client -- redis://127.0.0.1:6379/
//! ```

use std::thread;
use std::time::Duration;

/// The reply of `TB.CONSUME`.
struct Consumed {
    allowed: bool,
    remaining: i64,
    retry_after_ms: i64,
    reset_after_ms: i64,
    granted: i64,
}

impl std::fmt::Display for Consumed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "allowed={} remaining={} retry_after_ms={} reset_after_ms={} granted={}",
            self.allowed, self.remaining, self.retry_after_ms, self.reset_after_ms, self.granted
        )
    }
}

/// `TB.CONSUME key rate capacity n [options]`.
fn consume(
    con: &mut redis::Connection,
    key: &str,
    rate: &str,
    capacity: u64,
    n: u64,
    options: &[&str],
) -> redis::RedisResult<Consumed> {
    let (allowed, remaining, retry_after_ms, reset_after_ms, granted): (i64, i64, i64, i64, i64) =
        redis::cmd("TB.CONSUME")
            .arg(key)
            .arg(rate)
            .arg(capacity)
            .arg(n)
            .arg(options)
            .query(con)?;
    Ok(Consumed {
        allowed: allowed == 1,
        remaining,
        retry_after_ms,
        reset_after_ms,
        granted,
    })
}

fn main() -> redis::RedisResult<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_string());
    let mut con = redis::Client::open(url)?.get_connection()?;
    let key = "example:rust";
    redis::cmd("DEL").arg(key).query::<()>(&mut con)?;

    // 2 tokens a second, burst 3: three calls pass, the fourth is told when.
    for i in 1..=4 {
        let r = consume(&mut con, key, "2", 3, 1, &[])?;
        println!("consume {i}: {r}");
    }

    // Wait for a token without polling: reserve it, sleep the reply's wait.
    let r = consume(&mut con, key, "2", 3, 1, &["RESERVE", "1000"])?;
    println!("reserved: {r}");
    thread::sleep(Duration::from_millis(r.retry_after_ms.max(0) as u64));

    // Reserve an estimate, give back what was not used.
    let left: Option<i64> = redis::cmd("TB.REFUND").arg(key).arg(2).query(&mut con)?;
    println!("refunded 2, remaining: {left:?}");

    let info: Vec<redis::Value> = redis::cmd("TB.INFO").arg(key).query(&mut con)?;
    let fields: Vec<String> = info
        .chunks(2)
        .map(|kv| format!("{}={}", text(&kv[0]), text(&kv[1])))
        .collect();
    println!("info: {}", fields.join(" "));
    Ok(())
}

/// A reply value as text (bulk strings and integers).
fn text(v: &redis::Value) -> String {
    match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::Int(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}
