"""nemesis.py - faults on a two-node stack: start one, stop one, heal all.

The stack is the one tests/stack made in DIR (its DIR/env and DIR/run/*.pid).
Processes are killed and stopped by the pids the stack recorded; restarts go
through tests/stack. Partitions are nftables rules in a table of this run's
own (inet cs_nemesis_PID), one base chain per fault, and heal() deletes the
table: the caller runs heal() on every exit path.
"""
import os
import random
import shutil
import signal
import subprocess
import threading
import time

STOP_ENV = {"COUPON_STACK_STOP_TIMEOUT": "5"}


def read_env(path):
    """DIR/env (lines "export K=V" with shell quoting) as a dict."""
    import shlex
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("export "):
                continue
            k, _, v = line[7:].partition("=")
            env[k] = " ".join(shlex.split(v)) if v else ""
    return env


def proc_children(pid):
    """Pids whose parent is pid."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                s = f.read()
        except OSError:
            continue
        rest = s.rsplit(")", 1)[1].split()
        if rest[0] not in ("Z", "X") and int(rest[1]) == pid:
            out.append(int(d))
    return sorted(out)


def socket_inodes(pid):
    inodes = set()
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if link.startswith("socket:"):
                inodes.add(link)
    except OSError:
        pass
    return inodes


# x86_64 system call numbers of /proc/PID/syscall: where a worker waits.
SYS_READ, SYS_POLL, SYS_RECVFROM, SYS_FUTEX, SYS_PPOLL = 0, 7, 45, 202, 271
# The values a follower passes to FUTEX_WAIT on its queue entry (lib/node/batch.h
# enum batch_state): queued for a leader, or taken into the call in flight.
# A wait for a shard's lock passes the lock word (a pid, with the waiters bit).
ENTRY_QUEUED, ENTRY_TAKEN = 1, 2


def redis_sockets(ports):
    """The inodes ("socket:[N]") of the TCP sockets connected to one of ports."""
    out = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    x = line.split()
                    if len(x) > 9 and int(x[2].rsplit(":", 1)[1], 16) in ports:
                        out.add("socket:[%s]" % x[9])
        except (OSError, StopIteration, ValueError):
            pass
    return out


def call_role(pid, redis_inodes):
    """Where worker pid waits, from /proc/PID/syscall: ("leader", ..) when it
    reads (or polls) a socket connected to Redis, ("follower", "taken" or
    "queued") when it sleeps on its queue entry, ("lock", ..) on a shard's
    lock, else (None, the syscall number or "running")."""
    try:
        with open("/proc/%d/syscall" % pid) as f:
            x = f.read().split()
    except OSError:
        return None, "gone"
    if not x or not x[0].isdigit():
        return None, x[0] if x else "?"
    nr = int(x[0])
    args = [int(a, 16) for a in x[1:7]]
    if nr == SYS_FUTEX:
        if args[2] == ENTRY_TAKEN:
            return "follower", "taken"
        if args[2] == ENTRY_QUEUED:
            return "follower", "queued"
        return "lock", "futex"
    fd = None
    if nr in (SYS_READ, SYS_RECVFROM):
        fd = args[0]
    elif nr in (SYS_POLL, SYS_PPOLL):
        try:  # the first struct pollfd of the call
            with open("/proc/%d/mem" % pid, "rb") as m:
                m.seek(args[0])
                fd = int.from_bytes(m.read(4), "little", signed=True)
        except (OSError, ValueError, OverflowError):
            fd = None
    if fd is not None:
        try:
            if os.readlink("/proc/%d/fd/%d" % (pid, fd)) in redis_inodes:
                return "leader", "poll" if nr in (SYS_POLL, SYS_PPOLL) else "read"
        except OSError:
            pass
    return None, str(nr)


class Nemesis:
    def __init__(self, stack, dirpath, log, nodes=2):
        self.stack = stack
        self.dir = dirpath
        self.log = log
        self.nodes = nodes
        self.table = "cs_nemesis_%d" % os.getpid()
        self.stopped = set()       # pids we SIGSTOPped and owe a SIGCONT
        self.active = {}           # id(ev) -> ev for faults started, not stopped
        self.skewed = set()        # nodes running under libfaketime
        self.straced = {}          # idx -> strace holding a node's fsyncs (slow-journal)
        self.held = {}             # idx -> the worker a stop-worker holds stopped
        self.counts = {}
        self.lock = threading.Lock()  # the schedule runs one thread per target
        self.reload()

    def reload(self):
        self.env = read_env(os.path.join(self.dir, "env"))
        self.redis = self.env.get("REDIS_NODES", "").replace("\\", "").split(",")

    # --- helpers ---------------------------------------------------------
    def sh(self, args, extra_env=None, timeout=90):
        env = dict(os.environ)
        env.update(STOP_ENV)
        if extra_env:
            env.update(extra_env)
        with open(self.log, "a") as lf:
            lf.write("$ %s\n" % " ".join(args))
            lf.flush()
            try:
                return subprocess.run(args, stdout=lf, stderr=lf, env=env, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                lf.write("(timed out)\n")
                return 124

    def stackcmd(self, cmd, *more, extra_env=None):
        rc = self.sh([self.stack, cmd, self.dir] + list(more), extra_env=extra_env)
        self.reload()
        if rc != 0:
            raise RuntimeError("tests/stack %s failed (%d)" % (cmd, rc))
        return rc

    def pid_of(self, svc):
        try:
            with open(os.path.join(self.dir, "run", svc + ".pid")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def signal(self, pid, sig):
        if pid is None:
            return False
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        if sig == signal.SIGSTOP:
            self.stopped.add(pid)
        elif sig in (signal.SIGCONT, signal.SIGKILL):
            self.stopped.discard(pid)
        return True

    def family(self, pid):
        return proc_children(pid) if pid else []

    @staticmethod
    def fcgi_svc(node):
        return "fcgi" if node == 1 else "fcgi%d" % node

    def keeper_of(self, sup):
        """The child of supervisor sup that does not hold its listening socket."""
        mine = socket_inodes(sup)
        kids = self.family(sup)
        best = None
        for k in kids:
            shared = len(socket_inodes(k) & mine)
            if best is None or shared < best[0]:
                best = (shared, k)
        return best[1] if best else None

    def cluster_nodes(self):
        """CLUSTER NODES as {id: (addr, flags, master_id, slots)} from the
        first node that answers."""
        for hp in self.redis:
            host, port = hp.rsplit(":", 1)
            try:
                out = subprocess.run(["redis-cli", "-h", host, "-p", port, "CLUSTER", "NODES"],
                                     capture_output=True, text=True, timeout=5).stdout
            except subprocess.TimeoutExpired:
                continue
            nodes = {}
            for line in out.splitlines():
                f = line.split()
                if len(f) >= 8:
                    nodes[f[0]] = (f[1].split("@")[0], f[2].split(","), f[3], f[8:])
            if nodes:
                return nodes
        return {}

    def resolve_role(self, role):
        """redisN for a role target: "master-of:SALE" (the master that owns
        the sale's shard now) or "replica-of:SALE" (the first of its
        replicas); None when the cluster cannot tell."""
        what, _, sale = role.partition(":")
        host, port = self.redis[0].rsplit(":", 1)
        try:
            slot = int(subprocess.run(["redis-cli", "-h", host, "-p", port, "CLUSTER", "KEYSLOT",
                                       "{%d}" % (int(sale) % 10)], capture_output=True,
                                      text=True, timeout=5).stdout.strip())
        except (ValueError, subprocess.TimeoutExpired):
            return None
        nodes = self.cluster_nodes()
        master = None
        for nid, (addr, flags, _m, slots) in nodes.items():
            if "master" not in flags or "fail" in flags:
                continue
            for r in slots:
                lo, _, hi = r.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    master = nid
        if master is None:
            return None
        if what == "master-of":
            addr = nodes[master][0]
        else:
            reps = sorted(a for a, fl, m, _s in nodes.values() if m == master and "slave" in fl)
            if not reps:
                return None
            addr = reps[0]
        for i, hp in enumerate(self.redis):
            if hp == addr:
                return "redis%d" % (i + 1)
        return None

    def resolve_roles(self, events):
        """Rewrites each event whose target is a role ("replica-of:104",
        "master-of:104") to the redisN that holds it once the stack is up,
        keeping the role in ev["role"]: a schedule that needs a given
        replica or master holds whatever node the cluster made it."""
        for ev in events:
            t = ev["target"]
            if t.startswith("replica-of:") or t.startswith("master-of:"):
                node = self.resolve_role(t)
                if node is None:
                    raise RuntimeError("cannot resolve %s in the cluster" % t)
                ev["role"], ev["target"] = t, node
        return events

    def redis_addr(self, target):
        hp = self.redis[int(target[5:]) - 1]
        return hp.rsplit(":", 1)

    def nft(self, *args):
        return self.sh(["nft"] + list(args), timeout=10)

    def cut(self, name, pairs):
        """A base chain NAME dropping every packet between the address sets
        of each (A, B) pair, both ways; extra match words may follow."""
        if self.nft("list", "table", "inet", self.table) != 0:
            self.nft("add", "table", "inet", self.table)
        self.nft("add", "chain", "inet", self.table, name,
                 "{ type filter hook input priority -10; policy accept; }")
        for a, b, extra in pairs:
            self.nft("add", "rule", "inet", self.table, name, "ip", "saddr", "{ %s }" % a,
                     "ip", "daddr", "{ %s }" % b, *extra, "drop")

    def on_redis_ports(self, pairs):
        """Each (A, B) pair limited to this stack's Redis client and cluster
        bus ports, either end: every stack has the same loopback addresses,
        and a cut by address alone would also cut a stack that runs beside
        this one (make -j2 check, two campaigns at once)."""
        ports = []
        for hp in self.redis:
            p = int(hp.rsplit(":", 1)[1])
            ports += [str(p), str(p + 10000)]
        ports = "{ %s }" % ", ".join(ports)
        return [(a, b, ["tcp", d, ports]) for a, b in pairs for d in ("sport", "dport")]

    def uncut(self, name):
        self.nft("delete", "chain", "inet", self.table, name)

    def workers_of(self, node):
        sup = self.pid_of(self.fcgi_svc(node))
        if not sup:
            return []
        keeper = self.keeper_of(sup)
        return [p for p in self.family(sup) if p != keeper]

    def in_call(self, node, rng, want, secs):
        """A worker of node in a seize call, looked for every 2 ms for up to
        secs: with want "kill", the leader of a call that has followers
        taken into it or one of those followers (drawn half and half when
        both are there; after secs/2 a lone leader or a queued follower
        will do); with want "stop", any worker in a call or queued for one
        (after secs any worker). Returns (pid or None, what it was seen
        doing: role, how, and how many followers were taken and queued)."""
        ports = {int(hp.rsplit(":", 1)[1]) for hp in self.redis}
        inodes = redis_sockets(ports)
        t0 = time.monotonic()
        end = t0 + secs
        looks = 0
        while True:
            looks += 1
            seen = {}
            for p in self.workers_of(node):
                role, how = call_role(p, inodes)
                seen.setdefault(role, []).append((p, how))
            taken = [p for p, how in seen.get("follower", []) if how == "taken"]
            queued = [p for p, how in seen.get("follower", []) if how == "queued"]
            leaders = [p for p, _ in seen.get("leader", [])]
            late = time.monotonic() - t0 >= secs / 2
            if want == "kill":
                pools = []
                if taken:
                    pools = [("leader", leaders), ("follower", taken)]
                elif late:
                    pools = [("leader", leaders), ("follower", queued)]
                pools = [(r, ps) for r, ps in pools if ps]
            else:
                pools = [(r, ps) for r, ps in (("leader", leaders), ("follower", taken + queued),
                                              ("lock", [p for p, _ in seen.get("lock", [])])) if ps]
                if not pools and time.monotonic() >= end:
                    pools = [("idle", [p for ps in seen.values() for p, _ in ps])]
                    pools = [(r, ps) for r, ps in pools if ps]
            if pools:
                role, ps = rng.choice(pools)
                pid = rng.choice(ps)
                how = dict(h for ps_ in seen.values() for h in ps_).get(pid)
                return pid, {"role": role, "how": how, "pid": pid, "taken": len(taken),
                             "queued": len(queued), "leaders": len(leaders), "looks": looks,
                             "after_ms": int((time.monotonic() - t0) * 1000)}
            if time.monotonic() >= end:
                return None, {"role": "none", "looks": looks, "after_ms": int(secs * 1000)}
            time.sleep(0.002)

    # --- faults ----------------------------------------------------------
    def start(self, ev, idx):
        """Starts fault ev; returns what it found to act on (a dict for the
        history) or None."""
        kind, target = ev["kind"], ev["target"]
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
        node = int(target[4:]) if target.startswith("node") else 0
        rng = random.Random("%s:%s" % (idx, ev["at"]))
        if kind == "kill-redis":
            self.stackcmd("stop-" + target, "--kill")
        elif kind in ("stop-redis", "stop-sync", "stop-mysql"):
            svc = {"stop-sync": "sync", "stop-mysql": "mysql"}.get(kind, target)
            self.signal(self.pid_of(svc), signal.SIGSTOP)
        elif kind == "pause-redis":
            host, port = self.redis_addr(target)
            self.sh(["timeout", "3", "redis-cli", "-h", host, "-p", port, "CLIENT", "PAUSE",
                     str(int(ev["dur"] * 1000)), "WRITE"])
        elif kind == "kill-worker":
            sup = self.pid_of(self.fcgi_svc(node))
            keeper = self.keeper_of(sup)
            workers = [p for p in self.family(sup) if p != keeper]
            if workers:
                self.signal(rng.choice(workers), signal.SIGKILL)
        elif kind == "kill-batch-worker":
            # The victim is killed the moment it is seen in its call: a
            # follower asleep on its entry, or the leader reading Redis.
            pid, seen = self.in_call(node, rng, "kill", 2.0)
            if pid is not None:
                self.signal(pid, signal.SIGKILL)
            self.active[idx] = ev
            return seen
        elif kind == "stop-worker":
            pid, seen = self.in_call(node, rng, "stop", 0.5)
            if pid is not None and self.signal(pid, signal.SIGSTOP):
                self.held[idx] = pid
            self.active[idx] = ev
            return seen
        elif kind == "kill-keeper":
            self.signal(self.keeper_of(self.pid_of(self.fcgi_svc(node))), signal.SIGKILL)
        elif kind == "kill-node":
            # Frozen first: a supervisor that outlived its children for a
            # moment would restart them, and children that outlived it would
            # stop gracefully on its death (PDEATHSIG): a crash is neither.
            sup = self.pid_of(self.fcgi_svc(node))
            if sup:
                self.signal(sup, signal.SIGSTOP)
                for k in self.family(sup):
                    self.signal(k, signal.SIGKILL)
                self.signal(sup, signal.SIGKILL)
        elif kind == "stop-node":
            sup = self.pid_of(self.fcgi_svc(node))
            for p in [sup] + self.family(sup):
                self.signal(p, signal.SIGSTOP)
        elif kind == "kill-sync":
            self.stackcmd("stop-sync", "--kill")
        elif kind == "kill-mysql":
            self.stackcmd("stop-mysql", "--kill")
        elif kind == "part-node-redis":
            addrs = ",".join(hp.rsplit(":", 1)[0] for hp in self.redis)
            self.cut("f%d" % idx, self.on_redis_ports(
                [("127.0.2.%d" % node, addrs), (addrs, "127.0.2.%d" % node)]))
        elif kind == "part-master":
            host, _ = self.redis_addr(target)
            rest = [hp.rsplit(":", 1)[0] for hp in self.redis if not hp.startswith(host + ":")]
            rest += ["127.0.2.%d" % n for n in range(1, self.nodes + 1)] + ["127.0.0.1"]
            rest = ",".join(rest)
            self.cut("f%d" % idx, self.on_redis_ports([(host, rest), (rest, host)]))
        elif kind == "part-sync-mysql":
            port = self.env["MYSQL_PORT"]
            self.cut("f%d" % idx, [("127.0.0.1", "127.0.0.1", ["tcp", "dport", port]),
                                   ("127.0.0.1", "127.0.0.1", ["tcp", "sport", port])])
        elif kind == "slow-journal":
            self.slow_journal(node, idx, ev["delay_ms"])
        elif kind == "upgrade-node":
            # As an operator does it; returns once the new binary serves and
            # the old supervisor has gone (a refusal raises: recorded).
            self.stackcmd("upgrade-" + self.fcgi_svc(node))
        elif kind == "skew":
            off = ev["offset_s"]
            self.stackcmd("restart-" + self.fcgi_svc(node),
                          extra_env={"COUPON_FCGI_FAKETIME": "%+d" % off})
            self.skewed.add(node)
        self.active[idx] = ev
        return None

    def stop(self, ev, idx):
        if idx not in self.active:
            return
        del self.active[idx]
        kind, target = ev["kind"], ev["target"]
        node = int(target[4:]) if target.startswith("node") else 0
        if kind == "kill-redis":
            self.stackcmd("start-" + target)
        elif kind in ("stop-redis", "stop-sync", "stop-mysql"):
            svc = {"stop-sync": "sync", "stop-mysql": "mysql"}.get(kind, target)
            self.signal(self.pid_of(svc), signal.SIGCONT)
        elif kind == "kill-node":
            self.stackcmd("start-" + self.fcgi_svc(node), extra_env=self.skew_env(node))
        elif kind == "stop-node":
            sup = self.pid_of(self.fcgi_svc(node))
            for p in [sup] + self.family(sup):
                self.signal(p, signal.SIGCONT)
        elif kind == "stop-worker":
            self.signal(self.held.pop(idx, None), signal.SIGCONT)
        elif kind == "kill-sync":
            self.stackcmd("start-sync")
        elif kind == "kill-mysql":
            self.stackcmd("start-mysql")
        elif kind.startswith("part-"):
            self.uncut("f%d" % idx)
        elif kind == "slow-journal":
            self.slow_journal_end(idx)
        elif kind == "skew":
            self.skewed.discard(node)
            self.stackcmd("restart-" + self.fcgi_svc(node))

    def slow_journal(self, node, idx, delay_ms):
        """A slow journal disk under node: strace holds every fsync and
        fdatasync of its workers and keeper delay_ms before it runs (a
        process started meanwhile is not held)."""
        if shutil.which("strace") is None:
            raise RuntimeError("slow-journal: strace is not installed")
        pids = self.family(self.pid_of(self.fcgi_svc(node)))
        if not pids:
            return
        out = os.path.join(self.dir, "slow-journal-%d.strace" % idx)
        args = ["strace", "-qq", "-o", out, "-e", "trace=fsync,fdatasync",
                "-e", "inject=fsync,fdatasync:delay_enter=%d" % (delay_ms * 1000)]
        for p in pids:
            args += ["-p", str(p)]
        with open(self.log, "a") as lf:
            lf.write("$ %s\n" % " ".join(args))
            st = subprocess.Popen(args, stdout=lf, stderr=lf)
        try:
            rc = st.wait(timeout=0.3)  # an attach that fails ends strace at once
        except subprocess.TimeoutExpired:
            self.straced[idx] = st
            return
        raise RuntimeError("slow-journal: strace could not attach (exit %d)" % rc)

    def slow_journal_end(self, idx):
        """strace lets go (SIGTERM: it detaches; a held call runs on)."""
        st = self.straced.pop(idx, None)
        if st is None:
            return
        st.terminate()
        try:
            st.wait(timeout=10)
        except subprocess.TimeoutExpired:
            st.kill()
            st.wait()
        held = 0
        try:
            with open(os.path.join(self.dir, "slow-journal-%d.strace" % idx)) as f:
                held = sum(1 for line in f if "(DELAYED)" in line)
        except OSError:
            pass
        with open(self.log, "a") as lf:
            lf.write("slow-journal %d: %d calls held\n" % (idx, held))

    def skew_env(self, node):
        for ev in list(self.active.values()):
            if ev["kind"] == "skew" and ev["target"] == "node%d" % node:
                return {"COUPON_FCGI_FAKETIME": "%+d" % ev["offset_s"]}
        return None

    def heal(self):
        """Ends every fault: SIGCONT to all we stopped, no partition left,
        every Redis unpaused, every service of the stack running, no node
        under libfaketime. Safe to call more than once; returns the errors
        met on the way (each step is tried whatever the others did)."""
        errors = []

        def attempt(fn, *args):
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - heal goes on
                errors.append(str(e))
        for pid in list(self.stopped):
            self.signal(pid, signal.SIGCONT)
        self.held.clear()
        if self.nft("list", "table", "inet", self.table) == 0:
            self.nft("delete", "table", "inet", self.table)
        for idx in sorted(self.active, reverse=True):
            ev = self.active[idx]
            if not ev["kind"].startswith("part-"):
                attempt(self.stop, ev, idx)
        self.active.clear()
        for idx in list(self.straced):
            attempt(self.slow_journal_end, idx)
        for hp in self.redis:
            host, port = hp.rsplit(":", 1)
            self.sh(["timeout", "3", "redis-cli", "-h", host, "-p", port, "CLIENT", "UNPAUSE"])
        for n in sorted(self.skewed):
            attempt(self.stackcmd, "restart-" + self.fcgi_svc(n))
        self.skewed.clear()
        attempt(self.restart_dead)
        return errors

    def restart_dead(self):
        names = ["redis%d" % n for n in range(1, 7)] + ["mysql", "sync"] + \
            [self.fcgi_svc(n) for n in range(1, self.nodes + 1)]
        for svc in names:
            pid = self.pid_of(svc)
            alive = False
            if pid:
                try:
                    with open("/proc/%d/stat" % pid) as f:
                        alive = f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
                except OSError:
                    alive = False
            if not alive:
                self.stackcmd("start-" + svc)
