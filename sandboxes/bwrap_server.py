"""The exec server that runs inside each bubblewrap sandbox (stdlib only, `python -I -S`).

Usage: `python -I -S bwrap_server.py UID GID CPU_S AS_BYTES NPROC FSIZE_BYTES`.
It is started once per sandbox as root *inside* the sandbox's namespaces, with
only CAP_SETUID, CAP_SETGID and CAP_KILL, and runs every command as the
sandbox's dedicated unprivileged uid, so a command can neither signal the server
nor escape its process limit (RLIMIT_NPROC counts that uid's processes).

Protocol on stdin/stdout: frames of a 4-byte big-endian length and a `marshal`ed
dict (the host runs the same interpreter, so `marshal` is safe and imports in
microseconds, unlike `json`). The server first writes `{"op": "ready"}`, then
answers each request with one reply:

- `exec`: argv, cwd, env, timeout_s, output_limit, drain_s → exit_code
  (negative: killed by that signal), stdout, stderr, output_bytes, truncated,
  timed_out, duration_s.
- `put`: path, tar (bytes) → extracted there by the sandbox uid (so it owns them).
- `get`: path → tar (bytes) of that file or directory, read as the sandbox uid.

Output is read incrementally; at most `output_limit` bytes are kept (a shared
head, then a tail per stream) and the rest only counted, so a command printing
1 GB costs a bounded amount of memory. On timeout every process of the sandbox
uid in this PID namespace is killed (`kill(-1, SIGKILL)` from a forked helper
that switches to that uid), which takes background and `setsid` children too.
"""

import marshal
import os
import resource
import select
import signal
import sys
import time

READ_CHUNK = 1 << 20


def read_frame(fd):
    header = read_exact(fd, 4)
    if header is None:
        return None
    body = read_exact(fd, int.from_bytes(header, "big"))
    return None if body is None else marshal.loads(body)


def read_exact(fd, size):
    chunks = []
    while size:
        data = os.read(fd, size)
        if not data:
            return None
        chunks.append(data)
        size -= len(data)
    return b"".join(chunks)


def write_frame(fd, message):
    body = marshal.dumps(message)
    data = len(body).to_bytes(4, "big") + body
    while data:
        data = data[os.write(fd, data) :]


class OutputKeeper:
    """Keeps a shared head (half the limit) then a bounded tail per stream; counts all."""

    def __init__(self, limit):
        self.head_left = limit // 2
        self.tail_cap = max(limit - self.head_left, 0) // 2
        self.heads = {1: bytearray(), 2: bytearray()}
        self.tails = {1: bytearray(), 2: bytearray()}
        self.total = 0
        self.dropped = {1: 0, 2: 0}

    def feed(self, stream, data):
        self.total += len(data)
        if self.head_left > 0:
            taken = data[: self.head_left]
            self.heads[stream] += taken
            self.head_left -= len(taken)
            data = data[len(taken) :]
        if not data:
            return
        tail = self.tails[stream]
        tail += data
        excess = len(tail) - self.tail_cap
        if excess > 0:
            del tail[:excess]
            self.dropped[stream] += excess

    def text(self, stream):
        head, tail, dropped = bytes(self.heads[stream]), bytes(self.tails[stream]), self.dropped[stream]
        if not dropped:
            return head + tail
        return head + b"\n[... %d bytes omitted ...]\n" % dropped + tail


def set_limits(cpu_s, as_bytes, nproc, fsize_bytes):
    """The sandbox's limits, set on the server itself so every command inherits them.

    Children inherit rlimits across fork and exec; setting them here (once) lets
    `subprocess` spawn commands from C without a Python `preexec_fn`, which would
    force a slow fork of this interpreter (measured: ~10 ms against ~1.5 ms).
    The server (root) is exempt from RLIMIT_NPROC; its own CPU use counts against
    RLIMIT_CPU but stays around a millisecond per command.
    """
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_bytes, fsize_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def become_sandbox_user(uid, gid):
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def spawn(request, uid, gid, out_w, err_w):
    """Start the command as the sandbox uid in its own process group; None (and a message) if it cannot."""
    import subprocess  # imported after `ready` (see main), so this is free

    try:
        return subprocess.Popen(
            request["argv"],
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            cwd=request["cwd"],
            env=request["env"],
            user=uid,
            group=gid,
            extra_groups=[],
            process_group=0,  # a group, not a session: each new session costs a new sched autogroup (~5 ms)
        )
    except OSError as error:
        os.write(err_w, f"rollstream sandbox: cannot run command: {error}\n".encode())
        return None


