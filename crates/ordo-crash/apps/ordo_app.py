#!/usr/bin/python3
"""Application workloads and crash-consistency checkers for ordo-crash.

    ordo_app.py run APP DIR [--steps N]
    ordo_app.py check APP DIR --durable K --started S [--steps N]

`run` drives APP inside the empty directory DIR (on the file system under
test) and talks to the explorer over stdout/stdin:

    op K DESCRIPTION   printed before update K's first file-system call
    mark K             printed once the application promised update K durable
    done               printed at the very end

Every `op` and `mark` line waits for an `ok` line on stdin, so the explorer
can tag the device log while the application is blocked.  Update 0 is the
setup, updates 1..N are the workload proper.  Diagnostics go to stderr.

`check` judges a private, writable copy DIR of a recovered crash state.  K
is the last update marked durable before the crash (-1: not even the setup),
S the last update whose `op` line was printed (the one in flight).  The state
is consistent iff it equals the state after update j for some K <= j <= S
(for K = -1 also "nothing yet": no database, no repository, ...).

    exit 0, "ok j=J"        consistent
    exit 1, one line        inconsistent, with the reason
    exit 2, a message       the checker itself cannot run

The expected state after every update comes from the same functions the
runner uses to produce it (`sqlite_rows`, `git_tree`, `leveldb_sequence`,
`editor_version`), so runner and checker cannot drift apart.

Everything is deterministic: the same bytes are written on every run.
"""

import hashlib
import os
import subprocess
import sys

APPS = ("sqlite-rollback", "sqlite-wal", "git", "leveldb", "editor")
DEFAULT_STEPS = 6
TIMEOUT = 60  # seconds, for every subprocess


class Inconsistent(Exception):
    """The application state is not one the application promised."""


class CannotRun(Exception):
    """The checker (or runner) itself cannot run: a missing tool or module."""


# --------------------------------------------------------------------------
# Deterministic data


def det_bytes(seed, n):
    """`n` pseudo-random bytes determined by the string `seed`."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{counter}".encode()).digest()
        counter += 1
    return bytes(out[:n])


def det_text(seed, n):
    """`n` bytes of line-structured ASCII text determined by `seed`."""
    out = bytearray()
    line = 0
    while len(out) < n:
        h = hashlib.sha256(f"{seed}/{line}".encode()).hexdigest()
        out += f"{seed} line {line:05d} {h}\n".encode()
        line += 1
    return bytes(out[:n])


# --------------------------------------------------------------------------
# Control channel


def control(line):
    """Print a control line and block until the explorer acknowledges it."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    ack = sys.stdin.readline()
    if ack.strip() != "ok":
        raise SystemExit(f"ordo_app: expected 'ok' after '{line}', got {ack!r}")


def op(k, description):
    control(f"op {k} {description}")


def mark(k):
    control(f"mark {k}")


def log(msg):
    sys.stderr.write(f"ordo_app: {msg}\n")
    sys.stderr.flush()


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def one_line(text):
    """Squash a (possibly multi-line) message into a single line."""
    parts = [p.strip() for p in str(text).splitlines() if p.strip()]
    return " | ".join(parts) if parts else "(no message)"


def first_line(text):
    lines = [p.strip() for p in str(text).splitlines() if p.strip()]
    return lines[0] if lines else "(no message)"


def short_exc(e):
    return one_line(f"{type(e).__name__}: {e}")


# --------------------------------------------------------------------------
# SQLite (rollback journal and WAL)

SQLITE_DB = "test.db"
SQLITE_SCHEMA = (
    "CREATE TABLE t(k INTEGER, i INTEGER, payload BLOB)",
    "CREATE TABLE counter(n)",
    "INSERT INTO counter VALUES(0)",
)
SQLITE_ROWS_PER_UPDATE = 3


