//! The Prometheus route: Debian's `prometheus-redis-exporter` with the
//! shipped script (`contrib/prometheus/tb-metrics.lua`), configured with the
//! settings the metrics page (docs/operations/metrics.md) shows for
//! `/etc/default/prometheus-redis-exporter` and logged in as the user of its
//! ACL line, against a server with the module. After a known workload, every
//! `INFO tb` field the page documents is in the exporter's `/metrics` with the
//! value the workload implies, the histogram of granted waits included; the
//! page's list and the module's
//! fields are the same set; the exporter logs no error; and that user can do
//! nothing but read INFO.
//!
//! The exporter binary is `$PROMETHEUS_REDIS_EXPORTER`, else
//! `prometheus-redis-exporter` on PATH (`make test-deps` installs it).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, Server};
use redis::Connection;

/// How long the exporter may take to serve its first scrape.
const START_DEADLINE: Duration = Duration::from_secs(15);
/// Bounds of the wait histogram, as the metrics page lists them.
const BOUNDS: [i64; 16] = [
    0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The page that documents `INFO tb` and the exporter's set-up.
const METRICS_PAGE: &str = "docs/operations/metrics.md";

fn readme() -> String {
    std::fs::read_to_string(repo().join(METRICS_PAGE)).expect(METRICS_PAGE)
}

/// The metrics page's ACL line for the exporter (`redis-cli ACL SETUSER exporter ...`),
/// as command arguments.
fn readme_acl() -> Vec<String> {
    let readme = readme();
    let line = readme
        .lines()
        .find(|l| l.starts_with("redis-cli ACL SETUSER exporter "))
        .expect("the metrics page shows the exporter's ACL line");
    line.split_whitespace()
        .skip(1)
        .map(|w| w.trim_matches('\'').to_string())
        .collect()
}

/// The metrics page's `/etc/default/prometheus-redis-exporter` settings.
fn readme_exporter_env() -> HashMap<String, String> {
    let readme = readme();
    let start = readme
        .find("# /etc/default/prometheus-redis-exporter\n")
        .expect("the metrics page shows the exporter's settings");
    readme[start..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("NAME=VALUE");
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn exporter_bin() -> PathBuf {
    let name = std::env::var_os("PROMETHEUS_REDIS_EXPORTER")
        .unwrap_or_else(|| "prometheus-redis-exporter".into());
    let p = PathBuf::from(&name);
    if p.components().count() > 1 {
        return p;
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{} not found: install Debian's prometheus-redis-exporter (make test-deps does)",
                p.display()
            )
        })
}

/// The exporter, killed (by pid) and reaped when dropped.
struct Exporter {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Exporter {
    /// Starts the exporter with the metrics page's settings, pointed at this test's
    /// server and at the repository's copy of the script.
    fn start(redis_port: u16) -> Exporter {
        let mut env = readme_exporter_env();
        assert_eq!(
            env.get("REDIS_EXPORTER_SCRIPT").map(String::as_str),
            Some("/opt/tb/tb-metrics.lua"),
            "the metrics page's script path is where make install puts it"
        );
        assert!(env.contains_key("REDIS_ADDR"), "{env:?}");
        env.insert(
            "REDIS_ADDR".into(),
            format!("redis://127.0.0.1:{redis_port}"),
        );
        env.insert(
            "REDIS_EXPORTER_SCRIPT".into(),
            repo()
                .join("contrib/prometheus/tb-metrics.lua")
                .display()
                .to_string(),
        );
        let dir = tempfile::tempdir().expect("temporary directory");
        let log = dir.path().join("exporter.log");
        let port = free_port();
        let child = Command::new(exporter_bin())
            .arg(format!("-web.listen-address=127.0.0.1:{port}"))
            .env_clear()
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .expect("start prometheus-redis-exporter");
        Exporter {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    /// One scrape of `/metrics`, the first one retried until the deadline.
    fn scrape(&mut self) -> String {
        let end = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the exporter exited ({status}):\n{}", self.log());
            }
            match http_get(self.port, "/metrics") {
                Ok(body) => return body,
                Err(e) if Instant::now() > end => {
                    panic!(
                        "no /metrics from the exporter within {START_DEADLINE:?}: {e}\n{}",
                        self.log()
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body of an HTTP/1.0 GET on 127.0.0.1:`port`, if the status is 200.
fn http_get(port: u16, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    let (head, body) = reply.split_once("\r\n\r\n").ok_or("no HTTP header")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "HTTP status: {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(body.to_string())
}

/// `redis_script_values{key="K"} V` lines of a scrape, as K -> V.
fn script_values(metrics: &str) -> HashMap<String, f64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("redis_script_values{key=\""))
        .map(|l| {
            let (key, value) = l.split_once("\"} ").expect("a gauge line");
            (key.to_string(), value.trim().parse().expect("a number"))
        })
        .collect()
}

/// The `INFO tb` fields the metrics page documents (its "INFO tb" section: every
/// backticked `tb_*` name, and `tb_wait_ms_le_<ms>` for each bound listed on
/// the same line).
fn documented_fields() -> BTreeSet<String> {
    let readme = readme();
    let start = readme
        .find("\n## INFO tb\n")
        .expect("the metrics page has an '## INFO tb' section");
    let rest = &readme[start + 1..];
    let section = &rest[..rest[4..].find("\n#").map_or(rest.len(), |i| i + 4)];
    let mut fields = BTreeSet::new();
    for line in section.lines() {
        for name in line.split('`').skip(1).step_by(2) {
            if name == "tb_wait_ms_le_<ms>" {
                for bound in line
                    .split(|c: char| !c.is_ascii_digit())
                    .filter(|w| !w.is_empty())
                {
                    fields.insert(format!("tb_wait_ms_le_{bound}"));
                }
            } else if name.starts_with("tb_")
                && name
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
            {
                fields.insert(name.to_string());
            }
        }
    }
    fields
}

fn query<T: redis::FromRedisValue>(c: &mut Connection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c)
        .unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")))
}

fn info_tb(c: &mut Connection) -> HashMap<String, i64> {
    let text: String = query(c, &["INFO", "tb"]);
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().parse().unwrap()))
        .collect()
}

/// Runs the workload; returns what INFO tb must say after it.
fn workload(c: &mut Connection) -> HashMap<String, i64> {
    let mut waits = Vec::new();
    let mut tokens = 0;
    // Two grants at once, then two reservations on an empty bucket at
    // 2 tokens/s (about 0.5 s and 1 s: each reply says its wait).
    for n in ["2", "1"] {
        let r: Vec<i64> = query(c, &["TB.CONSUME", "w", "2", "3", n]);
        assert_eq!(r[0], 1, "{r:?}");
        waits.push(r[2]);
        tokens += r[4];
    }
    for _ in 0..2 {
        let r: Vec<i64> = query(c, &["TB.CONSUME", "w", "2", "3", "1", "RESERVE", "5000"]);
        assert_eq!(r[0], 1, "{r:?}");
        assert!(r[2] > 0, "{r:?}");
        waits.push(r[2]);
        tokens += r[4];
    }
    // A denial, a request that can never succeed, a peek, an ATMOST partial
    // grant, and a refund.
    let denied: Vec<i64> = query(c, &["TB.CONSUME", "w", "2", "3", "1"]);
    assert_eq!(denied[0], 0);
    let never: Vec<i64> = query(c, &["TB.CONSUME", "w", "2", "3", "4"]);
    assert_eq!(never[2], -1);
    let _: Vec<i64> = query(c, &["TB.CONSUME", "p", "2", "3", "0"]);
    let partial: Vec<i64> = query(c, &["TB.CONSUME", "a", "1", "3", "5", "ATMOST"]);
    assert_eq!((partial[0], partial[4]), (1, 3), "{partial:?}");
    waits.push(partial[2]);
    tokens += partial[4];
    let _: i64 = query(c, &["TB.REFUND", "a", "1"]);

    let mut want: HashMap<String, i64> = [
        ("tb_calls", 8),
        ("tb_allowed", 5),
        ("tb_denied", 2),
        ("tb_peeks", 1),
        ("tb_never_satisfiable", 1),
        ("tb_tokens_granted", tokens),
        ("tb_reservations", 2),
        ("tb_partial_grants", 1),
        ("tb_blocked_total", 0),
        ("tb_refunds", 1),
        ("tb_blocked_now", 0),
        ("tb_waiting_calls", 0),
        ("tb_waiting_flows", 0),
        ("tb_eviction_policy_can_evict_buckets", 0),
        ("tb_expire_idle", 1),
        ("tb_max_wait_ms", 60_000),
        ("tb_max_blocked", 10_000),
        ("tb_top_keys", 1),
        ("tb_wait_ms_sum", waits.iter().sum()),
        ("tb_wait_ms_count", waits.len() as i64),
        ("tb_wait_ms_le_inf", waits.len() as i64),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .into();
    for b in BOUNDS {
        let n = waits.iter().filter(|&&w| w <= b).count() as i64;
        want.insert(format!("tb_wait_ms_le_{b}"), n);
    }
    assert_eq!(tokens, 8);
    want
}

#[test]
fn the_exporter_script_exports_every_documented_field_with_its_value() {
    let s = Server::start();
    let mut admin = s.conn();
    let acl = readme_acl();
    let _: () = query(
        &mut admin,
        &acl.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let want = workload(&mut admin);

    // The module's fields, the metrics page's list and the expected values agree.
    let info = info_tb(&mut admin);
    let fields: BTreeSet<String> = info.keys().cloned().collect();
    assert_eq!(
        fields,
        documented_fields(),
        "INFO tb fields vs the metrics page"
    );
    assert_eq!(
        fields,
        want.keys().cloned().collect(),
        "INFO tb fields vs this test"
    );
    for (k, v) in &want {
        assert_eq!(info[k], *v, "INFO tb {k}");
    }

    let mut exporter = Exporter::start(s.port);
    let metrics = exporter.scrape();
    assert!(metrics.lines().any(|l| l == "redis_up 1"), "{metrics}");
    let got = script_values(&metrics);
    for (field, value) in &want {
        let key = if field == "tb_wait_ms_le_inf" {
            "tb_wait_ms_le_+Inf"
        } else {
            field
        };
        assert_eq!(
            got.get(key),
            Some(&(*value as f64)),
            "redis_script_values{{key=\"{key}\"}}"
        );
    }
    assert_eq!(got.len(), want.len(), "{got:?}");
    let log = exporter.log();
    assert!(
        !log.contains("level=error") && !log.contains("NOPERM"),
        "the exporter logged errors with the metrics page's ACL line:\n{log}"
    );
}

#[test]
fn the_exporter_user_can_only_read_info() {
    let s = Server::start();
    let mut admin = s.conn();
    let acl = readme_acl();
    let _: () = query(
        &mut admin,
        &acl.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let _: () = query(&mut admin, &["SET", "k", "v"]);
    let env = readme_exporter_env();
    let mut c = s.conn();
    let _: () = query(
        &mut c,
        &["AUTH", &env["REDIS_USER"], &env["REDIS_PASSWORD"]],
    );
    let info: String = query(&mut c, &["INFO", "tb"]);
    assert!(info.contains("tb_calls:"), "{info}");
    let refused: [&[&str]; 6] = [
        &["TB.CONSUME", "k2", "1", "1"],
        &["TB.CONFIG", "SET", "max-wait-ms", "1"],
        &["CONFIG", "SET", "tb.max-wait-ms", "1"],
        &["GET", "k"],
        &["EVAL", "return redis.call('SET', 'x', '1')", "0"],
        &[
            "EVAL",
            "return redis.call('TB.CONSUME', 'x', '1', '1')",
            "0",
        ],
    ];
    for args in refused {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let e = cmd
            .query::<redis::Value>(&mut c)
            .expect_err(&args.join(" "))
            .to_string();
        // Redis 7.0 words a script's refusal differently.
        let words = ["NOPERM", "permission", "can't run this command"];
        assert!(words.iter().any(|w| e.contains(w)), "{args:?}: {e}");
    }
}