def kill_sandbox_processes(uid, gid):
    """SIGKILL every process of the sandbox uid in this PID namespace, until none is left."""
    for _ in range(50):
        helper = os.fork()
        if helper == 0:
            try:
                become_sandbox_user(uid, gid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(helper, 0)
        if not processes_of(uid):
            return
        time.sleep(0.01)


def processes_of(uid):
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):  # zombies are dead already; their parent reaps them
            found.append(int(name))
    return found


def run_command(request, uid, gid):
    started = time.monotonic()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    process = spawn(request, uid, gid, out_w, err_w)
    os.close(out_w)
    os.close(err_w)
    if process is None:
        return failed_to_start(out_r, err_r, started)
    pidfd = os.pidfd_open(process.pid)
    keeper = OutputKeeper(request["output_limit"])
    poller = select.poll()
    streams = {out_r: 1, err_r: 2}
    for fd in (out_r, err_r, pidfd):
        poller.register(fd, select.POLLIN)
    deadline = started + request["timeout_s"]
    status, timed_out, drain_until = None, False, None
    while True:
        now = time.monotonic()
        if status is not None and (not streams or now >= drain_until):
            break
        if status is None and not timed_out and now >= deadline:
            timed_out = True
            kill_sandbox_processes(uid, gid)
            deadline = now + 60.0  # the killed command's exit arrives on the pidfd
        until = deadline if status is None else drain_until
        for fd, _event in poller.poll(max(0.0, until - now) * 1000 + 1):
            if fd == pidfd:
                status = process.wait()
                poller.unregister(pidfd)
                drain_until = time.monotonic() + request["drain_s"]
                continue
            data = os.read(fd, READ_CHUNK)
            if data:
                keeper.feed(streams[fd], data)
            else:
                poller.unregister(fd)
                del streams[fd]
    for fd in (out_r, err_r, pidfd):
        os.close(fd)
    return {
        "exit_code": status,
        "stdout": keeper.text(1),
        "stderr": keeper.text(2),
        "output_bytes": keeper.total,
        "truncated": any(keeper.dropped.values()),
        "timed_out": timed_out,
        "duration_s": time.monotonic() - started,
    }


def as_sandbox_user(work, request, uid, gid):
    """Run `work(request)` in a child that is the sandbox uid; its reply comes back over a pipe."""
    reply_r, reply_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(reply_r)
            become_sandbox_user(uid, gid)
            reply = work(request)
        except BaseException as error:
            reply = {"error": f"{type(error).__name__}: {error}"}
        with os.fdopen(reply_w, "wb") as out:
            out.write(marshal.dumps(reply))
        os._exit(0)
    os.close(reply_w)
    with os.fdopen(reply_r, "rb") as source:
        data = source.read()
    os.waitpid(pid, 0)
    return marshal.loads(data) if data else {"error": "file transfer helper died"}


def failed_to_start(out_r, err_r, started):
    message = os.read(err_r, 65536)
    os.close(out_r)
    os.close(err_r)
    return {
        "exit_code": 126,
        "stdout": b"",
        "stderr": message,
        "output_bytes": len(message),
        "truncated": False,
        "timed_out": False,
        "duration_s": time.monotonic() - started,
    }


def put(request):
    import io
    import tarfile

    os.makedirs(request["path"], exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(request["tar"])) as archive:
        archive.extractall(request["path"], filter="data")
    return {}


def get(request):
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(request["path"], arcname=os.path.basename(request["path"].rstrip("/")) or ".")
    return {"tar": buffer.getvalue()}


def handle(request, uid, gid):
    op = request["op"]
    if op == "exec":
        return run_command(request, uid, gid)
    if op == "put":
        return as_sandbox_user(put, request, uid, gid)
    if op == "get":
        return as_sandbox_user(get, request, uid, gid)
    raise ValueError(f"unknown op {op!r}")


def main():
    uid, gid, cpu_s, as_bytes, nproc, fsize_bytes = (int(arg) for arg in sys.argv[1:7])
    set_limits(cpu_s, as_bytes, nproc, fsize_bytes)
    stdin, stdout = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    write_frame(stdout, {"op": "ready"})
    import subprocess  # noqa: F401  (~10 ms: paid while the host has nothing to ask yet)

    while True:
        request = read_frame(stdin)
        if request is None:
            return
        try:
            reply = handle(request, uid, gid)
        except Exception as error:
            reply = {"error": f"{type(error).__name__}: {error}"}
        reply["id"] = request.get("id")
        write_frame(stdout, reply)


if __name__ == "__main__":
    main()