def sqlite_update_rows(k):
    """The rows update `k` inserts: (k, i, payload), 100..3000-byte payloads."""
    rows = []
    for i in range(SQLITE_ROWS_PER_UPDATE):
        size = 100 + ((k * 7 + i * 13) * 977) % 2901
        rows.append((k, i, det_bytes(f"sqlite-{k}-{i}", size)))
    return rows


def sqlite_rows(j):
    """All rows of table t after update j."""
    rows = []
    for k in range(1, j + 1):
        rows.extend(sqlite_update_rows(k))
    return rows


def sqlite_module():
    try:
        import sqlite3
    except ImportError as e:
        raise CannotRun(f"python sqlite3 module unavailable: {e}")
    return sqlite3


def run_sqlite(dir_, steps, wal):
    sqlite3 = sqlite_module()
    path = os.path.join(dir_, SQLITE_DB)
    mode = "WAL" if wal else "DELETE"
    op(0, f"setup: create {SQLITE_DB} (journal_mode={mode}) with tables t and counter")
    conn = sqlite3.connect(path, isolation_level=None)
    got = conn.execute(f"PRAGMA journal_mode={mode}").fetchone()[0]
    if got.upper() != mode:
        raise SystemExit(f"ordo_app: journal_mode={mode} not accepted (got {got})")
    if wal:
        conn.execute("PRAGMA wal_autocheckpoint=4")
    else:
        # In DELETE mode SQLite's default (FULL) does not sync the directory
        # after it unlinks the journal, so a power loss right after COMMIT
        # may bring the hot journal back and roll the commit back: SQLite
        # documents EXTRA as the setting that makes a returned COMMIT
        # durable in this mode, and the marks claim durability.
        conn.execute("PRAGMA synchronous=EXTRA")
    conn.execute("BEGIN")
    for stmt in SQLITE_SCHEMA:
        conn.execute(stmt)
    conn.execute("COMMIT")
    mark(0)
    for k in range(1, steps + 1):
        op(k, f"transaction: insert {SQLITE_ROWS_PER_UPDATE} rows of update {k}, counter={k}")
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO t(k, i, payload) VALUES(?, ?, ?)", sqlite_update_rows(k))
        conn.execute("UPDATE counter SET n=?", (k,))
        conn.execute("COMMIT")
        mark(k)
    conn.close()


def check_sqlite(dir_, durable, started, steps, wal):
    sqlite3 = sqlite_module()
    path = os.path.join(dir_, SQLITE_DB)
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        if durable < 0:
            return -1
        what = "missing" if not os.path.exists(path) else "empty"
        raise Inconsistent(f"{SQLITE_DB} is {what} but setup (update 0) was durable")
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=5)
        try:
            # A real read: rolls a hot journal back / runs WAL recovery.
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            ic = [r[0] for r in conn.execute("PRAGMA integrity_check")]
            if ic != ["ok"]:
                raise Inconsistent(f"PRAGMA integrity_check: {one_line('; '.join(map(str, ic[:5])))}")
            if not names:
                if durable < 0:
                    return -1
                raise Inconsistent("database has no schema but setup (update 0) was durable")
            if names != {"t", "counter"}:
                raise Inconsistent(f"unexpected set of tables {sorted(names)}")
            counter = conn.execute("SELECT n FROM counter").fetchall()
            if len(counter) != 1 or not isinstance(counter[0][0], int):
                raise Inconsistent(f"table counter holds {counter!r}, expected one integer row")
            j = counter[0][0]
            if j < 0 or j > steps:
                raise Inconsistent(f"counter n={j} is not an update of this run (0..{steps})")
            rows = conn.execute("SELECT k, i, payload FROM t ORDER BY k, i, rowid").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise Inconsistent(f"sqlite: {short_exc(e)}")
    expected = sqlite_rows(j)
    if rows != expected:
        got_keys = [(r[0], r[1]) for r in rows]
        want_keys = [(r[0], r[1]) for r in expected]
        if got_keys != want_keys:
            raise Inconsistent(
                f"counter n={j} but table t holds rows {got_keys[:12]}"
                f"{'...' if len(got_keys) > 12 else ''} ({len(rows)} rows, expected {len(expected)})"
            )
        for g, w in zip(rows, expected):
            if g != w:
                raise Inconsistent(f"row (k={w[0]}, i={w[1]}) has wrong payload (counter n={j})")
    in_range(j, durable, started)
    return j


