#!/usr/bin/env python3
"""report.py - the benchmark table, bench.json and latency.png from tests/bench/run's raw.json."""
import json
import os
import shutil
import subprocess
import sys

raw = json.load(open(sys.argv[1]))
out = sys.argv[2]


def median_run(runs):
    """The run with the median rps; its latencies stay consistent with it."""
    runs = sorted(runs, key=lambda r: r["rps"])
    m = dict(runs[len(runs) // 2])
    m["rounds"] = [round(r["rps"]) for r in runs]
    return m


# Scenarios come as lists of rounds: keep the median round of each (and the
# rounds themselves, for the ratios of each round).
rounds = {k: v for k, v in raw.items() if isinstance(v, list) and v and isinstance(v[0], dict)
          and "rps" in v[0]}
for k, v in list(raw.items()):
    if isinstance(v, list) and v and isinstance(v[0], dict) and "rps" in v[0]:
        raw[k] = median_run(v)

# The nginx + Lua peer in its better worker count (by median rps).
PEER = max((k for k in ("lua_w1", "lua_w2") if k in raw), key=lambda k: raw[k]["rps"], default=None)

HTTP = ["return200", "noop", "floor", "php_instock", "lua_w1", "lua_w2", "seize_instock", "seize_synced",
        "seize_flash", "seize_soldout", "php_soldout", "seize_many", "status_id",
        "cluster_instock", "cluster_soldout"]
LABEL = {
    "return200": "nginx return 200 (reference)",
    "noop": "no-op libfcgi responder (reference)",
    "php_instock": "PHP-FPM peer, in stock (reference)",
    "php_soldout": "PHP-FPM peer, sold out (reference)",
    "lua_w1": "nginx + Lua peer, 1 worker (reference)",
    "lua_w2": "nginx + Lua peer, 2 workers (reference)",
    "floor": "floor: libfcgi+hiredis EVALSHA (reference)",
    "seize_instock": "seize, in stock",
    "seize_synced": "seize, in stock, coupon-sync draining",
    "seize_flash": "seize, flash sale (1,000 / 200,000)",
    "seize_soldout": "seize, sold out",
    "redis_evalsha": "redis-benchmark EVALSHA (reference)",
    "seize_many": "seize, in stock, 20,000 others on sale",
    "status_id": "status?id, 20,000 on sale",
    "cluster_instock": "seize, in stock, Redis Cluster",
    "cluster_soldout": "seize, sold out, Redis Cluster",
}


def get(name, key):
    return raw.get(name, {}).get(key)


def ratio(a, b, key="rps"):
    x, y = get(a, key), get(b, key)
    return x / y if x and y else None


rows = []
for name in HTTP + ["redis_evalsha"]:
    if name not in raw:
        continue
    r = raw[name]
    rows.append({
        "scenario": name,
        "label": LABEL[name],
        "rps": r["rps"],
        "p50_ms": r["p50_ms"],
        "p99_ms": r["p99_ms"],
        "p999_ms": r.get("p999_ms"),
        "codes": r.get("codes"),
        "cpu_us": r.get("cpu_us"),
        "rounds_rps": r.get("rounds"),
        "x_return200": ratio(name, "return200"),
        "x_noop": ratio(name, "noop"),
        "x_floor": ratio(name, "floor"),
        "x_php": ratio(name, "php_soldout" if "soldout" in name else "php_instock"),
        "x_single_redis": ratio(name, name.replace("cluster_", "seize_"))
        if name.startswith("cluster_") else None,
        "x_redis": ratio(name, "redis_evalsha"),
        "x_peer": ratio(name, PEER) if PEER else None,
    })

targets = []


def target(name, value, ok):
    # A target whose figures this run did not measure (BENCH_HOP=1,
    # BENCH_SKIP_*) is left out rather than reported missed.
    if value is None or (isinstance(value, str) and "None" in value):
        return
    targets.append({"target": name, "value": value, "met": bool(ok)})


def med(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


# The FastCGI hop: each round's own ratios to the peer's same round.
hop = {}
if PEER and "seize_instock" in rounds:
    def per_round(a, key, b=PEER):
        out = []
        for x, y in zip(rounds.get(a, []), rounds.get(b, [])):
            u = x["cpu_us"].get("machine") if key == "machine" else x.get(key)
            v = y["cpu_us"].get("machine") if key == "machine" else y.get(key)
            out.append(round(u / v, 2) if u and v else None)
        return out
    hop = {"peer": PEER,
           "seize_rps": per_round("seize_instock", "rps"),
           "seize_p99": per_round("seize_instock", "p99_ms"),
           "seize_machine_cpu": per_round("seize_instock", "machine"),
           "floor_rps": per_round("floor", "rps")}
    hop["medians"] = {k: med(v) for k, v in hop.items() if isinstance(v, list)}


v = ratio("seize_instock", "php_instock")
target("in-stock seize >= 2.0x PHP-FPM peer (rps)", v, v is not None and v >= 2.0)
v = ratio("seize_instock", "floor")
target("in-stock seize >= 0.9x the floor (rps)", v, v is not None and v >= 0.9)
v = ratio("seize_soldout", "noop")
target("sold-out seize >= 1.0x no-op responder (rps)", v, v is not None and v >= 1.0)
a, b = get("seize_soldout", "p99_ms"), get("noop", "p99_ms")
target("sold-out seize p99 <= 1.5x no-op p99 (ms)", f"{a} vs {b}",
       a is not None and b is not None and a <= 1.5 * b)
v = ratio("seize_flash", "noop")
target("flash sale >= 0.95x no-op responder (rps)", v, v is not None and v >= 0.95)
a, b = get("seize_instock", "p99_ms"), get("php_instock", "p99_ms")
target("seize p99 <= PHP-FPM peer p99 (ms)", f"{a} vs {b}", a is not None and b is not None and a <= b)


if hop:
    # The hop's goals against the single-hop peer: medians of each round's ratio.
    m = hop["medians"]
    v = m["seize_rps"]
    target("in-stock seize >= 1.0x the nginx + Lua peer (rps)", v, v is not None and v >= 1.0)
    v = m["seize_p99"]
    target("in-stock seize p99 <= 1.0x the nginx + Lua peer", v, v is not None and v <= 1.0)
    v = m["seize_machine_cpu"]
    target("in-stock seize: machine CPU per request <= 1.0x the nginx + Lua peer", v,
           v is not None and v <= 1.0)
rss = raw.get("worker_rss_kib", 0)
target("worker RSS <= 8 MiB", f"{rss / 1024:.1f} MiB", 0 < rss <= 8192)
d = raw.get("drain") or {}
dr = d.get("ratio")
target("sync drain >= 10x per-row baseline", dr, dr is not None and dr >= 10)
many = raw.get("many") or {}
if many:
    v = ratio("seize_many", "seize_instock")
    target("many activities: hot seize rate >= 0.9x alone", v, v is not None and v >= 0.9)
    v = ratio("seize_many", "seize_instock", "p99_ms")
    target("many activities: hot seize p99 <= 1.5x alone", v, v is not None and v <= 1.5)
    mr = many.get("worker_rss_kib", 0)
    target("many activities: worker RSS <= 8 MiB", f"{mr / 1024:.1f} MiB", 0 < mr <= 8192)
    pm = many.get("preheat_ms")
    target("many activities: preheat of 20,000 <= 3 s", f"{pm} ms", pm is not None and pm <= 3000)
    sp = get("status_id", "p99_ms")
    sr = (many.get("status_id_random") or {}).get("p99_ms")
    target("many activities: status?id <= 50 ms (p99, cached / random)", f"{sp} / {sr}",
           sp is not None and sr is not None and sp <= 50 and sr <= 50)
lc = raw.get("lcache") or {}
lc_ok = lc.get("pass")
target("W-TinyLFU hit ratio > LRU on both traces", lc_ok, bool(lc_ok))


def fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) else "-"


print()
print(f"couponseize benchmarks: {raw.get('workers')} workers, {raw.get('concurrency')} connections, "
      f"one machine ({os.cpu_count()} cores) running everything; median of "
      f"{len(raw.get('noop', {}).get('rounds', [1]))} interleaved rounds")
print(f"{'scenario':<44} {'rps':>9} {'p50 ms':>8} {'p99 ms':>8} {'x ret200':>9} {'x noop':>7} "
      f"{'x floor':>8} {'x php':>6} {'x peer':>7}")
for r in rows:
    print(f"{r['label']:<44} {fmt(r['rps'], '9.0f')} {fmt(r['p50_ms'], '8.2f')} "
          f"{fmt(r['p99_ms'], '8.2f')} {fmt(r['x_return200'], '9.2f')} {fmt(r['x_noop'], '7.2f')} "
          f"{fmt(r['x_floor'], '8.2f')} {fmt(r['x_php'], '6.2f')} {fmt(r['x_peer'], '7.2f')}")
if PEER:
    print(f"x peer: against the nginx + Lua peer with {PEER[-1]} worker(s), its better median rps")
print()
print("CPU microseconds per request (same median round), by process, and the whole machine's")
print("(non-idle time of all CPUs, load generator and any other work included)")
print(f"{'scenario':<44} {'app':>6} {'redis':>6} {'nginx':>6} {'sync':>6} {'mysql':>6} {'machine':>8} "
      f"{'app x floor':>12}")
floor_app = (get("floor", "cpu_us") or {}).get("app")
for r in rows:
    c = r.get("cpu_us")
    if not c:
        continue
    xf = c["app"] / floor_app if floor_app else None
    print(f"{r['label']:<44} {c['app']:>6} {c['redis']:>6} {c['nginx']:>6} {c['sync']:>6} "
          f"{c['mysql']:>6} {fmt(c.get('machine'), '>8')} {fmt(xf, '12.2f')}")
# The FastCGI hop: each round's own ratios to the peer's same round.
if hop:
    m = hop["medians"]
    print()
    print(f"the FastCGI hop, each round against the peer ({PEER}) in the same round (median, rounds):")
    print(f"  coupon-fcgi in stock / peer: rps {fmt(m['seize_rps'], '.2f')} {hop['seize_rps']}, "
          f"p99 {fmt(m['seize_p99'], '.2f')} {hop['seize_p99']}, machine CPU per request "
          f"{fmt(m['seize_machine_cpu'], '.2f')} {hop['seize_machine_cpu']}")
    print(f"  floor / peer: rps {fmt(m['floor_rps'], '.2f')} {hop['floor_rps']}")
print()
fl = raw.get("seize_flash", {}).get("codes", {})
if fl:
    print(f"flash sale outcomes (median round): {fl}")
print("rps of each round: " + ", ".join(
    f"{r['scenario']} {r['rounds_rps']}" for r in rows if r.get("rounds_rps")))
print()
if d:
    print(f"sync drain: coupon-sync {fmt(d.get('coupon_sync_rows_per_s'), '.0f')} rows/s, per-row baseline "
          f"{fmt(d.get('baseline_rows_per_s'), '.0f')} rows/s, ratio {fmt(dr, '.1f')}")
for t in lc.get("results", []):
    print(f"cache {t.get('trace')} cap={t.get('capacity')}: W-TinyLFU {fmt(t.get('tinylfu'), '.4f')} "
          f"LRU {fmt(t.get('lru'), '.4f')}")
cl = [(a, b) for a, b in (("cluster_instock", "seize_instock"), ("cluster_soldout", "seize_soldout"))
      if a in raw and b in raw]
for a, b in cl:
    print(f"{LABEL[a]}: {fmt(ratio(a, b), '.2f')}x the rps of one Redis, p99 "
          f"{fmt(get(a, 'p99_ms'), '.2f')} ms against {fmt(get(b, 'p99_ms'), '.2f')} ms")
fo = raw.get("cluster_failover") or {}
if fo:
    print(f"cluster: master kill -9 -> first failed seize after {fo.get('first_failure_ms')} ms, "
          f"SEIZED again after {fo.get('seized_again_ms')} ms (replica promoted, old master "
          f"rejoined as its replica)")
print(f"worker RSS (largest): {rss} KiB")
if many:
    print(f"many activities ({many.get('activities')}): preheat {many.get('preheat_ms')} ms "
          f"(again, unchanged: {many.get('preheat_again_ms')} ms), status?id of random ones "
          f"{many.get('status_id_random')}, a list page of 200 {many.get('list_page_ms')} ms, "
          f"worker RSS {many.get('worker_rss_kib')} KiB, load average {many.get('load')}")
print()
for t in targets:
    v = t["value"]
    v = fmt(v, ".2f") if isinstance(v, float) else v
    print(f"  [{'met' if t['met'] else 'MISSED'}] {t['target']}: {v}")

result = {"scenarios": rows, "targets": targets, "worker_rss_kib": rss, "hop": hop,
          "cluster_failover": raw.get("cluster_failover"),
          "drain": d, "lcache": lc, "many": many, "workers": raw.get("workers"),
          "concurrency": raw.get("concurrency")}
with open(os.path.join(out, "bench.json"), "w") as f:
    json.dump(result, f, indent=2)
print(f"\nwrote {out}/bench.json", end="")

if shutil.which("gnuplot"):
    dat = os.path.join(out, "latency.dat")
    with open(dat, "w") as f:
        f.write("# scenario p50 p99 p999\n")
        for r in rows:
            if r["scenario"] == "redis_evalsha":
                continue
            f.write(f"\"{r['scenario']}\" {r['p50_ms']} {r['p99_ms']} {r['p999_ms'] or r['p99_ms']}\n")
    png = os.path.join(out, "latency.png")
    script = f"""
set terminal pngcairo size 1100,600 noenhanced
set output '{png}'
set title 'Latency percentiles per scenario (ms, log scale)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set ylabel 'ms'
set xtics rotate by -20
set key top left
plot '{dat}' using 2:xtic(1) title 'p50', '' using 3 title 'p99', '' using 4 title 'p99.9'
"""
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True, capture_output=True)
        print(f", {png}", end="")
    except subprocess.CalledProcessError as e:
        print(f" (gnuplot failed: {e.stderr.strip()})", end="")
print()
