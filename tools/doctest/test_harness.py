"""The harness itself: what it must refuse, and that its checks can fail.

Each test feeds the harness a small Markdown document and checks the
verdict, so a harness that passed everything would fail here.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
import sys

import pytest

import aclcheck
import blocks
import runners
import servers
import transcript
from blocks import DocError
from test_docs import BINARIES, plan_document


def doc(tmp_path: Path, text: str) -> list[blocks.Block]:
    path = tmp_path / "doc.md"
    path.write_text(text)
    return blocks.extract(path)


def run(tmp_path: Path, text: str, binary: str | None = None) -> None:
    """Plans and runs every case of a document on one server."""
    for case in plan_document(doc(tmp_path, text), [binary or BINARIES[0]]):
        ctx = runners.Context(
            block=case.block, binary=case.binary, files=case.files,
            output=case.output, acl_blocks=case.acl_blocks,
        )
        runners.run_block(ctx)


# --- blocks nobody could test fail ------------------------------------------


def test_a_block_without_a_language_fails(tmp_path: Path) -> None:
    with pytest.raises(runners.Failure, match="without a language tag"):
        run(tmp_path, "```\nTB.CONSUME k 1 1\n```\n")


def test_a_language_without_a_runner_fails(tmp_path: Path) -> None:
    with pytest.raises(runners.Failure, match="no runner for ```yaml"):
        run(tmp_path, "```yaml\na: 1\n```\n")


def test_a_js_block_runs_and_its_failure_fails(tmp_path: Path) -> None:
    text = "```js\nimport { Limiter } from 'tb-limiter';\nconsole.log(typeof Limiter);\n```\n\n" \
        "<!-- doctest: output -->\n```text\nfunction\n```\n"
    run(tmp_path, text)
    with pytest.raises(runners.Failure, match="does not show what the block prints"):
        run(tmp_path, text.replace("\nfunction\n", "\nobject\n"))
    with pytest.raises(runners.Failure, match="exited with 3"):
        run(tmp_path, "```js\nprocess.exit(3)\n```\n")


def test_a_ruby_block_runs_with_the_installed_gem_and_its_failure_fails(tmp_path: Path) -> None:
    text = "```ruby\nrequire 'tb_limiter'\nputs TbLimiter::Limiter.name\n```\n\n" \
        "<!-- doctest: output -->\n```text\nTbLimiter::Limiter\n```\n"
    run(tmp_path, text)
    with pytest.raises(runners.Failure, match="does not show what the block prints"):
        run(tmp_path, text.replace("\nTbLimiter::Limiter\n```\n", "\nLimiter\n```\n"))
    with pytest.raises(runners.Failure, match="exited with 3"):
        run(tmp_path, "```ruby\nexit 3\n```\n")


def test_an_indented_code_block_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DocError, match="indented code block"):
        doc(tmp_path, "Text:\n\n    redis-cli PING\n")


def test_a_directive_must_precede_a_fence(tmp_path: Path) -> None:
    with pytest.raises(DocError, match="does not immediately precede"):
        doc(tmp_path, "<!-- doctest: output -->\n\nSome text.\n\n```sh\ntrue\n```\n")


def test_an_unknown_directive_fails_its_block(tmp_path: Path) -> None:
    with pytest.raises(runners.Failure, match="unknown doctest directive 'skip'"):
        run(tmp_path, "<!-- doctest: skip -->\n```sh\ntrue\n```\n")


def test_a_file_block_nobody_uses_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DocError, match="used by no later block"):
        plan_document(doc(tmp_path, "<!-- doctest: file=a.yml -->\n```yaml\na: 1\n```\n"), BINARIES)


def test_fences_in_list_items_are_found(tmp_path: Path) -> None:
    found = doc(tmp_path, "- item:\n\n  ```sh\n  true\n  ```\n")
    assert [(b.lang, b.text) for b in found] == [("sh", "true\n")]


# --- the checks can fail ----------------------------------------------------


def test_a_transcript_with_a_wrong_value_fails(tmp_path: Path) -> None:
    text = "```console\n$ redis-cli TB.CONSUME k 1 5\n1) (integer) 1\n2) (integer) 3\n" \
        "3) (integer) 0\n4) (integer) 1000\n5) (integer) 1\n```\n"
    with pytest.raises(AssertionError, match=r"line 2: shown '2\) \(integer\) 3'"):
        run(tmp_path, text)


def test_a_transcript_in_the_wrong_shape_fails(tmp_path: Path) -> None:
    text = "```console\n$ redis-cli TB.CONSUME k 1 5\n1  4  0  1000  1\n```\n"
    with pytest.raises(AssertionError, match="5 lines printed, 1 shown"):
        run(tmp_path, text)


def test_an_output_block_is_compared(tmp_path: Path) -> None:
    text = "```sh\necho 41\n```\n\n<!-- doctest: output -->\n```text\n42\n```\n"
    with pytest.raises(runners.Failure, match="does not show what the block prints"):
        run(tmp_path, text)
    run(tmp_path, text.replace("42", "41"))


def test_a_block_that_fails_fails(tmp_path: Path) -> None:
    with pytest.raises(runners.Failure, match="exited with 1"):
        run(tmp_path, "```python\nraise SystemExit(1)\n```\n")


def test_a_conf_setting_that_does_not_take_fails(tmp_path: Path) -> None:
    # Redis accepts 'appendfsync' only from a fixed list, so compare a value it rewrites.
    with pytest.raises(runners.Failure, match="maxmemory: the block sets '1mb'"):
        run(tmp_path, "```conf\nmaxmemory 1mb\n```\n".replace("1mb", "1mb\nmaxmemory 2mb"))


def test_a_python_block_reaches_the_harness_server(tmp_path: Path) -> None:
    run(tmp_path, "```python\nimport redis\n"
        "assert redis.Redis.from_url('redis://127.0.0.1:6379/0').execute_command("
        "'TB.CONSUME', 'k', '1', '1')[0] == 1\n```\n")


# --- the timing rule is narrow ----------------------------------------------


def timing(slack_ms: float) -> transcript.Timing:
    return transcript.Timing(slack_ms / 1000, 1_000_000, 1_000_100)


@pytest.mark.parametrize(
    ("rule", "shown", "printed", "slack_ms", "ok"),
    [
        (transcript.Countdown(1), "(integer) 1000", "(integer) 990", 9, True),
        (transcript.Countdown(1), "(integer) 1000", "(integer) 980", 9, False),
        (transcript.Countdown(1), "(integer) 1000", "(integer) 1001", 0, False),
        (transcript.Countdown(1), "(integer) -1", "(integer) 0", 50, False),
        (transcript.Countdown(1000), "(integer) 2", "(integer) 1", 10, True),
        (transcript.Tokens(Fraction(1)), '"4"', '"4.013"', 12, True),
        (transcript.Tokens(Fraction(1)), '"4"', '"4.5"', 12, False),
        (transcript.Tokens(Fraction(1)), '"4"', '"3.999"', 12, False),
        (transcript.Tokens(Fraction(10)), "(integer) 4", "(integer) 5", 99, True),
        (transcript.Tokens(Fraction(10)), "(integer) 4", "(integer) 5", 50, False),
        (transcript.Tokens(Fraction(10)), "(integer) 4", "(integer) 6", 150, False),
        (transcript.Tokens(Fraction(10)), "(integer) 4", '"4"', 0, False),
        (transcript.Clock(), "(integer) 1", "(integer) 1000050", 0, True),
        (transcript.Clock(), "(integer) 1", "(integer) 1000200", 0, False),
    ],
)
def test_timing_rule(rule: transcript.Rule, shown: str, printed: str, slack_ms: float, ok: bool) -> None:
    assert (transcript.check_value(rule, shown, printed, timing(slack_ms)) is None) == ok


def test_only_time_fields_get_a_tolerance() -> None:
    rules = transcript.rules_for(["TB.CONSUME", "k", "100/m", "5", "1"], {}, [])
    assert set(rules) == {2, 3, 4}  # allowed and granted are exact
    rules = transcript.rules_for(["TB.CONSUME", "k", "1", "5", "9", "ATMOST"], {}, [])
    assert set(rules) == {2, 3, 4, 5}
    assert transcript.rules_for(["GET", "k"], {}, ["x"]) == {}


# --- ACL: a denylist is caught ----------------------------------------------


@pytest.mark.parametrize("binary", BINARIES, ids=servers.server_label)
@pytest.mark.parametrize(
    "rules", ["+@all -tb.setstate -tb.config", "+@all -@dangerous"], ids=["names", "dangerous"]
)
def test_a_denylist_leaks_what_the_readme_says(binary: str, rules: str) -> None:
    """docs/security.md: a denylist still lets the application DEL, UNLINK, EXPIRE or
    RENAME its bucket, and run a script that does (the first also CONFIG
    SET tb.*); the checker reports each of them."""
    conf = (
        f"user app on >pw ~rl:* &* {rules}\nuser default on >admin ~* &* +@all\n"
        f"{aclcheck.ADMIN_CONF}\n{aclcheck.UNPROTECTED_CONF}"
    )
    with servers.running(binary, conf_text=conf) as srv:
        with pytest.raises(AssertionError) as failed:
            aclcheck.check(srv.port, conf, "app", ["limiter"], ["tamper"])
    report = str(failed.value)
    for leak in ["DEL rl", "UNLINK", "PEXPIRE", "RENAME", "EVAL return redis.call('DEL'"]:
        assert f"{leak}" in report and "was allowed" in report, (leak, report)
    if rules.startswith("+@all -tb"):
        assert "CONFIG SET tb.max-wait-ms 1 was allowed" in report


# --- setup directives -------------------------------------------------------

ACL_CONF = (
    "<!-- doctest: acl=app::del -->\n```conf\nuser app on >pw resetkeys ~rl:* "
    "resetchannels -@all +tb.consume\n```\n\n"
)


def test_a_block_runs_as_the_user_of_an_acl_block(tmp_path: Path) -> None:
    as_app = (
        "<!-- doctest: user=app -->\n```python\nimport os, redis\n"
        "for key, url in (('rl:a', 'redis://127.0.0.1:6379/0'), ('rl:b', os.environ['REDIS_URL'])):\n"
        "    r = redis.Redis.from_url(url)\n"
        "    assert r.execute_command('TB.CONSUME', key, '1', '1')[0] == 1\n"
        "    try:\n"
        "        r.delete(key)\n"
        "    except redis.exceptions.NoPermissionError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit('DEL was allowed')\n```\n"
    )
    run(tmp_path, ACL_CONF + as_app)


def test_an_acl_claim_that_does_not_hold_fails(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="TB.MCONSUME .* was refused"):
        run(tmp_path, ACL_CONF.replace("app::del", "app:limiter:del"))


def test_the_lua_server_has_no_module(tmp_path: Path) -> None:
    run(tmp_path, "<!-- doctest: server=lua -->\n```console\n$ redis-cli TB.INFO k\n"
        "(error) ERR unknown command 'TB.INFO', with args beginning with: 'k' \n```\n")


def test_a_file_block_is_there_for_later_blocks(tmp_path: Path) -> None:
    run(tmp_path, "<!-- doctest: file=limits.txt -->\n```text\n5/s\n```\n\n"
        "```sh\ntest \"$(cat \"$TMPDIR/limits.txt\")\" = 5/s\n```\n")


def test_serve_runs_the_first_line_in_the_background(tmp_path: Path) -> None:
    run(tmp_path, "<!-- doctest: serve=8000 -->\n```sh\n"
        f"{sys.executable} -m http.server 8000 --bind 127.0.0.1 --directory \"$TMPDIR\"\n"
        "curl -sf http://127.0.0.1:8000/ >/dev/null\n```\n")


def test_a_cluster_block_runs_on_a_cluster(tmp_path: Path) -> None:
    run(tmp_path, "<!-- doctest: server=cluster -->\n```python\n"
        "from redis.cluster import RedisCluster\n"
        "rc = RedisCluster.from_url('redis://127.0.0.1:6379/0')\n"
        "assert len(rc.get_primaries()) == 3\n"
        "for t in 'abcdefgh':\n"
        "    assert rc.execute_command('TB.CONSUME', '{' + t + '}:k', '1', '1')[0] == 1\n```\n")


def test_a_user_without_keys_is_checked_too(tmp_path: Path) -> None:
    """A user with no key pattern (a metrics exporter allowed INFO and EVAL)
    is tried on keys it cannot reach; the scripts it may run are refused
    every command on them."""
    run(tmp_path, "<!-- doctest: acl=exporter::tamper -->\n```conf\n"
        "user exporter on >pw resetkeys resetchannels -@all +info +eval\n"
        "user default on >admin ~* &* +@all\n```\n")


def test_dry_run_checks_make_targets_and_packages(tmp_path: Path) -> None:
    run(tmp_path, "<!-- doctest: dry-run -->\n```sh\nmake build\nsudo apt-get install -y redis-tools\n```\n")
    with pytest.raises(runners.Failure, match="make -n no-such-target"):
        run(tmp_path, "<!-- doctest: dry-run -->\n```sh\nmake no-such-target\n```\n")
    with pytest.raises(runners.Failure, match="apt-get install -s"):
        run(tmp_path, "<!-- doctest: dry-run -->\n```sh\napt-get install -y no-such-package-tb\n```\n")


def test_an_excerpt_must_be_verbatim(tmp_path: Path) -> None:
    run(tmp_path, "<!-- doctest: excerpt=examples/rust_client.rs -->\n```rust\n"
        "fn main() -> redis::RedisResult<()> {\n```\n")
    with pytest.raises(runners.Failure, match="not a verbatim excerpt"):
        run(tmp_path, "<!-- doctest: excerpt=examples/rust_client.rs -->\n```rust\n"
            "fn main() -> redis::RedisResult<()>{\n```\n")


def test_redis_cli_runs_as_the_user_too(tmp_path: Path) -> None:
    run(tmp_path, ACL_CONF + "<!-- doctest: user=app -->\n```console\n"
        "$ redis-cli DEL rl:a\n(error) NOPERM this user has no permissions to run the 'del' command\n"
        "$ redis-cli TB.CONSUME rl:a 1 1 0\n1) (integer) 1\n2) (integer) 1\n3) (integer) 0\n"
        "4) (integer) 0\n5) (integer) 0\n```\n")


def test_raw_output_gets_the_timing_rule_too(tmp_path: Path) -> None:
    run(tmp_path, "```console\n$ redis-cli TB.CONSUME k 1 5\n1) (integer) 1\n2) (integer) 4\n"
        "3) (integer) 0\n4) (integer) 1000\n5) (integer) 1\n$ redis-cli --raw TB.INFO k\n"
        "tokens\n4\ncapacity\n5\nrate\n1\nupdated_at_ms\n1795236966776\n"
        "reset_after_ms\n1000\nttl_ms\n1000\n```\n")


def test_a_background_worker_serves_the_block(tmp_path: Path) -> None:
    """The shape of a Celery recipe: the tasks in a file= block, a worker in
    the background, the block that sends work to it."""
    worker = (
        "<!-- doctest: file=tasks.py -->\n```python\nimport redis\n"
        "r = redis.Redis.from_url('redis://127.0.0.1:6379/0')\n"
        "def serve():\n    print('worker ready', flush=True)\n"
        "    while True:\n        _, job = r.blpop('jobs')\n        r.rpush('done', job.upper())\n```\n\n"
        '<!-- doctest: background="python -c \'import tasks; tasks.serve()\'" ready="^worker ready" -->\n'
        "```python\nfrom tasks import r\nr.rpush('jobs', 'a')\nprint(r.blpop('done', 10)[1].decode())\n```\n\n"
        "<!-- doctest: output -->\n```text\nA\n```\n"
    )
    run(tmp_path, worker)
    with pytest.raises(runners.Failure, match="exited with 0"):  # never ready
        run(tmp_path, worker.replace("tasks.serve()", "tasks"))


def test_a_celery_recipe_runs_with_a_real_worker(tmp_path: Path) -> None:
    run(tmp_path, (
        "<!-- doctest: file=tasks.py -->\n```python\nfrom celery import Celery\n"
        "app = Celery('t', broker='redis://127.0.0.1:6379/0', backend='redis://127.0.0.1:6379/0')\n"
        "@app.task\ndef double(x):\n    return 2 * x\n```\n\n"
        '<!-- doctest: background="celery -A tasks worker --pool=prefork --concurrency=2 --loglevel=INFO" '
        'ready="ready\\." -->\n'
        "```python\nfrom tasks import double\nprint(double.delay(21).get(timeout=30))\n```\n\n"
        "<!-- doctest: output -->\n```text\n42\n```\n"
    ))


def test_a_user_made_at_run_time_serves_a_later_block(tmp_path: Path) -> None:
    run(tmp_path, "<!-- doctest: acl=app::del -->\n```console\n"
        "$ redis-cli ACL SETUSER app on '>pw' resetkeys '~rl:*' -@all +tb.consume\nOK\n```\n\n"
        "<!-- doctest: user=app -->\n```console\n$ redis-cli TB.CONSUME rl:a 1 1 0\n"
        "1) (integer) 1\n2) (integer) 1\n3) (integer) 0\n4) (integer) 0\n5) (integer) 0\n```\n")