def in_range(j, durable, started):
    """Raise unless K <= j <= S."""
    if j < durable:
        raise Inconsistent(f"state is update {j} but update {durable} was durable (durable update lost)")
    if j > started:
        raise Inconsistent(f"state is update {j} but only update {started} had started")


# --------------------------------------------------------------------------
# git

GIT_SIZES = (120, 5000, 9000, 33, 4097, 17000, 700, 12000, 1, 6500)


def git_new_path(u):
    return f"src/file{u:02d}.txt" if u % 2 else f"docs/note{u:02d}.md"


def git_changes(u, files):
    """The working-tree changes of update `u` applied to the tree `files`
    (path -> bytes after update u-1): list of (path, bytes or None=delete)."""
    changes = []
    changes.append(("README", det_text(f"README v{u}", 200 + 150 * u)))
    others = sorted(p for p in files if p != "README")
    modified = None
    if others:
        modified = others[(u * 3) % len(others)]
        size = GIT_SIZES[(u * 7 + 3) % len(GIT_SIZES)]
        changes.append((modified, det_text(f"{modified} v{u}", size)))
    if u % 3 == 0 and len(others) >= 2:
        candidates = [p for p in others if p != modified]
        changes.append((candidates[(u * 5 + 1) % len(candidates)], None))
    new = git_new_path(u)
    changes.append((new, det_text(f"{new} v{u}", GIT_SIZES[u % len(GIT_SIZES)])))
    return changes


def git_tree(j):
    """The tracked files (path -> bytes) after update j (j=0: none)."""
    files = {}
    for u in range(1, j + 1):
        for path, content in git_changes(u, files):
            if content is None:
                files.pop(path, None)
            else:
                files[path] = content
    return files


def git_date(u):
    return f"{1700000000 + 60 * u} +0000"


def git_env(u, git_dir=None, work_tree=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        {
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "Ordo Crash",
            "GIT_AUTHOR_EMAIL": "crash@ordo.invalid",
            "GIT_COMMITTER_NAME": "Ordo Crash",
            "GIT_COMMITTER_EMAIL": "crash@ordo.invalid",
            "GIT_AUTHOR_DATE": git_date(u),
            "GIT_COMMITTER_DATE": git_date(u),
            "GIT_TERMINAL_PROMPT": "0",
            "LC_ALL": "C",
            "LANG": "C",
        }
    )
    if git_dir is not None:
        env["GIT_DIR"] = git_dir
    if work_tree is not None:
        env["GIT_WORK_TREE"] = work_tree
    return env


# Configuration on every command line: determinism, no automatic gc or
# maintenance in the background.  Durability settings (core.fsync, ...) are
# left at git's defaults.
GIT_CONFIG = ["-c", "init.defaultBranch=main", "-c", "gc.auto=0", "-c", "maintenance.auto=false"]


def git(args, cwd, env, input_=None, check=True):
    try:
        p = subprocess.run(
            ["git", *GIT_CONFIG, *args],
            cwd=cwd,
            env=env,
            input=input_,
            capture_output=True,
            timeout=TIMEOUT,
        )
    except FileNotFoundError as e:
        raise CannotRun(f"git not found: {e}")
    except subprocess.TimeoutExpired:
        raise Inconsistent(f"git {' '.join(args)} timed out after {TIMEOUT} s")
    if check and p.returncode != 0:
        raise Inconsistent(
            f"git {' '.join(args)} failed (exit {p.returncode}): {one_line(p.stderr.decode(errors='replace'))}"
        )
    return p


def run_git(dir_, steps):
    op(0, "setup: git init")
    git(["init", "-q"], dir_, git_env(0))
    mark(0)
    files = {}
    for k in range(1, steps + 1):
        changes = git_changes(k, files)
        desc = ", ".join(("delete " if c is None else "write ") + p for p, c in changes)
        op(k, f"{desc}; git add -A; git commit -m 'update {k}'")
        for path, content in changes:
            full = os.path.join(dir_, path)
            if content is None:
                os.remove(full)
                files.pop(path)
            else:
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "wb") as f:
                    f.write(content)
                files[path] = content
        env = git_env(k)
        git(["add", "-A"], dir_, env)
        git(["commit", "-q", "-m", f"update {k}"], dir_, env)
        mark(k)


def working_files(dir_):
    """The files of the working tree (path -> bytes), without .git."""
    out = {}
    for root, dirs, names in os.walk(dir_):
        rel_root = os.path.relpath(root, dir_)
        if rel_root == ".":
            dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            full = os.path.join(root, name)
            rel = os.path.normpath(os.path.join(rel_root, name))
            if os.path.islink(full) or not os.path.isfile(full):
                out[rel] = b"<not a regular file>"
                continue
            with open(full, "rb") as f:
                out[rel] = f.read()
    return out


def cat_blobs(shas, cwd, env):
    """Contents of the given blobs via one `git cat-file --batch`."""
    if not shas:
        return {}
    p = git(["cat-file", "--batch"], cwd, env, input_=("\n".join(shas) + "\n").encode())
    out, pos, blobs = p.stdout, 0, {}
    for sha in shas:
        nl = out.index(b"\n", pos)
        header = out[pos:nl].decode(errors="replace").split()
        if len(header) != 3 or header[1] != "blob":
            raise Inconsistent(f"git cat-file {sha}: {' '.join(header)}")
        size = int(header[2])
        blobs[sha] = out[nl + 1 : nl + 1 + size]
        pos = nl + 1 + size + 1
    return blobs


def commit_files(commit, cwd, env):
    """path -> bytes of every file in the tree of `commit` (or a tree)."""
    p = git(["ls-tree", "-r", "-z", "--full-tree", commit], cwd, env)
    entries = []
    for rec in p.stdout.split(b"\0"):
        if not rec:
            continue
        meta, path = rec.split(b"\t", 1)
        _mode, typ, sha = meta.decode().split()
        if typ != "blob":
            raise Inconsistent(f"tree of {commit[:12]} has a {typ} entry {path!r}")
        entries.append((path.decode(errors="replace"), sha))
    blobs = cat_blobs(sorted({sha for _, sha in entries}), cwd, env)
    return {path: blobs[sha] for path, sha in entries}


def index_files(cwd, env):
    """path -> bytes of every entry of the index (read-only, takes no lock)."""
    p = git(["ls-files", "-s", "-z"], cwd, env)
    entries = []
    for rec in p.stdout.split(b"\0"):
        if not rec:
            continue
        meta, path = rec.split(b"\t", 1)
        _mode, sha, stage = meta.decode().split()
        if stage != "0":
            raise Inconsistent(f"index entry {path!r} is at merge stage {stage}")
        entries.append((path.decode(errors="replace"), sha))
    blobs = cat_blobs(sorted({sha for _, sha in entries}), cwd, env)
    return {path: blobs[sha] for path, sha in entries}


def check_git(dir_, durable, started, steps):
    git_dir = os.path.join(dir_, ".git")
    env = git_env(steps + 1, git_dir=git_dir, work_tree=dir_)
    # Reads (status) must not refresh the index behind the checks' back.
    env["GIT_OPTIONAL_LOCKS"] = "0"
    if not os.path.isdir(git_dir):
        if durable < 0:
            return -1
        raise Inconsistent(".git is missing but git init (update 0) was durable")
    if durable < 0:
        # An empty .git, or one git does not recognise (init did not get far
        # enough to write HEAD, objects/ and refs/), is "no repository yet".
        if not os.listdir(git_dir):
            return -1
        if git(["rev-parse", "--git-dir"], dir_, env, check=False).returncode != 0:
            return -1

    fsck = git(["fsck", "--no-dangling", "--no-progress"], dir_, env, check=False)
    errors = [
        line
        for line in fsck.stderr.decode(errors="replace").splitlines() + fsck.stdout.decode(errors="replace").splitlines()
        if line.strip() and not line.startswith(("notice:", "dangling ", "Checking "))
    ]
    if fsck.returncode != 0 or errors:
        raise Inconsistent(f"git fsck (exit {fsck.returncode}): {one_line('; '.join(errors[:4]) or 'failed')}")

    head = git(["rev-parse", "--verify", "-q", "HEAD^{commit}"], dir_, env, check=False)
    if head.returncode != 0:
        sym = git(["symbolic-ref", "-q", "HEAD"], dir_, env, check=False)
        ref = sym.stdout.decode().strip()
        if sym.returncode != 0:
            raise Inconsistent("HEAD is neither a commit nor a symbolic ref")
        if git(["rev-parse", "--verify", "-q", ref], dir_, env, check=False).returncode == 0:
            raise Inconsistent(f"HEAD -> {ref} does not resolve to a commit")
        head_sha, j = None, 0
    else:
        head_sha = head.stdout.decode().strip()
        subjects = git(["log", "--format=%s", head_sha], dir_, env).stdout.decode(errors="replace").splitlines()
        if not subjects or not subjects[0].startswith("update "):
            raise Inconsistent(f"HEAD commit subject {subjects[:1]!r} is not 'update J'")
        try:
            j = int(subjects[0][len("update ") :])
        except ValueError:
            raise Inconsistent(f"HEAD commit subject {subjects[0]!r} is not 'update J'")
        if not 1 <= j <= steps:
            raise Inconsistent(f"HEAD commit is 'update {j}', not an update of this run (1..{steps})")
        want = [f"update {i}" for i in range(j, 0, -1)]
        if subjects != want:
            raise Inconsistent(f"git log of HEAD is {subjects[:8]!r}, expected update {j}..update 1")
    in_range(j, durable, started)

    check_reflog(git_dir, head_sha, j, started, steps)

    # Every commit's tree, byte-exact.
    if head_sha is not None:
        revs = git(["rev-list", "--first-parent", head_sha], dir_, env).stdout.decode().split()
        if len(revs) != j:
            raise Inconsistent(f"HEAD has {len(revs)} commits, expected {j}")
        for i, rev in zip(range(j, 0, -1), revs):
            got = commit_files(rev, dir_, env)
            want = git_tree(i)
            if got != want:
                raise Inconsistent(f"commit 'update {i}' ({rev[:12]}): {tree_diff(got, want)}")

    # The working tree: every file as of update j or of the update in flight.
    # A file the workload rewrote after commit j (updates j+1..started, whose
    # plain writes git never synced) may hold anything a crash leaves of an
    # unsynced write; every other file must be exactly update j's.
    st = git(["status", "--porcelain", "-z", "--untracked-files=all"], dir_, env, check=False)
    if st.returncode != 0:
        raise Inconsistent(f"git status failed (exit {st.returncode}): {one_line(st.stderr.decode(errors='replace'))}")
    work = working_files(dir_)
    versions = [git_tree(j)]
    if j + 1 <= min(started, steps):
        versions.append(git_tree(j + 1))
    later = [git_tree(i) for i in range(j + 1, min(started, steps) + 1)]
    rewritten = {
        path
        for t in later
        for path in set(t) | set(versions[0])
        if t.get(path) != versions[0].get(path)
    }
    for path in sorted(set(work) | set().union(*versions)):
        if path in rewritten:
            continue
        got = work.get(path)
        if not any(got == v.get(path) for v in versions):
            what = "missing" if got is None else f"{len(got)} bytes"
            if len(versions) == 1:
                allowed = f"differs from update {j}"
            else:
                allowed = f"matches neither update {j} nor update {j + 1} (in flight)"
            raise Inconsistent(f"working file {path} ({what}) {allowed}")

    # The index (staging area): HEAD's tree, or the in-flight update's once
    # `git add` renamed its new index into place.  (A lost index would make
    # the next commit delete every file.)
    staged = index_files(dir_, env)
    if not any(staged == v for v in versions):
        what = " or ".join(f"update {j + n}" for n in range(len(versions)))
        raise Inconsistent(f"index (staging area) is not the tree of {what}: {tree_diff(staged, versions[0])}")

    # Last: the next commit must be possible (no stale lock files).
    probe = git(["commit", "--allow-empty", "-q", "-m", "probe"], dir_, env, check=False)
    if probe.returncode != 0:
        raise Inconsistent(
            f"stale lock: next commit fails (exit {probe.returncode}): {first_line(probe.stderr.decode(errors='replace'))}"
        )
    return j


def check_reflog(git_dir, head_sha, j, started, steps):
    """The newest entry of HEAD's reflog (if any) must be at HEAD.  git
    appends to the reflog before it renames the ref into place, so an entry
    for the in-flight commit j+1 whose old value is HEAD is also accepted."""
    path = os.path.join(git_dir, "logs", "HEAD")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return
    newest = None
    for raw in data.split(b"\n"):
        # git itself skips malformed lines; so does this check.
        line = raw.decode(errors="replace")
        meta, sep, msg = line.partition("\t")
        fields = meta.split(" ")
        if not sep or len(fields) < 2 or not all(is_sha(x) for x in fields[:2]):
            continue
        newest = (fields[0], fields[1], msg)
    if newest is None:
        return
    old, new, msg = newest
    if new == head_sha:
        return
    zero = "0" * len(old)
    in_flight = j + 1 <= min(started, steps)
    if in_flight and old == (head_sha or zero) and msg.endswith(f": update {j + 1}"):
        return
    raise Inconsistent(f"newest HEAD reflog entry ({new[:12]}, '{msg}') is not HEAD ({(head_sha or 'unborn')[:12]})")


def is_sha(s):
    return len(s) in (40, 64) and all(c in "0123456789abcdef" for c in s)


def tree_diff(got, want):
    for path in sorted(set(got) | set(want)):
        if path not in got:
            return f"{path} missing"
        if path not in want:
            return f"unexpected file {path}"
        if got[path] != want[path]:
            return f"{path} differs ({len(got[path])} bytes, expected {len(want[path])})"
    return "differs"


# --------------------------------------------------------------------------
# LevelDB

LEVELDB_DIR = "db"
LEVELDB_PUTS = 8


def leveldb_update_puts(k):
    """The puts of update k: [(key, value)], in order; only the last is synced."""
    if k == 0:
        return [(b"meta", b"ordo-crash leveldb workload v1")]
    puts = []
    for i in range(LEVELDB_PUTS):
        size = 2048 if i % 3 == 0 else 50 + (k * 31 + i * 17) % 400
        puts.append((b"k%04d-%02d" % (k, i), det_bytes(f"leveldb-{k}-{i}", size)))
    return puts


def leveldb_sequence(steps):
    """The global write sequence [(key, value, update)] of updates 0..steps."""
    return [(key, val, k) for k in range(0, steps + 1) for key, val in leveldb_update_puts(k)]


def leveldb_end(k):
    """Length of the write sequence through update k (0 for k = -1)."""
    return sum(len(leveldb_update_puts(u)) for u in range(0, k + 1))


def plyvel_module():
    try:
        import plyvel
    except ImportError as e:
        raise CannotRun(f"python module plyvel unavailable: {e}")
    return plyvel


def run_leveldb(dir_, steps):
    plyvel = plyvel_module()
    path = os.path.join(dir_, LEVELDB_DIR)
    op(0, f"setup: create LevelDB {LEVELDB_DIR}, synced put of meta")
    db = plyvel.DB(path, create_if_missing=True)
    for key, val in leveldb_update_puts(0):
        db.put(key, val, sync=True)
    mark(0)
    for k in range(1, steps + 1):
        puts = leveldb_update_puts(k)
        op(k, f"{len(puts)} puts of update {k}, only the last synced")
        for n, (key, val) in enumerate(puts):
            db.put(key, val, sync=(n == len(puts) - 1))
        mark(k)
    db.close()


def check_leveldb(dir_, durable, started, steps):
    plyvel = plyvel_module()
    path = os.path.join(dir_, LEVELDB_DIR)
    if not os.path.exists(os.path.join(path, "CURRENT")):
        # No CURRENT: LevelDB itself considers the database not created.
        if durable < 0:
            return -1
        raise Inconsistent(f"{LEVELDB_DIR}/CURRENT is missing but setup (update 0) was durable")
    try:
        db = plyvel.DB(path, paranoid_checks=True)
        try:
            present = list(db.iterator(verify_checksums=True, fill_cache=False))
        finally:
            db.close()
    except plyvel.Error as e:
        raise Inconsistent(f"leveldb: {short_exc(e)}")
    seq = leveldb_sequence(steps)
    index = {key: (n, val) for n, (key, val, _) in enumerate(seq)}
    got = set()
    for key, val in present:
        if key not in index:
            raise Inconsistent(f"unexpected key {key!r}")
        n, want = index[key]
        if val != want:
            raise Inconsistent(f"key {key!r} has a wrong value ({len(val)} bytes, expected {len(want)})")
        got.add(n)
    p = len(got)
    if got != set(range(p)):
        missing = min(set(range(p)) - got)
        raise Inconsistent(
            f"present keys are not a prefix of the write sequence: {seq[missing][0]!r} missing"
            f" but {seq[max(got)][0]!r} present"
        )
    j = seq[p - 1][2] if p > 0 else -1
    if p < leveldb_end(durable):
        raise Inconsistent(
            f"only {p} of the {leveldb_end(durable)} writes through durable update {durable} survive"
            f" (durable update lost; first missing {seq[p][0]!r})"
        )
    if p > leveldb_end(started):
        raise Inconsistent(f"{p} writes present, more than the {leveldb_end(started)} through started update {started}")
    return j


# --------------------------------------------------------------------------
# Editor: atomic save (write temp, fsync, rename, fsync dir)

EDITOR_FILE = "doc.txt"
EDITOR_TMP = "doc.txt.tmp"
EDITOR_LENGTHS = (1, 20480, 4097, 600, 12345, 3, 8192, 9999, 100, 16384)


def editor_version(v):
    """Full content of doc.txt version v: never empty, 1 byte..20 KiB."""
    n = EDITOR_LENGTHS[v % len(EDITOR_LENGTHS)]
    head = chr(ord("a") + v % 26).encode()
    return (head + det_text(f"doc v{v}", n))[:n]


def editor_save(dir_, v):
    tmp = os.path.join(dir_, EDITOR_TMP)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = editor_version(v)
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(dir_, EDITOR_FILE))
    fsync_dir(dir_)


def run_editor(dir_, steps):
    for k in range(0, steps + 1):
        n = len(editor_version(k))
        what = "setup: " if k == 0 else ""
        op(k, f"{what}save version {k} of {EDITOR_FILE} ({n} bytes): write+fsync {EDITOR_TMP}, rename, fsync dir")
        editor_save(dir_, k)
        mark(k)


def check_editor(dir_, durable, started, steps):
    path = os.path.join(dir_, EDITOR_FILE)
    if not os.path.exists(path):
        if durable < 0:
            return -1
        raise Inconsistent(f"{EDITOR_FILE} is missing but version {durable} was durable")
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise Inconsistent(f"{EDITOR_FILE} is empty")
    for j in range(max(durable, 0), min(started, steps) + 1):
        if data == editor_version(j):
            return j
    for j in range(0, steps + 1):
        if data == editor_version(j):
            in_range(j, durable, started)
    raise Inconsistent(f"{EDITOR_FILE} ({len(data)} bytes) is no version of {max(durable, 0)}..{started} (torn or mixed)")


# --------------------------------------------------------------------------
# Main

RUNNERS = {
    "sqlite-rollback": lambda d, n: run_sqlite(d, n, wal=False),
    "sqlite-wal": lambda d, n: run_sqlite(d, n, wal=True),
    "git": run_git,
    "leveldb": run_leveldb,
    "editor": run_editor,
}

CHECKERS = {
    "sqlite-rollback": lambda d, k, s, n: check_sqlite(d, k, s, n, wal=False),
    "sqlite-wal": lambda d, k, s, n: check_sqlite(d, k, s, n, wal=True),
    "git": check_git,
    "leveldb": check_leveldb,
    "editor": check_editor,
}


def usage(msg):
    sys.stderr.write(
        f"ordo_app: {msg}\n"
        "usage: ordo_app.py run APP DIR [--steps N]\n"
        "       ordo_app.py check APP DIR --durable K --started S [--steps N]\n"
        f"APP: {', '.join(APPS)}\n"
    )
    sys.exit(2)


def parse_args(argv):
    if len(argv) < 3:
        usage("missing arguments")
    cmd, app, dir_ = argv[0], argv[1], argv[2]
    if cmd not in ("run", "check"):
        usage(f"unknown command {cmd!r}")
    if app not in APPS:
        usage(f"unknown application {app!r}")
    opts = {"--steps": DEFAULT_STEPS, "--durable": None, "--started": None}
    rest = argv[3:]
    while rest:
        if rest[0] not in opts or len(rest) < 2:
            usage(f"bad option {rest[0]!r}")
        try:
            opts[rest[0]] = int(rest[1])
        except ValueError:
            usage(f"{rest[0]} needs an integer, got {rest[1]!r}")
        rest = rest[2:]
    if opts["--steps"] < 0:
        usage("--steps must be >= 0")
    return cmd, app, dir_, opts


def main(argv):
    cmd, app, dir_, opts = parse_args(argv)
    steps = opts["--steps"]
    if cmd == "run":
        if not os.path.isdir(dir_):
            usage(f"{dir_} is not a directory")
        if os.listdir(dir_):
            usage(f"{dir_} is not empty")
        try:
            RUNNERS[app](dir_, steps)
        except CannotRun as e:
            log(str(e))
            sys.exit(2)
        except Inconsistent as e:
            log(f"workload failed: {e}")
            sys.exit(1)
        control_done()
        return
    durable, started = opts["--durable"], opts["--started"]
    if durable is None or started is None:
        usage("check needs --durable K and --started S")
    if durable < -1 or started < -1 or durable > started or started > steps:
        usage(f"need -1 <= durable ({durable}) <= started ({started}) <= steps ({steps})")
    if not os.path.isdir(dir_):
        usage(f"{dir_} is not a directory")
    try:
        j = CHECKERS[app](dir_, durable, started, steps)
    except CannotRun as e:
        print(f"cannot check: {one_line(e)}", flush=True)
        sys.exit(2)
    except Inconsistent as e:
        print(one_line(e), flush=True)
        sys.exit(1)
    except Exception as e:  # bad data made the application (or a parser) fail
        print(one_line(f"application error: {short_exc(e)}"), flush=True)
        sys.exit(1)
    print(f"ok j={j}", flush=True)


def control_done():
    sys.stdout.write("done\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
